"""Donated buffers handed to Inductor. See Note [Donated buffers reused by the backward's
compiler] in aotkit_schemas.

# Note [Inductor reads donated buffers from the TracingContext]
# Inductor learns which backward inputs it may reuse in place from
# ``TracingContext.fw_metadata.bw_donated_idxs`` (torch's AOTAutograd's metadata), read when
# the graph is lowered. aotkit leaves ``fw_metadata`` unset, so while a backward with
# offered donated buffers compiles, an object carrying only ``bw_donated_idxs`` stands in
# for it; nothing else ``compile_fx_inner`` runs reads ``fw_metadata``. Without a
# TracingContext (no dynamo around the compile), or with one whose ``fw_metadata`` is set
# by someone else, nothing is offered. A withheld graph is compiled with Inductor's FX
# graph caches off and no stored artifact loaded: their keys do not say whether an
# artifact reuses donated buffers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from aotkit_schemas import DONATED_INPUTS_KEY, DonatedInputs
from torch._guards import TracingContext


@dataclass
class _DonatedOnly:
    """Stands in for torch's ViewAndMutationMeta: the one field Inductor reads."""

    bw_donated_idxs: list[int]


@dataclass(frozen=True)
class Donation:
    """What the compile did with the graph's donated buffers."""

    # the compiled graph may overwrite its donated inputs
    used: bool = False
    # no stored artifact may be loaded
    withheld: bool = False


@contextlib.contextmanager
def inductor_donation(gm: torch.fx.GraphModule) -> Iterator[Donation]:
    """Offer ``gm``'s donated buffers to Inductor while the block compiles it. See Note
    [Inductor reads donated buffers from the TracingContext]."""
    info = gm.meta.get(DONATED_INPUTS_KEY)
    if not isinstance(info, DonatedInputs) or not info.indices:
        yield Donation()
        return
    if info.withheld:
        import torch._inductor.config as inductor_config

        with inductor_config.patch(fx_graph_cache=False, fx_graph_remote_cache=False):
            yield Donation(withheld=True)
        return
    context = TracingContext.try_get()
    if context is None or context.fw_metadata is not None:
        yield Donation()
        return
    context.fw_metadata = _DonatedOnly(list(info.offered))  # type: ignore[assignment]
    try:
        yield Donation(used=True)
    finally:
        context.fw_metadata = None

"""The no-op compiler: run the graph as it is."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.fx
from aotkit_schemas import mark_unboxed_entry

from ._boxing import BoxedCallable, make_boxed_func


def nop(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> BoxedCallable:
    """Return ``gm`` itself, boxed: the reference compiler for checking accuracy.

    Same as torch's ``functorch.compile.nop``: the result is ``make_boxed_func(gm)``, so
    ``nop(gm, inputs)(list(args)) == gm(*args)``. ``example_inputs`` is ignored.
    When the module has no hooks, the generated ``forward`` is called directly, which
    skips ``nn.Module.__call__`` on every call.
    """
    if gm._forward_hooks or gm._forward_pre_hooks:
        return make_boxed_func(gm)
    boxed = make_boxed_func(gm.forward)
    boxed.__wrapped__ = gm  # type: ignore[attr-defined]
    mark_unboxed_entry(boxed, gm.forward)
    return boxed

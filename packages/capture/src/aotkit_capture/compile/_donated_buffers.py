"""Donated buffers: the saved tensors that nothing but the backward can see.

# Note [Donated buffers]
# A saved tensor is *donated* when its storage is not shared with any forward input, any
# forward return (user outputs, updated inputs, intermediate bases, tokens) or any
# backward output: an intermediate of the forward that only the autograd node holds, so
# the backward may free it or reuse its memory in place once read. As torch (under
# ``torch._functorch.config.donated_buffer``, on by default), after partitioning the
# storages are compared on the graphs' fake values (``node.meta["val"]``), and the result
# is ``ViewAndMutationMeta.bw_donated_idxs``: positions among the backward's inputs
# ``(*saved_symints, *saved_tensors, *tangents)``, so the count of saved SymInts is added.
# A graph with a metadata-mutation op (an ``inplace_view`` op such as ``as_strided_``)
# makes the list empty: its traced values do not show the final layouts. With the flag off
# the field stays None. The list is what torch logs (the ``aot_graphs`` artifact's metadata
# line), what selects the saved tensors that inlined saved-tensor hooks apply to in
# torch's ``"donated"`` filtering mode, and what the backward's compiler is offered to
# reuse in place (See Note [Donated buffers reused by the backward's compiler] in
# aotkit_schemas: ``retain_graph=True`` stays allowed unless the compiler reuses them).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch._functorch.config as functorch_config
from aotkit_schemas import (
    DONATED_INPUTS_KEY,
    DonatedInputs,
    PartitionResult,
    ViewAndMutationMeta,
    mark_uses_donated_inputs,
    uses_donated_inputs,
)
from torch._subclasses.fake_tensor import is_fake
from torch.multiprocessing.reductions import StorageWeakRef


def with_donated_buffers(
    meta: ViewAndMutationMeta, partition: PartitionResult, num_fwd_outputs: int
) -> ViewAndMutationMeta:
    """``meta`` with ``bw_donated_idxs`` filled in when torch's ``donated_buffer`` flag is
    on. See Note [Donated buffers]."""
    if not functorch_config.donated_buffer:
        return meta
    idxs = bw_donated_idxs(
        partition.fw_module,
        partition.bw_module,
        num_fwd_outputs,
        partition.num_saved_tensors,
        partition.num_saved_symints,
    )
    return dataclasses.replace(meta, bw_donated_idxs=idxs)


def bw_donated_idxs(
    fw_module: torch.fx.GraphModule,
    bw_module: torch.fx.GraphModule,
    num_fwd_outputs: int,
    num_saved_tensors: int,
    num_saved_symints: int,
) -> list[int]:
    """Backward-input positions of the donated saved tensors. See Note [Donated buffers]."""
    if _has_metadata_mutation(fw_module) or _has_metadata_mutation(bw_module):
        return []
    fw_ins = [_val(n) for n in fw_module.graph.find_nodes(op="placeholder")]
    fw_outs = [_val(n) for n in _output_args(fw_module)]
    bw_outs = [_val(n) for n in _output_args(bw_module)]
    user_fw_outs = fw_outs[:num_fwd_outputs]
    saved = fw_outs[num_fwd_outputs : num_fwd_outputs + num_saved_tensors]
    visible = {_storage(t) for t in (*fw_ins, *user_fw_outs, *bw_outs) if _storage(t) is not None}
    return [
        num_saved_symints + i
        for i, t in enumerate(saved)
        if _storage(t) is not None and _storage(t) not in visible
    ]


def _has_metadata_mutation(gm: torch.fx.GraphModule) -> bool:
    return any(
        n.op == "call_function" and torch.Tag.inplace_view in getattr(n.target, "tags", ())
        for n in gm.graph.nodes
    )


def _output_args(gm: torch.fx.GraphModule) -> Sequence[Any]:
    out = gm.graph.output_node().args[0]
    return list(out) if isinstance(out, Iterable) else [out]


def _val(n: Any) -> Any:
    return n.meta.get("val") if isinstance(n, torch.fx.Node) else None


def _storage(t: Any) -> StorageWeakRef | None:
    """The storage of a fake, strided tensor (sparse tensors have none)."""
    if not isinstance(t, torch.Tensor) or not is_fake(t) or t.layout != torch.strided:
        return None
    return StorageWeakRef(t.untyped_storage())  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def donated_inputs_offered(bw_module: torch.fx.GraphModule, idxs: Sequence[int] | None) -> Any:
    """While the backward graph is compiled, tell the compiler which of its inputs are
    donated buffers it may reuse (none when the compiling backward keeps its graph). See
    Note [Donated buffers reused by the backward's compiler] in aotkit_schemas."""
    if not idxs or not functorch_config.donated_buffer:
        yield
        return
    keep_graph = torch._C._autograd._get_current_graph_task_keep_graph()
    bw_module.meta[DONATED_INPUTS_KEY] = DonatedInputs(tuple(idxs), withheld=keep_graph)
    try:
        yield
    finally:
        bw_module.meta.pop(DONATED_INPUTS_KEY, None)


def keep_donation_mark(raw: Callable[..., Any], wrapped: Callable[..., Any]) -> Callable[..., Any]:
    """``wrapped`` (a wrapper of the compiled backward ``raw``) marked as ``raw`` is."""
    if wrapped is not raw and uses_donated_inputs(raw):
        mark_uses_donated_inputs(wrapped)
    return wrapped

"""Sizes and FLOPs of joint-graph nodes, read from ``node.meta['val']``.

Symbolic sizes are replaced by their hints (the sizes the graph was traced with), so costs
are plain ints.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from aotkit_schemas import is_sym_node

# Bytes charged for saving a symbolic scalar: none, it lives on the autograd ctx, not in
# memory the allocator sees. The min-cut still tells cuts saving more sizes from cuts saving
# fewer by its tiebreak (Note [Min-cut flow graph]); charging a byte would instead let a few
# sizes outweigh recomputing a whole tensor in the backward.
SYMINT_BYTES = 0
_UNKNOWN_NUMEL = 4096


def _hint(value: Any) -> int:
    if isinstance(value, torch.SymInt):
        # loaded only for symbolic sizes: See Note [Import cost] in aotkit_frontends
        from torch.fx.experimental.symbolic_shapes import optimization_hint

        return int(optimization_hint(value, fallback=_UNKNOWN_NUMEL))
    return int(value)


def tensor_bytes(value: Any) -> int:
    """Bytes of a tensor's elements (0 for a non-tensor)."""
    if isinstance(value, torch.Tensor):
        return _hint(value.numel()) * value.dtype.itemsize
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(v) for v in value)
    return 0


def node_bytes(node: torch.fx.Node) -> int:
    """Bytes it costs to keep ``node``'s value alive (a symint costs ``SYMINT_BYTES``)."""
    if is_sym_node(node):
        return SYMINT_BYTES
    if "val" in node.meta:
        return tensor_bytes(node.meta["val"])
    meta = node.meta.get("tensor_meta")
    shape = getattr(meta, "shape", None)
    dtype = getattr(meta, "dtype", None)
    if shape is not None and isinstance(dtype, torch.dtype):
        numel = 1
        for s in shape:
            numel *= _hint(s)
        return numel * dtype.itemsize
    return 0


def input_bytes(node: torch.fx.Node) -> int:
    return sum(node_bytes(a) for a in node.all_input_nodes)


def _val(arg: Any) -> Any:
    if isinstance(arg, torch.fx.Node):
        return arg.meta.get("val")
    if isinstance(arg, (list, tuple)):
        return type(arg)(_val(a) for a in arg)
    return arg


def node_flops(node: torch.fx.Node) -> int:
    """Estimated FLOPs to compute ``node``.

    Uses ``torch.utils.flop_counter``'s formulas where one exists (matmuls, convolutions,
    attention); other ops are charged one FLOP per output element, views and sizes nothing.
    """
    target = node.target
    if node.op != "call_function" or is_sym_node(node):
        return 0
    if isinstance(target, torch._ops.OpOverload):
        if target.is_view:
            return 0
        # flop_counter imports triton: See Note [Import cost] in aotkit_frontends
        from torch.utils.flop_counter import flop_registry

        formula = flop_registry.get(target.overloadpacket)
        if formula is not None:
            try:
                flops = formula(
                    *_val(node.args),
                    **{k: _val(v) for k, v in node.kwargs.items()},
                    out_val=node.meta.get("val"),
                )
                return _hint(flops)
            except Exception:  # a formula that cannot read these args: fall through
                pass
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return _hint(val.numel())
    if isinstance(val, (tuple, list)):
        return sum(_hint(v.numel()) for v in val if isinstance(v, torch.Tensor))
    return 0

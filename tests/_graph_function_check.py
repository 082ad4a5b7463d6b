"""A compiler that runs every graph both through ``gm`` and through aotkit's graph function,
and records any difference. See Note [Graph functions] in aotkit_backends."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from aotkit_backends import make_boxed_func
from aotkit_backends._fast_graph import graph_function
from aotkit_schemas import mark_unboxed_entry
from torch.utils._python_dispatch import TorchDispatchMode


class OverloadRecorder(TorchDispatchMode):
    """Records every overload that reaches the Python dispatch key."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Any] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


_ADD, _ADD_ = torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor


def _clone(a: Any) -> Any:
    if not isinstance(a, torch.Tensor):
        return a
    # same storage layout (expanded inputs included), fresh memory
    c = torch.empty(0, dtype=a.dtype, device=a.device)
    with torch.no_grad():
        c.set_(a.untyped_storage().clone(), a.storage_offset(), a.size(), a.stride())
    return c.requires_grad_(a.requires_grad) if a.requires_grad and c.is_leaf else c


def _differences(ref: Any, got: Any) -> list[str]:
    ref_leaves, ref_spec = pytree.tree_flatten(ref)
    got_leaves, got_spec = pytree.tree_flatten(got)
    if ref_spec != got_spec:
        return [f"output structure {got_spec} != {ref_spec}"]
    problems = []
    for i, (r, g) in enumerate(zip(ref_leaves, got_leaves, strict=True)):
        if isinstance(r, torch.Tensor) and isinstance(g, torch.Tensor):
            if (r.shape, r.stride(), r.dtype, r.requires_grad) != (
                g.shape, g.stride(), g.dtype, g.requires_grad
            ):
                problems.append(f"output {i}: metadata differs")
            elif not torch.equal(r.detach().nan_to_num(), g.detach().nan_to_num()) or not (
                torch.equal(r.detach().isnan(), g.detach().isnan())
                if r.is_floating_point()
                else True
            ):
                problems.append(f"output {i}: values differ")
        elif type(r) is not type(g) or r != g:
            problems.append(f"output {i}: {g!r} != {r!r}")
    return problems


def checking_compiler(gm: torch.fx.GraphModule, problems: list[str], kind: str) -> Any:
    """nop's calling convention, but each call runs the graph function on copies of the
    inputs first (same RNG state) and records every difference from ``gm``'s own run: the
    overloads dispatched, in order, and the outputs (bitwise)."""
    fast = graph_function(gm)
    if fast is None:
        problems.append(f"{kind}: graph_function does not handle this graph")
        return gm

    # a higher-order op (run_and_save_rng_state, ...) has no rule for a Python dispatch
    # mode: such graphs are compared by their outputs only
    has_hop = any(
        isinstance(n.target, torch._ops.HigherOrderOperator) for n in gm.graph.nodes
    )

    def recorder() -> Any:
        return contextlib.nullcontext(OverloadRecorder()) if has_hop else OverloadRecorder()

    def run(*args: Any) -> Any:
        copies = [_clone(a) for a in args]
        rng = torch.get_rng_state()
        with recorder() as seen_fast:
            got = fast(*copies)
        torch.set_rng_state(rng)
        with recorder() as seen_ref:
            ref = gm(*args)
        # See Note [In-place accumulation in graph functions]: the one op it may change
        fast_ops = [_ADD if op is _ADD_ else op for op in seen_fast.ops]
        if fast_ops != seen_ref.ops:
            problems.append(f"{kind}: dispatched {seen_fast.ops}, gm dispatched {seen_ref.ops}")
        problems.extend(f"{kind}: {p}" for p in _differences(ref, got))
        return ref

    boxed = make_boxed_func(run)
    mark_unboxed_entry(boxed, run)
    return boxed


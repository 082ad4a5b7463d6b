"""Outputs that are autograd leaves made inside the function.

# Note [Leaves made inside the function]
# ``y = torch.ones(3); y.requires_grad_()`` (or ``torch.ones(3, requires_grad=True)``,
# ``nn.Parameter(...)``) inside the function, then ``return x * 2, y``: in eager ``y`` is a
# leaf (``is_leaf``, no grad_fn, requires_grad) and a backward through anything the
# caller computes from it accumulates into ``y.grad``. The compiled function returns the
# graph's value of ``y`` through its autograd.Function, a non-leaf that no gradient
# reaches. The trace records such outputs (``OutputAliasInfo.fresh_leaf``) and the
# runtime epilogue hands the caller ``value.detach().requires_grad_()``: a fresh leaf, as
# in eager. What cannot be reproduced: another output of the same call computed from the
# leaf (``return x * y, y``). Eager's backward through ``x * y`` accumulates into the
# returned ``y.grad``; the compiled graph's ``y`` is internal, so the gradient would be
# lost in silence. ``check_fresh_leaves`` raises for that program, naming the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def fresh_leaf_outputs(f_args: Sequence[Any], f_outs: Sequence[Any]) -> frozenset[int]:
    """Positions of outputs that are leaves requiring grad and are not inputs (See Note
    [Leaves made inside the function]); raises when another output's autograd graph
    reaches one of them."""
    input_ids = {id(a) for a in f_args if isinstance(a, torch.Tensor)}
    fresh = {
        j: o
        for j, o in enumerate(f_outs)
        if isinstance(o, torch.Tensor) and o.requires_grad and o.is_leaf and id(o) not in input_ids
    }
    if not fresh:
        return frozenset()
    by_id = {id(o): j for j, o in fresh.items()}
    for k, o in enumerate(f_outs):
        if not isinstance(o, torch.Tensor) or o.grad_fn is None:
            continue
        j = _reached_leaf(o.grad_fn, by_id)
        if j is not None:
            raise RuntimeError(
                f"aotkit: output {j} is a tensor made a leaf that requires grad inside the "
                f"function (requires_grad_(), requires_grad=True or nn.Parameter), and output "
                f"{k} is computed from it. Eager's backward through output {k} accumulates "
                f"into that leaf's .grad; the compiled graph cannot reach the leaf it returns. "
                "Fix: create the tensor outside the function and pass it in as an input (or "
                "register it as a parameter of the module). See Note [Leaves made inside the "
                "function] in aotkit_analysis."
            )
    return frozenset(fresh)


def _reached_leaf(node: Any, by_id: dict[int, int]) -> int | None:
    seen: set[int] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        var = getattr(n, "variable", None)
        if isinstance(var, torch.Tensor) and id(var) in by_id:
            return by_id[id(var)]
        stack.extend(nxt for nxt, _ in n.next_functions)
    return None

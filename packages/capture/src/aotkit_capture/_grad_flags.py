"""The single pass's forward presents fake tensors to FakeTensorMode with the
``requires_grad`` flags dynamo's run gave them, so the fake-tensor cache hits.

# Note [Fake-cache keys of the single pass's forward]
# FakeTensorMode caches each op's output metadata under a key built from its arguments'
# metadata, ``requires_grad`` included. Under torch.compile, dynamo has already run the
# same ops on same-shaped fake tensors of the same fake mode, but at the autograd level:
# an intermediate that needs a gradient reached the fake kernel with
# ``requires_grad=True``. The single pass (Note [Single-pass joint trace]) runs the
# forward natively functionalized: autograd sees the functional wrappers, and the fake
# kernels see the wrappers' inner tensors, which autograd never touches, so every
# intermediate's key said ``requires_grad=False`` and missed dynamo's entry; the op's fake
# kernel (often a Python decomposition) ran again.
#
# ``GradFlags`` sits with the op gate under the Functionalize key and, during the forward
# only, sets ``requires_grad`` on each floating-point output of an op when grad mode is on
# and some argument requires grad: the flag autograd gives the output's wrapper (an op
# autograd treats as non-differentiable gets a flag it would not: that key merely misses,
# as before). Below autograd the flag is inert: no autograd kernel runs on inner tensors,
# make_fx snapshots each node's value before the flag is set (and ``snapshot_fake``
# detaches), and every flag set is cleared when the forward ends, before anything runs
# above the Functionalize key on those tensors again (the backward, the kept input
# mutations' ``copy_``), so graphs and node meta are unchanged. A kernel could read the
# flag; two guards keep that from changing a graph:
#   * only with an empty decomposition table (aotkit_eager's): a decomposition that make_fx
#     traces could branch on ``requires_grad`` (matmul's folding does);
#   * an op whose fake kernel returns an output that already requires grad (a reference
#     implementation that copied the flag, e.g. ``repeat`` with a zero size) raises
#     ``FlagRead``, and the single pass is abandoned for the two-pass flow.
# The backward keeps the flags off: its ops hit entries of the forward's ops on
# unflagged tensors (gradients never require grad), and marking them cost more misses
# than it saved (measured on BERT and resnet18).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class FlagRead(Exception):
    """A fake kernel returned an output that requires grad. See Note [Fake-cache keys of
    the single pass's forward]."""


def _any_requires_grad(args: Sequence[Any]) -> bool:
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.requires_grad:
                return True
        elif isinstance(a, (list, tuple)) and any(
            isinstance(b, torch.Tensor) and b.requires_grad for b in a
        ):
            return True
    return False


class GradFlags:
    """The flags set so far; ``clear`` unsets them all. See Note [Fake-cache keys of the
    single pass's forward]."""

    def __init__(self) -> None:
        self._set: list[torch.Tensor] = []
        self._ids: set[int] = set()

    def after_op(self, args: Sequence[Any], out: Any) -> None:
        """Flag ``out``'s floating outputs as autograd flags their wrappers."""
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for o in outs:
            if (
                isinstance(o, torch.Tensor)
                and o.requires_grad
                and id(o) not in self._ids
                and not any(o is a for a in args)
            ):
                raise FlagRead("a fake kernel returned an output that requires grad")
        if not torch.is_grad_enabled() or not _any_requires_grad(args):
            return
        for o in outs:
            if (
                isinstance(o, torch.Tensor)
                and not o.requires_grad
                and (o.dtype.is_floating_point or o.dtype.is_complex)
                and not any(o is a for a in args)
            ):
                o.requires_grad = True
                self._set.append(o)
                self._ids.add(id(o))

    def clear(self) -> None:
        for o in self._set:
            o.requires_grad = False
        self._set.clear()
        self._ids.clear()

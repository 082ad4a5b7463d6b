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
# The backward does not mark outputs: gradients never require grad, and its ops hit
# entries of the forward's ops on unflagged tensors; marking every output cost more misses
# than it saved (measured on BERT and resnet18). Its view ops are the exception: See Note
# [Fake-cache keys of the single pass's backward].
#
# Note [Fake-cache keys of the single pass's backward]
# A transformer's backward reshapes and transposes its gradients as the forward reshaped
# and transposed the activations (``view(64, 128) -> (2, 32, 128)`` and back, ``t``,
# ``transpose(1, 2)``). The forward's entries for those views were made by dynamo on
# tensors that require grad; the backward presents unflagged gradients, so each missed and
# ran ``view``'s fake kernel, a Python reference that dispatches ``split_dim``,
# ``collapse_view`` and ``as_strided`` (about 1 ms per miss under load). torch's two-pass
# flow gets those entries from its metadata pass, which runs the forward unflagged.
#
# ``BackwardViewFlags`` is a layer of the backward (See Note [One dispatch frame for
# aotkit's trace layers]): for a view op only, it sets ``requires_grad`` on the op's
# floating-point tensor arguments that lack it for the duration of the call, and clears
# it before the op's result goes back up to the Functionalize key, so no flag outlives the
# call. BERT's backward misses go from 102 to 72 (torch's: 74). It is inert as the
# forward's flags are, under the same guards: only with an empty decomposition table (a
# decomposition make_fx traces runs above the fake kernel and could read the flag); a
# view op's fake kernel returns a tensor with the flag its cache entry recorded, and one
# that returns a tensor requiring grad raises ``FlagRead`` (the single pass is abandoned).
# make_fx records the view's node from the output, whose flag is its own. Other ops are
# passed on untouched: flagging their arguments made more misses than it removed (BERT:
# ``mul`` and ``sum`` of gradients hit the backward's own unflagged entries).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor


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


def _flaggable(t: Any) -> bool:
    return (
        isinstance(t, FakeTensor)
        and not t.requires_grad
        and (t.dtype.is_floating_point or t.dtype.is_complex)
        and not t.is_inference()
    )


class BackwardViewFlags:
    """The backward's layer: a view op sees its floating-point arguments flagged as
    requiring grad. See Note [Fake-cache keys of the single pass's backward]."""

    def __call__(
        self,
        func: Any,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        run: Callable[..., Any],
    ) -> Any:
        if not isinstance(func, torch._ops.OpOverload) or not func.is_view:
            return run(func, args, kwargs)
        flagged = [a for a in args if _flaggable(a)]
        if not flagged:
            return run(func, args, kwargs)
        for a in flagged:
            a.requires_grad = True
        try:
            out = run(func, args, kwargs)
        finally:
            for a in flagged:
                a.requires_grad = False
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for o in outs:
            if isinstance(o, torch.Tensor) and o.requires_grad and not any(o is a for a in args):
                raise FlagRead("a fake kernel returned an output that requires grad")
        return out

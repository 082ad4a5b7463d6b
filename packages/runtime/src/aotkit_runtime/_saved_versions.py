"""Saved inputs that share a version counter with an input the epilogue writes.

# Note [Saved inputs on a written storage]
# The compiled forward runs functionally and saves what the backward needs; the epilogue
# then writes the mutated inputs back (``copy_``: See Note [Runtime epilogue order]). A
# write bumps the version counter, which every view of the storage shares. Two inputs on
# one storage that do not overlap take no synthetic base (See Note [Inputs that share a
# storage without overlapping] in aotkit_analysis), so with ``f(a, b) = a.add_(1); a * b``
# on ``buf[0:4], buf[6:10]`` the forward saves ``b`` itself at version v and the epilogue's
# write to ``a`` moves it to v + 1: the backward raised "modified by an inplace operation"
# where eager (which wrote ``a`` before it saved ``b``) runs.
#
# The epilogue's writes cannot change a saved tensor that overlaps no written input, so
# for those (plain tensors sharing a storage with an input the forward graph writes, and
# provably disjoint from every such input: ``may_overlap``) the Function saves a ``.data``
# alias, whose version counter is its own, and keeps the tensor with its version. The
# epilogue settles these entries when it has written every input (``settle_pending``):
# the version expected is the one after the call, as eager's after its own writes. The
# backward compares and raises eager's error when the storage was written after the call.
# An entry never settled (an epilogue that did not run to its end) keeps the version at
# save time, and raises as before: loud, never wrong. A saved tensor that may overlap a
# written input is saved as before: its values may be the ones the epilogue overwrote.
#
# Cost: graphs that write no input's data pay nothing; the others one storage lookup per
# tensor input per call, and per saved tensor only when another input shares a storage
# with a written one.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch
from aotkit_analysis import may_overlap

_PENDING = threading.local()


class LateSaved:
    """Saved tensors whose expected versions are those after the epilogue's writes."""

    __slots__ = ("tensors", "versions")

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors
        self.versions = [t._version for t in tensors]

    def settle(self) -> None:
        self.versions = [t._version for t in self.tensors]

    def check(self) -> None:
        """Raise eager's error when a tensor was written after the call."""
        for t, expected in zip(self.tensors, self.versions, strict=True):
            if t._version != expected:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified "
                    f"by an inplace operation: [{t.type()} {list(t.shape)}] is at version "
                    f"{t._version}; expected version {expected} instead. Hint: the input "
                    "shares a storage with an input the compiled function writes (See Note "
                    "[Saved inputs on a written storage] in aotkit_runtime)."
                )

    def clear(self) -> None:
        self.tensors = []
        self.versions = []


def settle_pending() -> None:
    """Called by the epilogue after it wrote the inputs: See Note [Saved inputs on a
    written storage]."""
    pending: list[LateSaved] | None = getattr(_PENDING, "entries", None)
    if pending:
        for entry in pending:
            entry.settle()
        pending.clear()


def late_saver(written: Sequence[int]) -> Any:
    """``save(args, saved) -> (saved, LateSaved | None)`` for a forward graph that writes
    the compiled inputs ``written`` (None when it writes none). See Note [Saved inputs on a
    written storage]."""
    if not written:
        return None
    written = tuple(written)

    def save(
        args: Sequence[Any], saved: Sequence[Any]
    ) -> tuple[Sequence[Any], LateSaved | None]:
        targets: dict[int, list[torch.Tensor]] = {}
        for i in written:
            a = args[i]
            if type(a) is torch.Tensor:
                targets.setdefault(a.untyped_storage()._cdata, []).append(a)
        if not targets:
            return saved, None
        shared = False
        for j, a in enumerate(args):
            if (
                j not in written
                and type(a) is torch.Tensor
                and a.untyped_storage()._cdata in targets
            ):
                shared = True
                break
        if not shared:
            return saved, None
        late: list[torch.Tensor] = []
        out = list(saved)
        for k, t in enumerate(out):
            if type(t) is not torch.Tensor:
                continue
            on = targets.get(t.untyped_storage()._cdata)
            if on is None or any(may_overlap(t, w) for w in on):
                continue
            late.append(t)
            out[k] = t.data
        if not late:
            return saved, None
        entry = LateSaved(late)
        pending: list[LateSaved] | None = getattr(_PENDING, "entries", None)
        if pending is None:
            pending = _PENDING.entries = []
        pending.append(entry)
        return out, entry

    return save

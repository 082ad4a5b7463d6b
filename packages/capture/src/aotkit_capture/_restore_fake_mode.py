"""The fake mode of a compilation restored from the on-disk cache, constructed without
reading source files.

# Note [A restored entry's fake mode]
# What: a warm hit (See Note [On-disk compile cache]) builds its graphs' fake values in a
# FakeTensorMode of its own, as a fresh compilation fakifies in one. FakeTensorMode's
# constructor records the Python stack for its debugging messages with
# ``traceback.extract_stack()``, which reads the source line of every frame on the stack
# right away: in a fresh process that reads the source files of the caller's frames (the
# user's script, torch.nn's module call, aotkit's frontends), about 0.8 ms of a warm
# start's first call, more than the rest of the mode's construction. ``restore_fake_mode``
# constructs the same mode with the stack recorded without its lines
# (``StackSummary.extract(..., lookup_lines=False)``, the frames' files registered with
# ``linecache.lazycache`` as extract_stack does): each FrameSummary reads its line when
# first asked (``FrameSummary.line``), so the mode's ``stack`` shows the same text when it
# is formatted.
# Invariants:
#   * The same mode: only the construction-time line lookup of its debugging stack is
#     deferred; the mode's state, settings and behaviour are those of ``FakeTensorMode()``.
#   * The deferral is scoped to this one construction: the fake-tensor module's
#     ``traceback`` is a delegating stand-in (every other name is ``traceback``'s own) for
#     the duration of the call and restored after it, also on error. A thread that
#     constructs a FakeTensorMode in that window records its stack lazily too: the same
#     frames, lines read later.
#   * If torch's fake-tensor module no longer records its stack through a module-level
#     ``traceback``, this is a plain ``FakeTensorMode()``.
"""

from __future__ import annotations

import sys
import threading
import traceback
import types
from typing import Any

import torch._subclasses.fake_tensor as _fake_tensor_module
from torch._subclasses.fake_tensor import FakeTensorMode


def _stack_without_lines(f: types.FrameType | None = None, limit: int | None = None) -> Any:
    """``traceback.extract_stack(f, limit)``, lines read when first asked for."""
    if f is None:
        f = sys._getframe().f_back
    stack = traceback.StackSummary.extract(
        traceback.walk_stack(f), limit=limit, lookup_lines=False
    )
    stack.reverse()
    return stack


class _LazyLineTraceback:
    """The ``traceback`` module with ``extract_stack`` recording lines lazily."""

    extract_stack = staticmethod(_stack_without_lines)

    def __getattr__(self, name: str) -> Any:
        return getattr(traceback, name)


_STAND_IN = _LazyLineTraceback()
_lock = threading.Lock()
# the fake-tensor module's name for the traceback module
_ATTR = "traceback"


def restore_fake_mode() -> FakeTensorMode:
    """``FakeTensorMode()`` without the source-line reads of its debugging stack. See
    Note [A restored entry's fake mode]."""
    if getattr(_fake_tensor_module, _ATTR, None) is not traceback:
        return FakeTensorMode()
    with _lock:
        setattr(_fake_tensor_module, _ATTR, _STAND_IN)
        try:
            return FakeTensorMode()
        finally:
            setattr(_fake_tensor_module, _ATTR, traceback)

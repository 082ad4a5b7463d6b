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


# Note [A restored entry's fake mode made when first needed]
# Constructing a FakeTensorMode imports ``torch._dynamo`` (its constructor reads
# ``torch._dynamo.config``), and with it Inductor and sympy: about a second in a process
# that has not imported them, which is every process that uses only ``aot_function`` or
# ``aot_module``. A cold compilation needs the mode (it traces with fake tensors); a warm hit
# needs one only when something reads a fake value: a node value built (See Note [Lazy node
# values of restored graphs]), the compiled inputs' fakes built (See Note [Restored inputs'
# fakes built when read]), effect tokens, symbolic sizes, or a compiler run under it. So a
# warm hit without an ambient fake mode gets a ``DeferredFakeMode`` that constructs the
# entry's mode (``restore_fake_mode``) the first time any of these asks for it, and is that
# one mode from then on. A warm hit of aotkit's ``nop`` reads none of them: its restore, its
# forward and backward compiles and its calls never construct a fake mode, and a warm start
# of a plain ``aot_function`` program imports no ``torch._dynamo`` (0.9 s -> 7 ms for its
# first call). Each compiler of a restored entry runs under the entry's fake mode (as a
# traced compilation's do; ``compiling_under_fakes``) unless the mode was never made and
# the compiler is marked as reading only the graph and never its examples (See Note
# [Compilers that read only the graph] and Note [Compilers that ignore their example
# inputs] in aotkit_schemas): such a compiler has no fake value to compute with. The rule
# is asked when the compiler runs, so the backward's compile enters a mode that something
# made after the forward's.
class DeferredFakeMode:
    """A restored entry's fake mode, constructed at the first ``get()``. See Note [A
    restored entry's fake mode made when first needed]."""

    __slots__ = ("_mode", "_lock")

    def __init__(self) -> None:
        self._mode: FakeTensorMode | None = None
        self._lock = threading.Lock()

    @property
    def made(self) -> bool:
        return self._mode is not None

    def get(self) -> FakeTensorMode:
        if self._mode is None:
            with self._lock:
                if self._mode is None:
                    self._mode = restore_fake_mode()
        return self._mode


# a fake mode, or one made when first needed
FakeModeLike = FakeTensorMode | DeferredFakeMode


def resolve_fake_mode(mode: FakeModeLike) -> FakeTensorMode:
    """The fake mode itself (made now if deferred)."""
    return mode.get() if isinstance(mode, DeferredFakeMode) else mode

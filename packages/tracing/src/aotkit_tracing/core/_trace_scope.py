"""Contexts a traced function enters that must stay entered until its backward is traced.

# Note [Contexts that span the backward trace]
# A module's forward is traced with its parameters and buffers swapped for the traced
# inputs (``aot_module``, ``aot_module_simplified`` on an ``nn.Module``, the export APIs).
# The swap used to end when the forward returned. But the joint trace runs the *backward*
# after that, and a backward can run the user's forward code again: a non-reentrant
# ``torch.utils.checkpoint`` region recomputes its forward inside the backward (its
# saved-tensor unpack hook calls the region's function). That recomputation then read the
# module's real parameters: a tracing error under fake tensors (reported, wrongly, as a
# tensor captured by a closure), and, had it traced, a graph with the parameters' values
# baked in and no gradient for them.
#
# Every joint trace therefore opens a *scope* around its forward and backward
# (``backward_spanning_scope``), and the entry points enter their swap through
# ``entered_until_backward_traced``: inside a scope the contexts are entered into the
# scope and exit when the joint trace ends (after the backward); outside one (a metadata
# pass, an inference trace) they exit when the function returns, as before. The contexts
# exit in reverse order, with the trace's exception if it raised, so a check made at a
# context's normal exit (a rebound parameter slot) still runs, after the backward. A
# compilation nested in a joint trace (an aot_module called inside another compiled
# function) starts with ``new_compilation``, which hides the outer scope: its own metadata
# pass and traces never leave their module swapped for the rest of the outer trace.

# Note [Compiled functions called while aotkit traces]
# A function aotkit traces may call another compiled function (``aot_function`` or
# ``aot_module``): ``outer = aot_function(lambda x: inner(x).cos(), nop)``. Eager runs the
# inner function's code, and so does the outer trace: while a compilation is in progress on
# a thread (``new_compilation``, around every compile and export trace), a compiled
# function called on that thread runs the user's original function, whose ops the outer
# trace records, instead of compiling it for the functional and fake tensors it is handed
# (whose graph would run a compiled graph on tensors of a trace, which functionalization
# refuses: "Attempting to use FunctionalTensor on its own"). The user's compilers run
# inside the compilation too, where an inlined call runs eagerly: eager's values still.
# A count of compilations in progress on all threads lets a call outside any compilation
# pay one list read (``inside_a_trace``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from .._cond_effects import install_cond_effects

_local = threading.local()
# compilations in progress on any thread; See Note [Compiled functions called while aotkit
# traces]
COMPILATIONS_IN_PROGRESS = [0]
_count_lock = threading.Lock()


def _scopes() -> list[contextlib.ExitStack | None]:
    stack: list[contextlib.ExitStack | None] | None = getattr(_local, "scopes", None)
    if stack is None:
        stack = _local.scopes = []
    return stack


@contextlib.contextmanager
def backward_spanning_scope() -> Iterator[None]:
    """Open around a joint trace's forward and backward. See Note [Contexts that span the
    backward trace]."""
    scopes = _scopes()
    with contextlib.ExitStack() as scope:
        scopes.append(scope)
        try:
            yield
        finally:
            scopes.pop()


@contextlib.contextmanager
def new_compilation() -> Iterator[None]:
    """Open around a whole compilation: a compile nested in a joint trace (an aot_module
    called inside another compiled function) runs its own passes outside the outer
    trace's scope. See Note [Contexts that span the backward trace]."""
    scopes = _scopes()
    scopes.append(None)
    # See Note [Compiled functions called while aotkit traces]
    with _count_lock:
        COMPILATIONS_IN_PROGRESS[0] += 1
    _local.compiling = getattr(_local, "compiling", 0) + 1
    try:
        yield
    finally:
        _local.compiling -= 1
        with _count_lock:
            COMPILATIONS_IN_PROGRESS[0] -= 1
        scopes.pop()


def inside_a_trace() -> bool:
    """Whether a compilation is in progress on this thread. See Note [Compiled functions
    called while aotkit traces]."""
    return COMPILATIONS_IN_PROGRESS[0] > 0 and getattr(_local, "compiling", 0) > 0


# at import, before any compile key reads cond's rules: See Note [Effect tokens through
# torch.cond]
install_cond_effects(inside_a_trace)


@contextlib.contextmanager
def entered_until_backward_traced(*contexts: AbstractContextManager[Any]) -> Iterator[None]:
    """Enter ``contexts`` for the body, or, inside a joint trace, until its backward is
    traced too. See Note [Contexts that span the backward trace]."""
    scopes = _scopes()
    scope = scopes[-1] if scopes else None
    if scope is None:
        with contextlib.ExitStack() as stack:
            for cm in contexts:
                stack.enter_context(cm)
            yield
        return
    for cm in contexts:
        scope.enter_context(cm)
    yield

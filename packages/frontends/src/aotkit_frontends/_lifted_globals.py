"""Global and closure tensors of an ``aot_function`` lifted as inputs.

# Note [Global tensors lifted as inputs]
# A function that reads or mutates a tensor it does not take as an input (a global of its
# module, a closure variable: See Note [Tensors captured by closure or global] in
# aotkit_capture) cannot be traced on fake inputs alone. Dynamo lifts such tensors as
# graph inputs; so does ``aot_function``, before its first trace:
#   * The slots: the tensors found in the function's closure cells and in the globals its
#     code names (nested code included), and the same in the plain functions and
#     ``functools.partial`` objects those hold (a helper that writes a global of its own
#     module), found by ``tensor_slots``. A slot is where the tensor lives (the globals
#     dict and name, or the cell), never the tensor: every call reads each slot again,
#     so a global rebound between calls is passed as the new tensor (a new shape or
#     dtype is a new key and compiles again) and never a stale one.
#   * The program: the cache then calls ``lifted`` (user's arguments, then one argument
#     per slot) instead of the function. While it traces it, each slot holds the traced
#     input (the fake or functional tensor), entered until the backward is traced too
#     (See Note [Contexts that span the backward trace] in aotkit_tracing), and the
#     slot's own tensor is put back afterwards. Lifted tensors are ordinary inputs: a
#     mutation is written back into the global's tensor after the call, as eager leaves
#     it; one that requires grad gets its gradient in ``.grad``.
#   * A slot found through a function (a global or closure variable holding it) is
#     valid while that variable still holds that function: each call checks it, and a
#     rebound one finds the slots again and drops the compiled entries (the function
#     traced may be another one): compiled again, never stale.
#   * The slots are found before the first trace (a trace that failed on them could
#     already have written them: an in-place op on a tensor with no traced operand runs
#     for real). A trace that still fails for a captured tensor (a global rebound to a
#     tensor since) looks again: new slots mean the call is made again with them
#     (``_RetryWithSlots``); none means the error of Note [Tensors captured by closure
#     or global].
#   * A trace with the slots lifted that fails (``torch.set_rng_state`` of a state
#     tensor made outside needs the real tensor, not a traced one) is made once more
#     with none lifted, as before lifting: a tensor that is only read is then a
#     constant of the graph, and one that is written gives the error of Note [Tensors
#     captured by closure or global]. The function is never lifted again.
#   * A ``torch.Generator`` other than the default one, found the same way, is a slot
#     too: as an argument, the trace starts it from a fresh state (See Note [States of
#     other generators] in aotkit_tracing), so a function that seeds it before its first
#     draw raises ``GeneratorStateError`` (that refusal is not retried unlifted) instead
#     of a graph that continues the generator's stream from the second call on.
#   * The tensors of an ``nn.Module`` reached this way are not slots (aot_module lifts
#     those): the error names them.
#   * While a trace runs, the slots hold traced tensors: eager code on another thread
#     that reads the same global during that trace would see them (the compile lock
#     orders only compilations).
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from aotkit_capture import entered_until_backward_traced

__all__ = ["SlotsChanged", "TensorSlot", "lifted", "read_slots", "tensor_slots"]


class SlotsChanged(Exception):
    """A function through which a slot was found is no longer where it was found."""


class TensorSlot:
    """Where a captured tensor lives: a globals dict entry or a closure cell, and the
    slots (with the functions they held) through which it was found."""

    __slots__ = ("cell", "holder", "name", "via")

    def __init__(
        self,
        name: str,
        holder: dict[str, Any] | None,
        cell: Any = None,
        via: tuple[tuple[TensorSlot, Any], ...] = (),
    ) -> None:
        self.name, self.holder, self.cell, self.via = name, holder, cell, via

    def check(self) -> None:
        """Raise SlotsChanged when a function on the way to this slot was rebound."""
        for slot, held in self.via:
            if slot.get() is not held:
                raise SlotsChanged()

    def get(self) -> Any:
        if self.holder is not None:
            return self.holder[self.name]
        return self.cell.cell_contents

    def set(self, value: Any) -> None:
        if self.holder is not None:
            self.holder[self.name] = value
        else:
            self.cell.cell_contents = value


def _code_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


def tensor_slots(fn: Callable[..., Any]) -> list[TensorSlot]:
    """The slots of Note [Global tensors lifted as inputs] that ``fn`` reaches."""
    slots: list[TensorSlot] = []
    seen_fns: set[int] = set()
    seen_slots: set[tuple[int, str]] = set()

    def visit_value(v: Any, slot: TensorSlot, depth: int) -> None:
        # a generator other than the default one is lifted too: as an argument, the trace
        # starts it from a fresh state, so a function that seeds it is seen (See Note
        # [States of other generators] in aotkit_tracing)
        if isinstance(v, torch.Tensor) or (
            isinstance(v, torch.Generator) and v is not torch.default_generator
        ):
            ident = (id(slot.holder if slot.holder is not None else slot.cell), slot.name)
            if ident not in seen_slots:
                seen_slots.add(ident)
                slots.append(slot)
        elif callable(v) and not isinstance(v, torch.nn.Module) and depth < 3:
            visit_fn(v, depth + 1, (*slot.via, (slot, v)))

    def visit_fn(f: Any, depth: int, via: tuple[tuple[TensorSlot, Any], ...] = ()) -> None:
        if id(f) in seen_fns:
            return
        seen_fns.add(id(f))
        if isinstance(f, functools.partial):
            visit_fn(f.func, depth, via)
            return
        if isinstance(f, types.MethodType):
            f = f.__func__
        wrapped = getattr(f, "__wrapped__", None)
        if wrapped is not None:
            visit_fn(wrapped, depth, via)
        code = getattr(f, "__code__", None)
        if not isinstance(code, types.CodeType):
            return
        module = getattr(f, "__module__", "") or ""
        if module == "torch" or module.startswith(("torch.", "aotkit")):
            return
        for name, cell in zip(code.co_freevars, getattr(f, "__closure__", None) or (), strict=False):
            try:
                v = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            visit_value(v, TensorSlot(name, None, cell, via), depth)
        f_globals = getattr(f, "__globals__", None)
        if not isinstance(f_globals, dict):
            return
        for name in dict.fromkeys(_code_names(code)):
            if name in f_globals and not isinstance(f_globals[name], types.ModuleType):
                visit_value(f_globals[name], TensorSlot(name, f_globals, None, via), depth)

    visit_fn(fn, 0)
    return slots


def read_slots(slots: Sequence[TensorSlot], checked: bool = False) -> tuple[Any, ...]:
    """The slots' current values (one call's extra arguments); ``checked``: first raise
    SlotsChanged if a function a slot was found through was rebound."""
    if checked:
        for s in slots:
            if s.via:
                s.check()
    return tuple(s.get() for s in slots)


@contextlib.contextmanager
def _holding(slots: Sequence[TensorSlot], values: Sequence[Any]) -> Iterator[None]:
    saved = read_slots(slots)
    for s, v in zip(slots, values, strict=True):
        s.set(v)
    try:
        yield
    finally:
        for s, v in zip(slots, saved, strict=True):
            s.set(v)


def lifted(fn: Callable[..., Any], slots: Sequence[TensorSlot]) -> Callable[..., Any]:
    """``fn`` taking the slots' tensors as its last positional arguments. See Note
    [Global tensors lifted as inputs]."""
    n = len(slots)

    def program(*args: Any, **kwargs: Any) -> Any:
        user, values = args[: len(args) - n], args[len(args) - n :]
        with entered_until_backward_traced(_holding(slots, values)):
            return fn(*user, **kwargs)

    return program

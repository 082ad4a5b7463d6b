"""Naming the tensors a function reaches without taking them as inputs.

# Note [Tensors captured by closure or global]
# aotkit traces a function on fake copies of its inputs. A real tensor the function reaches
# some other way (a closure variable, a global, a bound method's ``self``, the parameters
# of a module held in one of those) is not an input: torch's FakeTensorMode refuses to mix
# it with fake ones ("Please convert all Tensors to FakeTensors first"), and
# functionalization refuses to write a traced value into it ("mutating a non-functional
# tensor with a functional tensor is not allowed"). Supporting it silently would be wrong
# either way: baked in as a constant, its later updates (an optimizer step) would be
# ignored, no gradient would reach it, and a mutation of it would be lost. So aotkit turns
# those two internal errors into CapturedTensorError, which names the tensors the function
# reaches (found by walking its closure cells, the globals its code names, partial
# arguments, bound ``self`` and the modules among those) and the remedy: pass them as
# inputs, or compile the module with aot_module, which lifts parameters and buffers.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ._errors import AOTCompileError

_MARKERS = (
    "Please convert all Tensors to FakeTensors first",
    "mutating a non-functional tensor with a functional tensor is not allowed",
)


class CapturedTensorError(AOTCompileError, AssertionError):
    """The function reads or mutates a tensor that is not one of its inputs.

    An AOTCompileError, and an AssertionError like fake-tensor's original error.
    See Note [Tensors captured by closure or global].
    """


def is_captured_tensor_error(e: BaseException) -> bool:
    text = str(e)
    return any(m in text for m in _MARKERS)


def _code_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # nested functions, lambdas, comprehensions
            yield from _code_names(const)


def _describe(t: torch.Tensor) -> str:
    kind = "Parameter" if isinstance(t, torch.nn.Parameter) else "Tensor"
    return f"{kind} of shape {tuple(t.shape)}"


class _Finder:
    def __init__(self, skip: set[int]) -> None:
        self.found: list[str] = []
        self.seen: set[int] = set(skip)

    def value(self, v: Any, where: str, depth: int) -> None:
        if id(v) in self.seen:
            return
        if isinstance(v, torch.Tensor):
            self.seen.add(id(v))
            self.found.append(f"{where} ({_describe(v)})")
        elif isinstance(v, torch.nn.Module):
            self.seen.add(id(v))
            for name, t in (*v.named_parameters(), *v.named_buffers()):
                if id(t) not in self.seen:
                    self.seen.add(id(t))
                    self.found.append(f"{name!r} of the module in {where} ({_describe(t)})")
        elif isinstance(v, (list, tuple)) and depth < 3:
            self.seen.add(id(v))
            for i, item in enumerate(v[:64]):
                self.value(item, f"{where}[{i}]", depth + 1)
        elif callable(v) and depth < 3:
            self.function(v, depth + 1)

    def function(self, fn: Any, depth: int) -> None:
        if id(fn) in self.seen:
            return
        self.seen.add(id(fn))
        if isinstance(fn, functools.partial):
            for i, a in enumerate(fn.args):
                self.value(a, f"argument {i} bound by functools.partial", depth)
            for k, a in fn.keywords.items():
                self.value(a, f"keyword {k!r} bound by functools.partial", depth)
            self.function(fn.func, depth)
            return
        if isinstance(fn, types.MethodType):
            self.value(fn.__self__, "the bound method's self", depth)
            fn = fn.__func__
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is not None:
            self.function(wrapped, depth)
        code = getattr(fn, "__code__", None)
        if not isinstance(code, types.CodeType):
            return
        module = getattr(fn, "__module__", "") or ""
        if module.startswith(("torch.", "aotkit")) or module == "torch":
            return
        qual = getattr(fn, "__qualname__", "the function")
        for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or (), strict=False):
            try:
                v = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            self.value(v, f"closure variable {name!r} of {qual}", depth)
        f_globals = getattr(fn, "__globals__", {})
        for name in dict.fromkeys(_code_names(code)):
            if name in f_globals:
                v = f_globals[name]
                if isinstance(v, types.ModuleType):
                    continue
                self.value(v, f"global {name!r} of {qual}", depth)


def captured_tensors(fn: Callable[..., Any], skip: tuple[Any, ...] = ()) -> list[str]:
    """Descriptions of the tensors ``fn`` reaches without taking them as inputs, skipping
    the objects in ``skip`` (an aot_module's module: its tensors are lifted)."""
    finder = _Finder({id(s) for s in skip})
    for s in skip:
        if isinstance(s, torch.nn.Module):
            finder.seen.update(id(t) for t in (*s.parameters(), *s.buffers()))
    finder.function(fn, 0)
    return finder.found


def captured_tensor_error(
    fn: Callable[..., Any], cause: BaseException, skip: tuple[Any, ...] = ()
) -> CapturedTensorError:
    """The error of Note [Tensors captured by closure or global] for ``fn``."""
    mutating = "non-functional tensor" in str(cause)
    found = captured_tensors(fn, skip)
    action = "mutates" if mutating else "uses"
    if found:
        listed = "; ".join(found[:8]) + ("; ..." if len(found) > 8 else "")
        what = f"It reaches these tensors that are not inputs: {listed}."
    else:
        what = "aotkit could not tell which one (it is reached through an object it does not walk)."
    return CapturedTensorError(
        f"aotkit: the compiled function {action} a tensor that is not one of its inputs "
        f"(captured by a closure or a global). {what} aotkit traces the function on fake "
        "copies of its inputs only, so it can neither read such a tensor's current value on "
        "later calls, nor write a mutation back to it, nor compute its gradient. Remedy: "
        "pass the tensor as an argument of the function; for the parameters and buffers of "
        "an nn.Module, compile the module with aot_module, which passes them as inputs. "
        f"(Original error: {str(cause).splitlines()[0][:200]})"
    )

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
# arguments, bound ``self`` and the modules among those, including the tensors held in
# their plain attributes, named by path such as ``self.sub.last``) and the remedy: pass
# them as inputs, register them as buffers, or compile the module with aot_module, which
# lifts parameters and buffers (and tensors held directly in plain attributes: See Note
# [Tensor attributes of aot_module's modules] in aotkit_frontends). ``aot_function`` lifts
# the global and closure tensors it finds as inputs instead (See Note [Global tensors
# lifted as inputs] in aotkit_frontends); the error remains for the tensors of modules
# reached that way, for aot_module's forward, and for tensors it cannot find.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from aotkit_tracing import AOTCompileError

_MARKERS = (
    "Please convert all Tensors to FakeTensors first",
    "mutating a non-functional tensor with a functional tensor is not allowed",
)


_MODULE_TABLES = frozenset({"_parameters", "_buffers", "_modules", "_flat_weights"})


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
            self.attributes(v, f"the module in {where}")
        elif isinstance(v, (list, tuple)) and depth < 3:
            self.seen.add(id(v))
            for i, item in enumerate(v[:64]):
                self.value(item, f"{where}[{i}]", depth + 1)
        elif callable(v) and depth < 3:
            self.function(v, depth + 1)

    def attributes(self, mod: torch.nn.Module, where: str) -> None:
        """The tensors held in plain attributes of ``mod``'s submodules (directly, or in a
        list, tuple or dict), named by their path: neither parameters nor buffers."""
        for prefix, sub in mod.named_modules():
            for attr, v in vars(sub).items():
                if attr not in _MODULE_TABLES:
                    path = f"self.{prefix}.{attr}" if prefix else f"self.{attr}"
                    self.attribute_value(v, path, where, 0)

    def attribute_value(self, v: Any, path: str, where: str, depth: int) -> None:
        if isinstance(v, torch.Tensor):
            if id(v) not in self.seen:
                self.seen.add(id(v))
                self.found.append(
                    f"{path} of {where}, a plain attribute that is neither a parameter nor "
                    f"a buffer ({_describe(v)})"
                )
        elif depth < 2 and isinstance(v, (list, tuple)):
            for i, item in enumerate(v[:64]):
                self.attribute_value(item, f"{path}[{i}]", where, depth + 1)
        elif depth < 2 and type(v) is dict:
            for k, item in list(v.items())[:64]:
                self.attribute_value(item, f"{path}[{k!r}]", where, depth + 1)

    def function(self, fn: Any, depth: int) -> None:
        if id(fn) in self.seen:
            return
        if isinstance(fn, torch.nn.Module):  # aot_function(model, ...)
            self.value(fn, "the compiled function (an nn.Module)", depth)
            self.function(fn.forward, depth)
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
    for s in skip:
        if isinstance(s, torch.nn.Module):  # lifted tensors are inputs; other tensors not
            finder.attributes(s, "the compiled module")
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
        f"(captured by a closure, a global or a module attribute). {what} aotkit traces "
        "the function on fake copies of its inputs only, so it can neither read such a "
        "tensor's current value on later calls, nor write a mutation back to it, nor "
        "compute its gradient. Remedy: pass the tensor as an argument of the function; "
        "for the parameters and buffers of an nn.Module, compile the module with "
        "aot_module, which passes them as inputs (and tensors held directly in plain "
        "module attributes too); or register such a tensor as a buffer with "
        "register_buffer(name, tensor). (torch's error while tracing is this exception's "
        "__cause__.)"
    )

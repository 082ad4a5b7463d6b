"""Fingerprints of programs: code objects, functions, classes, modules (their hooks and
tensor attributes included) and dynamo's GraphModules, hashed from plain descriptions of
what they run. See Note [On-disk cache keys] in ``_key``."""

from __future__ import annotations

import enum
import functools
import hashlib
import types
from typing import Any

import torch
import torch.fx
from aotkit_schemas import Uncacheable

from ._constants import tensor_fingerprint
from ._hooks import global_hooks_fingerprint, has_hooks, module_hooks

PLAIN_TYPES = (int, float, bool, str, bytes, type(None), complex)
_MAX_DEPTH = 12


class Fingerprint:
    """Feeds a description of code objects, functions, modules and values into one hash."""

    def __init__(self) -> None:
        # each part's repr, hashed once at the end (two hash updates per part cost a
        # warm start's first key about 0.1 ms on compare.py's convnet)
        self.parts: list[str] = []
        self.seen: dict[int, int] = {}

    def put(self, *parts: Any) -> None:
        self.parts.extend(map(repr, parts))

    def value(self, v: Any, depth: int = 0) -> None:
        if depth > _MAX_DEPTH:
            raise Uncacheable("the program's objects nest too deeply to fingerprint")
        if isinstance(v, PLAIN_TYPES) or isinstance(v, (torch.dtype, torch.device, torch.layout)):
            self.put(type(v).__name__, v)
            return
        if isinstance(v, enum.Enum):
            self.put("enum", type(v).__qualname__, v.name)
            return
        if isinstance(v, (tuple, list, frozenset, set)):
            items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v
            self.put(type(v).__name__, len(items))
            for x in items:
                self.value(x, depth + 1)
            return
        if isinstance(v, dict):
            self.put("dict", len(v))
            for k, x in v.items():
                self.value(k, depth + 1)
                self.value(x, depth + 1)
            return
        if id(v) in self.seen:
            self.put("ref", self.seen[id(v)])
            return
        self.seen[id(v)] = len(self.seen)
        if isinstance(v, types.ModuleType):
            self.put("module", v.__name__)
        elif isinstance(v, torch.fx.GraphModule):
            self.graph_module(v, depth)
        elif isinstance(v, torch.nn.Module):
            self.module(v, depth)
        elif isinstance(v, types.FunctionType):
            self.function(v, depth)
        elif isinstance(v, types.MethodType):
            self.value(v.__func__, depth + 1)
            self.value(v.__self__, depth + 1)
        elif isinstance(v, functools.partial):
            self.put("partial")
            self.value(v.func, depth + 1)
            self.value(v.args, depth + 1)
            self.value(v.keywords, depth + 1)
        elif isinstance(v, type):
            self.cls(v, depth)
        elif _is_torch_builtin(v):
            self.put("builtin", getattr(v, "__module__", None), getattr(v, "__qualname__", repr(v)))
        elif isinstance(v, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            self.put("op", str(v))
        elif callable(getattr(v, "__aotkit_fingerprint__", None)):
            # an object that describes itself with plain data
            self.put("self", type(v).__module__, type(v).__qualname__)
            self.value(v.__aotkit_fingerprint__(), depth + 1)
        else:
            raise Uncacheable(f"cannot fingerprint a {type(v).__module__}.{type(v).__qualname__}")

    def code(self, co: types.CodeType, depth: int) -> None:
        self.put("code", co.co_name, co.co_code, co.co_names, co.co_varnames, co.co_freevars)
        for c in co.co_consts:
            if isinstance(c, types.CodeType):
                self.code(c, depth + 1)
            else:
                self.value(c, depth + 1)

    def function(self, fn: types.FunctionType, depth: int) -> None:
        module = fn.__module__ or ""
        if module.startswith(("torch.", "aotkit_")) or module == "torch":
            # library code: covered by the torch version and aotkit's source hash
            self.put("libfn", module, fn.__qualname__)
            return
        self.put("fn", module, fn.__qualname__)
        self.code(fn.__code__, depth)
        self.value(fn.__defaults__, depth + 1)
        self.value(fn.__kwdefaults__, depth + 1)
        for cell in fn.__closure__ or ():
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                contents = None
            self.value(contents, depth + 1)
        for name in _global_names(fn.__code__):
            if name in fn.__globals__:
                self.put("global", name)
                self.value(fn.__globals__[name], depth + 1)

    def cls(self, c: type, depth: int) -> None:
        module = c.__module__ or ""
        self.put("class", module, c.__qualname__)
        if module.startswith(("torch", "aotkit_", "builtins")):
            return
        for base in c.__mro__:
            if (base.__module__ or "").startswith(("torch", "builtins")):
                continue
            for name, attr in sorted(vars(base).items()):
                if isinstance(attr, (staticmethod, classmethod)):
                    attr = attr.__func__
                if isinstance(attr, types.FunctionType):
                    self.put("method", base.__qualname__, name)
                    self.function(attr, depth + 1)
                elif isinstance(attr, PLAIN_TYPES) and not name.startswith("__"):
                    self.put("attr", name, attr)

    def module(self, m: torch.nn.Module, depth: int) -> None:
        self.cls(type(m), depth + 1)
        if has_hooks(m):  # See Note [Module hooks in the on-disk cache key]
            module_hooks(self, m, depth)
        self.put("nn", m.training, m.extra_repr())
        for name, attr in sorted(vars(m).items()):
            if name in _MODULE_INTERNALS:
                continue
            self.put("nnattr", name)
            if isinstance(attr, torch.Tensor):  # See Note [Tensor constants in the on-disk cache]
                self.put(tensor_fingerprint(attr, f"{type(m).__name__}.{name}"))
            else:
                self.value(attr, depth + 1)
        for pname, p in m._parameters.items():
            self.put("param", pname, p is None)
        for bname, b in m._buffers.items():
            self.put("buffer", bname, b is None, bname in m._non_persistent_buffers_set)
        for cname, child in m._modules.items():
            self.put("child", cname)
            self.value(child, depth + 1)

    def graph_module(self, gm: torch.fx.GraphModule, depth: int) -> None:
        self.put("gm", gm.code)
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                # a tensor constant's value is baked into the compiled graphs
                attr = _get_attr(gm, str(node.target))
                if isinstance(attr, torch.Tensor):  # keyed by value below
                    self.put("constant", str(node.target),
                             tensor_fingerprint(attr, f"graph attribute {node.target}"))
            if node.op == "call_function" and isinstance(node.target, types.FunctionType):
                self.function(node.target, depth + 1)
            elif node.op == "call_function" and isinstance(node.target, type):
                self.cls(node.target, depth + 1)
        for name, child in sorted(gm.named_children()):
            self.put("sub", name)
            self.value(child, depth + 1)
        for name, attr in sorted(vars(gm).items()):
            if isinstance(attr, torch.Tensor) and not name.startswith("_"):
                # See Note [Tensor constants in the on-disk cache]
                self.put("attr", name, tensor_fingerprint(attr, f"graph attribute {name}"))

    def hexdigest(self) -> str:
        return hashlib.sha256("\x00".join(self.parts).encode()).hexdigest()


def _get_attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


# nn.Module's own bookkeeping (parameters, buffers, children and hooks are read
# separately); every other attribute, private or not, is part of the program
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))


def _global_names(co: types.CodeType) -> list[str]:
    names = list(co.co_names)
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            names.extend(_global_names(c))
    return sorted(set(names))


def _is_torch_builtin(v: Any) -> bool:
    module = getattr(v, "__module__", None) or ""
    return isinstance(v, (types.BuiltinFunctionType, types.BuiltinMethodType)) or (
        callable(v) and (module == "torch" or module.startswith("torch."))
    )


def program_fingerprint(program: Any) -> str:
    """A hash of a user function, module or dynamo GraphModule. See Note [On-disk cache keys]."""
    fp = Fingerprint()
    fp.value(program)
    return fp.hexdigest()


def global_hooks_key() -> str | None:
    """A fingerprint of the process-wide module hooks, None without any. See Note [Module
    hooks in the on-disk cache key]."""
    return global_hooks_fingerprint(Fingerprint())

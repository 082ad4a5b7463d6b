"""What of a tensor subclass input a compiled graph is specialized to: its type, its
``__tensor_flatten__`` context and its inner tensors, as a compile-cache key part.

# Note [Subclass inputs in the compile key]
# The trace of a program with a traceable wrapper subclass input (See Note [Tensor
# subclasses are desugared] in aotkit_schemas) runs the subclass's ``__torch_dispatch__``
# on a subclass rebuilt from the inner tensors with ``__tensor_unflatten__(inner, ctx,
# ...)``: whatever the context holds (a float ``scale``, a tag, DTensor's placements) is
# read at trace time and baked into the graph, exactly like a Python scalar argument (Note
# [Non-tensor inputs]). The graph is also traced for the inner tensors' own dtypes,
# strides and offsets, which the outer tensor's metadata does not determine. So the key of
# every subclass input (``subclass_key``) holds, recursively through nested subclasses:
#   * the subclass type (a TwoTensor never shares an entry with a plain tensor of the same
#     metadata; every other tensor type is keyed by its type too);
#   * the context, by value: ints, bools, strings, None, dtypes, devices, enums by type and
#     value, floats by bit pattern (``float.hex``, as scalar inputs), tuples, lists, dicts,
#     sets and torch.Size element by element (the container's type included, so a
#     NamedTuple is not a tuple), dataclass instances field by field (a snapshot: a
#     mutable context changed in place later is seen), classes, functions and modules by
#     identity, and any other object whose type defines value equality and hashes
#     (DeviceMesh: hashable value objects are immutable by Python's contract);
#   * a subclass that defines ``__metadata_guard__(orig, new)`` (the protocol dynamo
#     guards with) decides itself: its context is kept as a deep copy and two contexts
#     match when the guard accepts them both ways round;
#   * each inner attribute by name: inner tensors as tensor inputs are keyed (dtype,
#     device, layout, requires_grad, and sizes, strides and offset unless their sizes are
#     symbolic: the ShapeEnv guards check those, See Note [Shape guards]), non-tensor
#     inner values (DTensor's mesh) as contexts.
# A context that none of these rules can key (a plain object compared by identity whose
# attributes the trace reads; a tensor) is refused when the call is keyed, with
# ``UnkeyableSubclassContextError`` naming the subclass, the value and the two fixes;
# reusing the graph for it could return the first context's result in silence, which is
# what torch's aot_function does. torch.compile is right here because dynamo guards on
# the context (``==`` or ``__metadata_guard__``); aotkit's rules are that guard's, made
# hashable. The on-disk key describes a subclass input too, from plain data only (See
# Note [On-disk cache keys]); the recompile log names the part that changed (See Note
# [Recompile reasons] in aotkit_frontends).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import types
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ._input_kinds import UnsupportedInputError

_BY_VALUE: tuple[type, ...] = (
    int, bool, str, bytes, complex, type(None),
    torch.dtype, torch.device, torch.layout, torch.memory_format,
)
_BY_IDENTITY: tuple[type, ...] = (
    type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType, types.MethodType,
)
_MAX_DEPTH = 16


class UnkeyableSubclassContextError(UnsupportedInputError):
    """A tensor subclass input whose ``__tensor_flatten__`` context (or a non-tensor inner
    value) the compile key cannot hold by value. See Note [Subclass inputs in the compile
    key]."""


@dataclass(frozen=True)
class SubclassKey:
    """The key part of one subclass input (See Note [Subclass inputs in the compile key]).
    ``shown`` is the context's repr for messages; it takes no part in comparisons."""

    cls: type
    context: Hashable
    inner: tuple[tuple[str, Hashable], ...]
    shown: str = field(compare=False)


class _GuardedContext:
    """A context compared by its subclass's ``__metadata_guard__``."""

    __slots__ = ("cls", "ctx")

    def __init__(self, cls: type, ctx: Any) -> None:
        self.cls = cls
        self.ctx = ctx

    def __hash__(self) -> int:
        return hash(self.cls)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _GuardedContext) or other.cls is not self.cls:
            return False
        guard = self.cls.__metadata_guard__  # type: ignore[attr-defined]
        return bool(guard(self.ctx, other.ctx)) and bool(guard(other.ctx, self.ctx))

    def __repr__(self) -> str:
        return repr(self.ctx)


def is_keyed_subclass(value: Any) -> bool:
    """A traceable wrapper subclass (keyed by ``subclass_key``)."""
    return isinstance(value, torch.Tensor) and is_traceable_wrapper_subclass(value)


def subclass_key(value: torch.Tensor, *, with_shapes: bool, where: str = "an input") -> SubclassKey:
    """The key part of the traceable wrapper subclass ``value``; ``with_shapes``: its
    inner tensors' sizes, strides and offsets are part of it (static shapes). Raises
    UnkeyableSubclassContextError. See Note [Subclass inputs in the compile key]."""
    cls = type(value)
    attrs, ctx = value.__tensor_flatten__()  # type: ignore[attr-defined]
    if hasattr(cls, "__metadata_guard__"):
        try:
            snapshot = copy.deepcopy(ctx)
        except Exception as e:
            raise _refusal(cls, ctx, where, f"its context cannot be copied ({e})") from e
        context: Hashable = _GuardedContext(cls, snapshot)
    else:
        context = _context_key(ctx, cls, ctx, where, 0)
    inner: list[tuple[str, Hashable]] = []
    for name in attrs:
        attr = getattr(value, name)
        if isinstance(attr, torch.Tensor):
            inner.append((name, tensor_part(attr, with_shapes=with_shapes, where=where)))
        else:
            inner.append((name, ("value", _context_key(attr, cls, attr, where, 0))))
    return SubclassKey(cls, context, tuple(inner), _shown(ctx))


def tensor_part(t: torch.Tensor, *, with_shapes: bool, where: str = "an input") -> Hashable:
    """An inner tensor's key part: its metadata, and its own subclass key when nested."""
    meta: tuple[Any, ...] = (t.dtype, t.device, t.layout, t.requires_grad)
    if with_shapes:
        meta = (*meta, tuple(t.shape), tuple(t.stride()), t.storage_offset())
    else:
        meta = (*meta, t.dim())
    cls = type(t)
    if cls is torch.Tensor or cls is torch.nn.Parameter:
        return meta
    if is_traceable_wrapper_subclass(t):
        return (*meta, subclass_key(t, with_shapes=with_shapes, where=where))
    return (*meta, ("type", cls))


def _shown(ctx: Any) -> str:
    try:
        text = repr(ctx)
    except Exception:  # a repr that fails must not fail the call
        text = f"<{type(ctx).__qualname__}>"
    return text if len(text) <= 200 else text[:197] + "..."


def _context_key(v: Any, cls: type, ctx: Any, where: str, depth: int) -> Hashable:
    if depth > _MAX_DEPTH:
        raise _refusal(cls, ctx, where, "it nests too deeply")
    t = type(v)
    if t is float:
        return (float, v.hex())  # -0.0 is not 0.0, a nan is keyed: See Note [Non-tensor inputs]
    if t in _BY_VALUE or isinstance(v, enum.Enum):
        return (t, v)
    if isinstance(v, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise _refusal(cls, ctx, where, f"it holds a {t.__name__}")
    if isinstance(v, (tuple, list)):
        return (t, tuple(_context_key(x, cls, ctx, where, depth + 1) for x in v))
    if isinstance(v, dict):
        return (t, tuple(
            (_context_key(k, cls, ctx, where, depth + 1), _context_key(x, cls, ctx, where, depth + 1))
            for k, x in v.items()
        ))
    if isinstance(v, (set, frozenset)):
        return (t, frozenset(_context_key(x, cls, ctx, where, depth + 1) for x in v))
    if isinstance(v, _BY_IDENTITY):
        return ("identity", v)
    if _value_hashable(v):
        return (t, v)
    if dataclasses.is_dataclass(v):
        return (t, tuple(
            (f.name, _context_key(getattr(v, f.name), cls, ctx, where, depth + 1))
            for f in dataclasses.fields(v)
        ))
    what = f"a {t.__module__}.{t.__qualname__}"
    raise _refusal(cls, ctx, where, f"it holds {what}, which is compared by identity")


def _value_hashable(v: Any) -> bool:
    """Whether ``v``'s type defines value equality and ``v`` hashes."""
    t: Any = type(v)
    base: Any = object
    if t.__eq__ is base.__eq__ or t.__hash__ is None or t.__hash__ is base.__hash__:
        return False
    try:
        hash(v)
    except TypeError:
        return False
    return True


def _refusal(cls: type, ctx: Any, where: str, why: str) -> UnkeyableSubclassContextError:
    name = f"{cls.__module__}.{cls.__qualname__}"
    return UnkeyableSubclassContextError(
        f"aotkit: {where} is a {name} whose __tensor_flatten__ context {_shown(ctx)} cannot "
        f"be part of the compile key: {why}. The trace bakes the context into the graph, so "
        "a graph traced for one context could be reused for another and return its values. "
        "Make the context plain data (ints, floats, strings, None, enums, dtypes, tuples, "
        "lists, dicts or dataclasses of them, or objects with value equality and a hash), "
        f"or define a classmethod {cls.__qualname__}.__metadata_guard__(original_context, "
        "new_context) -> bool that says when a graph traced for one context is valid for "
        "another. See Note [Subclass inputs in the compile key] in aotkit_capture."
    )

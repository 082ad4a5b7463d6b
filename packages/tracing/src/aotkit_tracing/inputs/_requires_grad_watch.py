"""A trace-time watch over the ``requires_grad`` changes a function makes to its inputs.

See Note [Inputs whose requires_grad the function changes] in ``_requires_grad_changes``.

# Note [A use of an input before its flip]
# ``c = a * 2; a.requires_grad_(); return c + a`` on an ``a`` that arrives not requiring
# grad: in eager ``c`` is not connected to ``a`` in autograd (``a.grad`` is 1, not 3). The
# retrace gives ``a`` its new flag from the start, so the watch runs each use of ``a``
# before its flip on ``a.detach()`` instead: same values and storage, no autograd
# connection, as eager's. The graph then holds a ``detach`` (or nothing: it is an alias)
# and ``a``'s gradient is only what the uses after the flip give. Not reproduced, and
# still raising ``InputRebindError`` at once: a write to ``a`` before the flip (eager's
# in-place op on a leaf that needs no grad; the trace's would be recorded by autograd or
# refused on a leaf that requires grad), a use whose result aliases ``a`` (a view, or
# ``a`` itself from ``contiguous``/``to``: eager's view follows the flip and requires grad
# afterwards, the detached one would not), and any use before a flip to False (eager's
# result stays connected to ``a``; the retrace has ``a`` not requiring grad).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

__all__ = ["RequiresGradWatch", "flag_change"]

# Tensor properties and methods that read no values: a call of one of them on an input
# before its flip is not a use (eager's result would not depend on the flip)
_QUERY_PROPERTIES = frozenset({
    "shape", "dtype", "device", "requires_grad", "is_leaf", "grad_fn", "ndim", "layout",
    "is_cuda", "is_cpu", "is_meta", "is_sparse", "is_quantized", "is_mkldnn", "is_nested",
    "names", "_version", "output_nr", "itemsize", "nbytes", "is_mps", "is_xpu",
})
_QUERY_METHODS = frozenset({
    "size", "dim", "ndimension", "stride", "numel", "nelement", "storage_offset",
    "is_contiguous", "element_size", "is_floating_point", "is_complex", "__len__",
    "get_device", "__hash__", "is_inference",
})


def _descriptor(func: Any) -> tuple[str | None, str | None]:
    """(``__get__``/``__set__``, the property's name) for a Tensor property access."""
    name = getattr(func, "__name__", None)
    if name in ("__get__", "__set__"):
        return name, getattr(getattr(func, "__self__", None), "__name__", None)
    return None, None


def flag_change(
    func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[torch.Tensor, bool] | None:
    """(tensor, new flag) when ``func`` is ``t.requires_grad_(flag)`` or
    ``t.requires_grad = flag``, else None."""
    if getattr(func, "__name__", None) == "requires_grad_" and args:
        flag = args[1] if len(args) > 1 else kwargs.get("requires_grad", True)
        return args[0], bool(flag)
    access, prop = _descriptor(func)
    if access == "__set__" and prop == "requires_grad" and len(args) == 2:
        return args[0], bool(args[1])
    return None


def _is_query(func: Any) -> bool:
    access, prop = _descriptor(func)
    if access == "__get__":
        return prop in _QUERY_PROPERTIES
    return getattr(func, "__name__", None) in _QUERY_METHODS


class RequiresGradWatch(TorchFunctionMode):
    """Follows the flips of the inputs in ``changes`` (input index -> the flag the
    function sets) while the function is traced with those inputs already carrying their
    new flag:

    * the flip itself is a no-op (the traced input already has the flag);
    * before the flip, ``requires_grad``, ``is_leaf`` and ``grad_fn`` of the input read as
      eager's caller-side leaf would (the old flag, True, None), so the function takes
      eager's branches;
    * any other use of the input before its flip to True runs on a detached alias of it
      (See Note [A use of an input before its flip]); a write, a view, or a use before
      a flip to False calls ``on_used_before(index, name)``, and a second change of it
      ``on_twice(index)`` (both raise).

    With ``watch_all``, a ``requires_grad_(False)`` on any other input that requires grad
    calls ``on_unseen(index)`` (which raises), since the trace cannot run it (its inputs
    that require grad are not leaves).
    """

    def __init__(
        self,
        args: Sequence[Any],
        changes: Mapping[int, bool],
        watch_all: bool,
        on_unseen: Callable[[int], None],
        on_used_before: Callable[[int, str], None],
        on_twice: Callable[[int], None],
    ) -> None:
        super().__init__()
        self._args = args  # keeps the ids below alive
        self._watched: dict[int, bool] = {}
        self._index: dict[int, int] = {}
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                self._index.setdefault(id(a), i)
                if i in changes:
                    self._watched[id(a)] = changes[i]
        self.flipped: set[int] = set()
        self._watch_all = watch_all
        self._on_unseen = on_unseen
        self._on_used_before = on_used_before
        self._on_twice = on_twice

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        change = flag_change(func, args, kwargs)
        if change is not None:
            t, flag = change
            target = self._watched.get(id(t))
            if target is not None:
                flipped = id(t) in self.flipped
                if flag != (target if flipped else not target):  # eager's flag changes
                    if flipped:
                        self._on_twice(self._index[id(t)])
                    self.flipped.add(id(t))
                # the traced input already carries the flag; setting eager's current
                # flag again is a no-op in eager too
                return t if getattr(func, "__name__", None) == "requires_grad_" else None
            if self._watch_all and not flag and t.requires_grad and id(t) in self._index:
                self._on_unseen(self._index[id(t)])
            return func(*args, **kwargs)
        if self._watched:
            access, prop = _descriptor(func)
            if access == "__get__" and args and id(args[0]) in self._watched:
                answer = self._eager_answer(args[0], prop)
                if answer is not _NO_ANSWER:
                    return answer
            if not _is_query(func):
                return self._use(func, args, kwargs)
        return func(*args, **kwargs)

    def _eager_answer(self, t: Any, prop: str | None) -> Any:
        if prop == "requires_grad":
            target = self._watched[id(t)]
            return target if id(t) in self.flipped else not target
        if prop == "is_leaf":
            return True
        if prop == "grad_fn":
            return None
        return _NO_ANSWER

    def _use(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """Run a use of the inputs; see Note [A use of an input before its flip]."""
        before = [
            leaf for leaf in pytree.tree_leaves((args, kwargs))
            if isinstance(leaf, torch.Tensor)
            and id(leaf) in self._watched and id(leaf) not in self.flipped
        ]
        if not before:
            return func(*args, **kwargs)
        first = self._index[id(before[0])]
        if not all(self._watched[id(t)] for t in before) or _writes(func, kwargs):
            # raised at once: the use may itself fail on the new flag (an in-place op on a
            # leaf that requires grad), with a less useful error
            self._on_used_before(first, _name(func))
        detached: dict[int, torch.Tensor] = {}

        def swap(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and any(x is t for t in before):
                if id(x) not in detached:
                    detached[id(x)] = x.detach()
                return detached[id(x)]
            return x

        args, kwargs = pytree.tree_map(swap, (tuple(args), dict(kwargs)))
        out = func(*args, **kwargs)
        aliases = tuple(detached.values())
        for o in pytree.tree_leaves(out):
            if isinstance(o, torch.Tensor) and (
                any(o is d for d in aliases) or (o._is_view() and any(o._base is d for d in aliases))
            ):
                # a view (or the input itself) follows the flip in eager
                self._on_used_before(first, _name(func))
        return out

    def unseen_flips(self) -> list[int]:
        """Watched inputs whose flip the trace did not reach."""
        return sorted(self._index[k] for k in self._watched if k not in self.flipped)


_NO_ANSWER = object()


def _writes(func: Any, kwargs: Mapping[str, Any]) -> bool:
    """Whether ``func`` (a torch function or Tensor method) writes an argument."""
    name = getattr(func, "__name__", "") or ""
    access, _ = _descriptor(func)
    return (
        access == "__set__"
        or "out" in kwargs
        or (name.endswith("_") and not name.endswith("__"))
        or (name.startswith("__i") and name.endswith("__") and name not in _NOT_INPLACE)
        or name in ("__setitem__", "__delitem__")
        or kwargs.get("inplace") is True
    )


_NOT_INPLACE = frozenset({"__invert__", "__index__", "__int__", "__iter__", "__init__"})


def _name(func: Any) -> str:
    access, prop = _descriptor(func)
    if access is not None:
        return f".{prop}"
    return str(getattr(func, "__qualname__", None) or getattr(func, "__name__", func))

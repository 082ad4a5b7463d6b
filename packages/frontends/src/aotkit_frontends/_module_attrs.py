"""The plain attributes of a module that aot_module's graphs depend on, checked per call.

# Note [Plain module attributes in aot_module's key]
# A forward reads plain Python attributes of its submodules while it is traced
# (``x * self.scale``, ``if self.use_relu:``, ``self.eps`` of a norm layer); their values
# are baked into the graph as constants or as the branch taken. Changing one afterwards
# (``model.block.scale = 3.0``) changes what eager computes, but torch's aot_module keeps
# running its first graph: a silently wrong result. aotkit's key for aot_module therefore
# holds, besides the training flags (See Note [Training flags in aot_module's key]), the
# current value of every plain attribute of every submodule registered when aot_module
# was called: bool, int, float, complex, str, None, torch.dtype/device/layout/
# memory_format, and tuples of those (recursively). A changed value misses the cache and
# compiles again (the ``recompiles`` log names the attribute), a restored value finds its
# old graph. Attributes are read straight from each submodule's ``__dict__``: one dict
# lookup per attribute per call, no attribute protocol; when every attribute holds the
# same object as on the previous call (compared with ``is``, in C) the previous key part
# is reused, so a steady-state call builds no new tuples. Reads are not recorded (a plain
# attribute read cannot be intercepted without swapping the module's class), so every
# plain attribute is checked, read or not; changing one the forward never reads costs a
# needless recompilation, never a wrong result. An attribute that held a plain value and
# now holds anything else (a tensor, a list, an object) is keyed by its type and identity,
# so the key never compares arbitrary objects. Types are part of the key: ``x * 2`` and
# ``x * 2.0`` differ on integer tensors. Other attributes (lists, dicts, callables,
# user objects) are not checked; torch's own derived caches (``_flat_weights``) are not
# either. nn.Module's bookkeeping (hooks, tables, ``training``) is excluded.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn as nn

from ._attribute_guard import _DERIVED_CACHES, _MODULE_INTERNALS

_SCALAR_TYPES = frozenset({
    bool, int, float, complex, str, type(None), torch.dtype, torch.device, torch.layout,
    torch.memory_format,
})
_MISSING = ("<aotkit: attribute deleted>",)


def is_plain(value: Any) -> bool:
    """A value a trace bakes in that compares by value: See Note [Plain module attributes
    in aot_module's key]."""
    t = type(value)
    if t in _SCALAR_TYPES:
        return True
    return t is tuple and all(is_plain(v) for v in value)


class ModuleAttrs:
    """The plain attributes of ``mod``'s submodules: their names, and a key part holding
    their current values. See Note [Plain module attributes in aot_module's key]."""

    def __init__(self, mod: nn.Module) -> None:
        self.names: list[str] = []
        self._slots: list[tuple[dict[str, Any], str]] = []
        for prefix, sub in mod.named_modules():
            for attr, value in sub.__dict__.items():
                if attr in _MODULE_INTERNALS or attr in _DERIVED_CACHES or not is_plain(value):
                    continue
                self.names.append(f"{prefix}.{attr}" if prefix else attr)
                self._slots.append((sub.__dict__, attr))
        self._last_raw: list[Any] = []
        self._pinned: list[Any] = []
        self._last_key: tuple[tuple[Any, ...], tuple[type, ...]] = ((), ())

    def values(self) -> tuple[tuple[Any, ...], tuple[type, ...]]:
        """The current values and their types, in ``names`` order (the part of the cache
        key; types too, so ``2`` and ``2.0`` or ``1`` and ``True`` differ)."""
        raw = [d.get(k, _MISSING) for d, k in self._slots]
        # the common case: every attribute holds the very objects of the previous call
        if len(raw) == len(self._last_raw) and all(map(operator.is_, raw, self._last_raw)):
            return self._last_key
        vals = list(raw)
        types = [type(v) for v in vals]
        for i, t in enumerate(types):
            if t not in _SCALAR_TYPES:
                vals[i] = _normalize(vals[i])
                if vals[i] is not raw[i] and t is not tuple:
                    # keyed by id: keep it alive so no later object reuses the id
                    self._pinned.append(raw[i])
        self._last_raw = raw
        self._last_key = (tuple(vals), tuple(types))
        return self._last_key


def _normalize(v: Any) -> Any:
    if v is _MISSING:
        return v
    if type(v) is tuple and is_plain(v):
        return tuple((type(x), _normalize(x)) for x in v)
    if type(v) in _SCALAR_TYPES:
        return v
    return ("<aotkit: not a plain value>", type(v), id(v))


def explain_attr_change(
    names: list[str], old: tuple[Any, ...], new: tuple[Any, ...]
) -> list[str]:
    """One sentence per changed attribute, for the ``recompiles`` log (``old``/``new`` are
    ``ModuleAttrs.values()`` results)."""

    def show(v: Any, t: type) -> str:
        if v is _MISSING:
            return "<deleted>"
        if isinstance(v, tuple) and v and v[0] == "<aotkit: not a plain value>":
            return f"a {t.__name__}"
        if t is tuple:
            return repr(tuple(_plain_of(x) for x in v))
        return repr(v)

    reasons = []
    (old_vals, old_types), (new_vals, new_types) = old, new
    for i, (a, b, ta, tb) in enumerate(zip(old_vals, new_vals, old_types, new_types, strict=True)):
        if a == b and ta is tb:
            continue
        name = names[i] if i < len(names) else f"#{i}"
        reasons.append(
            f"module attribute self.{name} changed from {show(a, ta)} to {show(b, tb)} "
            "(its value was baked into the graph)"
        )
    return reasons or ["a module attribute changed"]


def _plain_of(typed: Any) -> Any:
    t, v = typed
    return tuple(_plain_of(x) for x in v) if t is tuple else v

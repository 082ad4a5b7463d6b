"""Plain module attributes that aot_module's forward changes, replayed after each call.

# Note [Plain attributes a forward changes]
# A forward may change plain attributes of its module as a Python side effect:
# ``self.history.append(x.shape[0])``, ``self.calls += 1``, ``self.cfg["seen"] = True``.
# No graph records that. The trace runs under the attribute guard (See Note [Tensors
# assigned to module attributes by aot_module]), which puts every attribute back after
# the trace; before, the change was then lost in silence: eager's list grew on every call,
# aot_module's never did, and a forward that also read the list (``x * len(self.history)``)
# ran the graph traced for its first length forever.
#
# Now the guard also records, for each plain attribute the trace changed, the value it
# left (a deep copy of lists, dicts and tuples), and aot_module replays that after every
# call of the entry the trace made: the attribute is set to that value, and a list or dict
# the trace changed in place is changed in place (``lst[:] = ...``, ``d.clear();
# d.update(...)``), so references the user holds see it. This is exact: what the trace
# left depends on what it read, and every plain attribute a trace reads is in the entry's
# key (See Note [Plain module attributes in aot_module's key]); an attribute it only
# wrote does not depend on its old value. (Values computed from a tensor's data cannot be
# plain constants of a trace: ``.item()`` fails in it.) Non-plain values a forward leaves
# (a user object) are put back and not replayed, as before. An entry whose trace changed
# plain attributes is not stored on disk (a restored entry runs no trace, so it would have
# nothing to replay).
#
# A forward that changes an attribute it also reads (``self.history.append``: the append
# reads ``self.history``) makes every call's key new: each call compiles, and eager's
# values and side effects follow. Such a module would compile forever, so after
# ``SELF_CHANGING_LIMIT`` compilations whose replay changes an attribute the key holds,
# aot_module runs the module eagerly from then on, with a warning naming the attribute
# (torch.compile falls back alike at its recompile limit). Move such bookkeeping out of
# forward, or keep it in a buffer updated in place, to stay compiled.
#
# Note [Tensors a forward assigns to module attributes]
# A forward (or a forward pre-hook) that assigns a tensor to a plain attribute
# (``self.last = y.detach()``; old-style ``nn.utils.weight_norm`` and ``spectral_norm``,
# whose pre-hook recomputes ``module.weight`` from ``weight_g``/``weight_v`` or
# ``weight_orig`` on every call and assigns it) leaves a tracing tensor there while it is
# traced, and the forward reads it back (the Linear reads ``self.weight``): inside the
# trace it is an intermediate like any other. aot_module's traced function returns, next to
# the forward's output, every tracing tensor left in a plain attribute of a submodule
# (``take_assigned_tensors``, in module order; only when there are some, so every other
# forward keeps its output structure and its fast unflatten); they are outputs of the graph (with
# gradients, aliasing and views as for any output), the guard puts the attributes back
# after the trace, and after each call the entry's outputs are assigned to those
# attributes, as eager's assignment would have left them: ``module.weight`` after the call
# is the weight that call computed, and a loss on it backpropagates through the compiled
# backward to ``weight_g`` and ``weight_v``. Such an entry is not stored on disk either.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from aotkit_schemas import Uncacheable

from ._module_values import is_tracing_tensor

SELF_CHANGING_LIMIT = 8
MISSING = object()  # a Change's value when the trace deleted the attribute


def copy_plain(value: Any) -> Any:
    """Copy dicts, lists and tuples (recursively)."""
    if type(value) is dict:
        return {k: copy_plain(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(copy_plain(v) for v in value)
    return value


@dataclass(frozen=True)
class Change:
    """What one trace left in ``module.__dict__[attr]``."""

    module: nn.Module
    attr: str
    name: str  # ``prefix.attr``, as ModuleAttrs names slots
    value: Any  # MISSING when the trace deleted it
    in_place: bool  # a list or dict the trace changed without rebinding it

    def apply(self) -> None:
        d = self.module.__dict__
        if self.value is MISSING:
            d.pop(self.attr, None)
            return
        current = d.get(self.attr, MISSING)
        new = copy_plain(self.value)
        if self.in_place and type(current) is type(new) is list:
            current[:] = new
        elif self.in_place and type(current) is type(new) is dict:
            current.clear()
            current.update(new)
        else:
            d[self.attr] = new


def changed(old: Any, new: Any) -> bool:
    """Whether a plain value differs (by type and value, recursively)."""
    if type(old) is not type(new):
        return True
    if type(old) in (list, tuple):
        return len(old) != len(new) or any(map(changed, old, new))
    if type(old) is dict:
        return old.keys() != new.keys() or any(changed(v, new[k]) for k, v in old.items())
    try:
        return bool(old != new)
    except Exception:  # a value that does not compare: treat it as changed
        return True


class ForwardEffects:
    """The plain attribute changes of each aot_module entry's trace; replayed after each
    call. See Note [Plain attributes a forward changes]."""

    def __init__(self) -> None:
        self.recording: list[Change] = []  # the running trace's (the last pass wins)
        # the running trace's tensor assignments (See Note [Tensors a forward assigns to
        # module attributes]): (module, attribute, path)
        self.targets: list[tuple[nn.Module, str, str]] = []
        self._by_entry: dict[int, list[Change]] = {}
        self._targets_by_entry: dict[int, list[tuple[nn.Module, str, str]]] = {}
        self._self_changing = 0
        self.eager = False  # past the limit: the module runs eagerly

    def compiled(self, artifacts: Any, watched: list[str]) -> None:
        """An entry was compiled: keep what its trace left."""
        changes, self.recording = self.recording, []
        targets, self.targets = self.targets, []
        if targets:
            self._targets_by_entry[id(artifacts)] = targets
        if not changes:
            return
        self._by_entry[id(artifacts)] = changes
        read = [c.name for c in changes if c.name in watched]
        if read:
            self._self_changing += 1
            if self._self_changing >= SELF_CHANGING_LIMIT:
                self.eager = True
                warnings.warn(
                    f"aot_module: the forward changes self.{read[0]}, which it also reads, so "
                    f"every call compiled again ({SELF_CHANGING_LIMIT} compilations); the "
                    "module now runs eagerly. Move that bookkeeping out of forward, or keep "
                    "it in a buffer updated in place, to keep it compiled. See Note [Plain "
                    "attributes a forward changes].",
                    stacklevel=3,
                )

    def sidecar(self, outputs: Any) -> _RefusingSidecar:
        """``outputs`` (the entry's cache sidecar), refusing the on-disk store of an entry
        whose trace changed plain attributes: a restored entry runs no trace, so it would
        have nothing to replay."""
        return _RefusingSidecar(outputs, self)

    def take_assigned_tensors(self, mod: nn.Module) -> tuple[Any, ...]:
        """The tracing tensors the forward left in plain attributes of ``mod``'s
        submodules, in a fixed order, recorded as this trace's targets (See Note [Tensors
        a forward assigns to module attributes])."""
        targets, tensors = [], []
        for name, sub in mod.named_modules():
            for attr, value in sub.__dict__.items():
                if isinstance(value, torch.Tensor) and is_tracing_tensor(value):
                    targets.append((sub, attr, f"self.{name}.{attr}" if name else f"self.{attr}"))
                    tensors.append(value)
        self.targets = targets
        return tuple(tensors)

    def after_call(self, artifacts: Any, out: Any) -> Any:
        """Replay the entry's attribute changes after its call; the user's output."""
        targets = self._targets_by_entry.get(id(artifacts))
        if targets:  # See Note [Tensors a forward assigns to module attributes]
            out, tensors = out
            for (module, attr, _), t in zip(targets, tensors, strict=True):
                module.__dict__[attr] = t
        changes = self._by_entry.get(id(artifacts))
        if changes:
            for c in changes:
                c.apply()
        return out


class _RefusingSidecar:
    """A cache sidecar that refuses to be stored when the trace changed plain attributes
    (See Note [Plain attributes a forward changes])."""

    def __init__(self, inner: Any, effects: ForwardEffects) -> None:
        self._inner = inner
        self._effects = effects

    def to_json(self) -> Any:
        if self._effects.recording or self._effects.targets:
            names = ", ".join(
                [f"self.{c.name}" for c in self._effects.recording]
                + [path for _, _, path in self._effects.targets]
            )
            raise Uncacheable(f"the forward changes the module attributes {names}")
        return self._inner.to_json()

    def load_json(self, d: Any) -> None:
        self._inner.load_json(d)

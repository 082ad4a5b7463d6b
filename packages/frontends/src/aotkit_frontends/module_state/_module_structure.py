"""aot_module's check that the module tree is still the one it compiled.

# Note [Submodules, parameters and buffers added or removed later]
# aot_module lifts the parameters and buffers registered when it was called as the graph's
# first inputs, and its key watches the training flags and plain attributes of the
# submodules registered then. A submodule added afterwards (``model.extra = nn.Linear(..)``,
# ``model.layers.append(block)``), a parameter or buffer registered later, or a submodule
# deleted (``del model.layers[-1]``) changes what eager runs, but the graph would not see
# it: its parameters are not inputs, the branch ``if hasattr(self, "extra")`` was taken
# at trace time. Before, such a call ran the stale graph.
#
# Each call now checks the tree first, cheaply:
#   * every registration of a submodule, parameter or buffer on any nn.Module goes through
#     torch's global registration hooks, which bump one process-wide counter (one hook of
#     each kind, installed by the first aot_module);
#   * deletions go through no hook: the size of each tree module's ``_modules`` table is
#     compared (``map(len, ...)``, in C; about 1 us per call for 80 submodules). A deleted
#     parameter or buffer needs no check here: each call reads the lifted ones and raises
#     a clear error for one that is gone (``_StateSlots``).
# When either moved, the tree's fingerprint (every submodule by identity under its name,
# and each one's parameter and buffer names) is recomputed; if it differs, aot_module
# compiles the module again as if it were called now (new lifted inputs, new attribute
# slots), keeping the compiled forms of earlier trees, so going back to one finds its
# graphs. A counter bump without a change of the tree (a module built elsewhere, a buffer
# reassigned) costs one fingerprint, nothing more. Reassigning a parameter or buffer
# tensor in place of another is not a change of the tree: each call reads the current
# tensors (``_StateSlots``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.nn as nn
from torch.nn.modules import module as _module

_REGISTRATIONS = [0]
_HOOKED = [False]


def _bump(*args: Any) -> None:
    _REGISTRATIONS[0] += 1


def _install_hooks() -> None:
    if _HOOKED[0]:
        return
    _module.register_module_module_registration_hook(_bump)
    _module.register_module_parameter_registration_hook(_bump)
    _module.register_module_buffer_registration_hook(_bump)
    _HOOKED[0] = True


Fingerprint = tuple[Any, ...]


def fingerprint(mod: nn.Module) -> Fingerprint:
    """Every submodule (by identity) under its name, with its parameter and buffer names."""
    return tuple(
        (name, sub, tuple(sub._parameters), tuple(sub._buffers))
        for name, sub in mod.named_modules(remove_duplicate=False)
    )


class ModuleStructure:
    """Tells whether ``mod``'s tree changed since the last check. See Note [Submodules,
    parameters and buffers added or removed later]."""

    def __init__(self, mod: nn.Module) -> None:
        _install_hooks()
        self.mod = mod
        self._take(fingerprint(mod))

    def _take(self, fp: Fingerprint) -> None:
        self.current = fp
        self._seen = _REGISTRATIONS[0]
        tables: list[dict[str, Any]] = [sub._modules for _, sub, _, _ in fp]
        self._tables = tables
        self._sizes = tuple(map(len, tables))

    def changed(self) -> bool:
        """Whether the tree differs from the last check's (and remember the new one)."""
        if self._seen == _REGISTRATIONS[0] and tuple(map(len, self._tables)) == self._sizes:
            return False
        fp = fingerprint(self.mod)
        different = fp != self.current
        self._take(fp)
        return different


class Rebuilding:
    """The compiled form of a module for its current tree: ``build()`` makes one, and a
    call after the tree changed uses (or makes) the one for the new tree."""

    def __init__(self, mod: nn.Module, build: Callable[[], Any]) -> None:
        self._structure = ModuleStructure(mod)
        self._build = build
        self.compiled = build()
        self._by_tree: dict[Fingerprint, Any] = {self._structure.current: self.compiled}

    def current(self) -> Any:
        if self._structure.changed():
            tree = self._structure.current
            found = self._by_tree.get(tree)
            if found is None:
                found = self._by_tree[tree] = self._build()
            self.compiled = found
        return self.compiled

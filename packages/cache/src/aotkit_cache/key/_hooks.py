"""Module hooks in the on-disk cache key: a module with forward or backward hooks, and the
process-wide module hooks, are keyed by the hooks' code instead of refused.

# Note [Module hooks in the on-disk cache key]
# A module's forward pre-hooks, forward hooks and backward hooks run inside the traced
# call (``nn.Module.__call__``), so what they compute is baked into the graphs exactly as
# the forward is. The key therefore describes them as it describes the forward: for each
# module the fingerprint reaches, every hook table that changes what a call traces, in
# registration order, with each hook's flags (``with_kwargs``, ``always_call``, whether a
# backward hook is a full one) and the hook itself fingerprinted as program code (a
# function's bytecode, constants, closures and globals; a bound method's function and
# object; a torch-defined hook object, such as weight_norm's ``WeightNorm``, by its type
# and its plain attributes). The process-wide tables (``register_module_forward_hook``
# and friends) run around every module call of every program, so the key holds them too,
# for every compilation (``global_hooks_key``). Hook ids (``RemovableHandle``) are not
# keyed: they count registrations, not behaviour. Tables that do not change a call
# (state-dict and registration hooks) are not read.
# A hook the fingerprint cannot describe (an object of unknown type, a tensor in its
# closure) leaves the compilation uncached (``Uncacheable``), as any other part of the
# program would. A hook's Python side effects ran at trace time only, cached or not: a
# warm start, which does not trace, does not run them (as a second call does not).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn.modules.module as module_mod

# the tables of ``nn.Module`` that ``__call__`` runs or reads, with the flag tables that
# qualify them (keyed by the same handle ids)
_MODULE_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_FLAG_TABLES: dict[str, tuple[str, ...]] = {
    "_forward_pre_hooks": ("_forward_pre_hooks_with_kwargs",),
    "_forward_hooks": ("_forward_hooks_with_kwargs", "_forward_hooks_always_called"),
}
_GLOBAL_TABLES = (
    "_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
    "_global_backward_hooks",
)
_GLOBAL_FLAG_TABLES: dict[str, tuple[str, ...]] = {
    "_global_forward_hooks": (
        "_global_forward_hooks_with_kwargs", "_global_forward_hooks_always_called",
    ),
}


class _Feeds(Protocol):
    """The part of ``_fingerprint.Fingerprint`` the hooks are fed to."""

    def put(self, *parts: Any) -> None: ...

    def value(self, v: Any, depth: int = 0) -> None: ...

    def hexdigest(self) -> str: ...


def has_hooks(m: torch.nn.Module) -> bool:
    return any(getattr(m, t, None) for t in _MODULE_TABLES)


def module_hooks(fp: _Feeds, m: torch.nn.Module, depth: int) -> None:
    """Feed ``m``'s call hooks to ``fp``. See Note [Module hooks in the on-disk cache key]."""
    _tables(fp, lambda name: getattr(m, name, None), _MODULE_TABLES, _FLAG_TABLES, depth)
    if m._backward_hooks or m._backward_pre_hooks:
        fp.put("full backward", getattr(m, "_is_full_backward_hook", None))


def global_hooks_fingerprint(fp: _Feeds) -> str | None:
    """A fingerprint of the process-wide module hooks, fed to the empty ``fp``, None
    without any. Raises
    Uncacheable (through the fingerprint). See Note [Module hooks in the on-disk cache
    key]."""
    if not any(getattr(module_mod, t, None) for t in _GLOBAL_TABLES):
        return None
    _tables(fp, lambda name: getattr(module_mod, name, None), _GLOBAL_TABLES,
            _GLOBAL_FLAG_TABLES, 0)
    fp.put("full backward", getattr(module_mod, "_global_is_full_backward_hook", None))
    return fp.hexdigest()


def _tables(
    fp: _Feeds,
    get: Callable[[str], Any],
    tables: tuple[str, ...],
    flags: dict[str, tuple[str, ...]],
    depth: int,
) -> None:
    for table in tables:
        hooks = get(table)
        if not hooks:
            continue
        flag_tables = [get(f) or {} for f in flags.get(table, ())]
        fp.put("hooks", table, len(hooks))
        for handle, hook in hooks.items():
            fp.put("hook", [bool(f.get(handle, False)) for f in flag_tables])
            hook_value(fp, hook, depth + 1)


def hook_value(fp: _Feeds, hook: Any, depth: int) -> None:
    """A hook as program code; a torch-defined callable object (weight_norm's pre-hook)
    by its type and attributes, which decide what it does."""
    module = type(hook).__module__ or ""
    if (
        callable(hook)
        and not isinstance(hook, type)
        and hasattr(hook, "__dict__")
        and (module == "torch" or module.startswith("torch."))
        and not callable(getattr(hook, "__aotkit_fingerprint__", None))
        and not isinstance(hook, torch.nn.Module)
        and not hasattr(hook, "__code__")
    ):
        fp.put("torch hook object", module, type(hook).__qualname__)
        fp.value(sorted(vars(hook).items()), depth + 1)
        return
    fp.value(hook, depth + 1)

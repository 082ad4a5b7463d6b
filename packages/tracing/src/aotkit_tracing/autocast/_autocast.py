"""Autocast around the traced backward and around the compiled graphs.

# Note [Autocast in the backward trace]
# Eager runs a backward under whatever autocast state is in force where ``.backward()`` is
# called; a compiled backward is traced ahead of time, at the forward's call, so it has to
# choose. torch's functorch config ``backward_pass_autocast`` says what it chooses, and
# aotkit reads the same setting (a user who sets it for torch gets the same graphs):
#   * ``"same_as_forward"`` (the default): the backward is traced under the autocast state
#     of the forward's call, the state the trace already runs under;
#   * ``"off"``: autocast is turned off for every device type while the backward is traced;
#   * a list of ``torch.amp.autocast`` keyword dicts (``[{"device_type": "cuda"}]``):
#     autocast is turned off, then each dict is entered in order, as if the user wrote
#     ``with torch.amp.autocast(**kwargs): loss.backward()``.
# Anything else is refused with an error that names the accepted values. Only a backward
# trace reads it, so the setting is part of the compile key only when grad mode is on (an
# inference graph under no_grad is the same whatever it says): See Note [Ambient state in
# the compile key].
#
# Note [Compiled graphs run without autocast]
# A graph traced under autocast has autocast's casts (and its kernels' choices) in it
# already: an op autocast redirects is recorded as what it became. Running that graph
# under the same autocast again would apply autocast a second time to the ops left in the
# graph, which is not what eager did: a custom op with an Autocast kernel recorded inside
# ``with torch.autocast(..., enabled=False)`` would take its Autocast kernel at run time.
# So, as torch does, when autocast was on for some device type at compile time, the
# compiled forward (or inference) graph and the compiled backward graph are called under
# ``torch._C._DisableAutocast`` (every call: the compile key holds the autocast state, so
# an entry compiled under autocast is only ever called under it), and the user's
# compilers are called without autocast too (a compiler that runs or retraces the graph
# must see the ops the graph holds, not autocast's rewrite of them). The epilogue
# (input mutations, output views) runs outside: autocast does not touch those ops.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from aotkit_tracing._errors import AOTCompileError

_C: Any = torch._C
_SAME_AS_FORWARD = "same_as_forward"


def _setting_reader() -> Callable[[], Any]:
    """A reader of ``torch._functorch.config.backward_pass_autocast``.

    The compile key reads the setting on every call with grad on (See Note [Ambient state in
    the compile key]), and the config module's ``getattr`` costs about 1.2 us (alias and
    deprecation checks, env lookups). When this entry has none of those (no alias, no
    forced env value, no justknob, an immutable default: all fixed at import), its value is
    the context variable ``user_override`` when set, else the env default or the default:
    read that directly (0.03 us). Otherwise, or if torch's config internals look different,
    fall back to ``getattr``."""
    import torch._functorch.config as fconfig
    import torch.utils._config_module as config_module

    def slow() -> Any:
        return getattr(fconfig, "backward_pass_autocast", _SAME_AS_FORWARD)

    unset = getattr(config_module, "_UNSET_SENTINEL", None)
    entry: Any = getattr(fconfig, "_config", {}).get("backward_pass_autocast")
    try:
        fast_ok = (
            unset is not None
            and entry is not None
            and entry.alias is None
            and entry.justknob is None
            and not entry.hide
            and entry.env_value_force is unset
            and isinstance(entry.default, str)
        )
    except AttributeError:
        fast_ok = False
    if not fast_ok:
        return slow
    get = entry.user_override.get
    fallback = entry.default if entry.env_value_default is unset else entry.env_value_default

    def fast() -> Any:
        value = get()
        return fallback if value is unset else value

    return fast if fast() == slow() else slow


_setting = _setting_reader()


def _bad_setting(value: Any) -> AOTCompileError:
    return AOTCompileError(
        f"torch._functorch.config.backward_pass_autocast is {value!r}: aotkit accepts "
        "'same_as_forward', 'off', or a list of dicts of torch.amp.autocast keyword "
        "arguments (e.g. [{'device_type': 'cpu', 'dtype': torch.bfloat16}]). Set it to one "
        "of those. See Note [Autocast in the backward trace]."
    )


def backward_autocast_key() -> Any:
    """The backward autocast setting as a hashable value (None for the default), for the
    compile key; None when grad mode is off (no backward is traced then). See Note
    [Autocast in the backward trace]."""
    if not _C.is_grad_enabled():
        return None
    value = _setting()
    if value == _SAME_AS_FORWARD:
        return None
    if value == "off":
        return "off"
    if isinstance(value, list) and all(isinstance(kw, dict) for kw in value):
        return tuple(tuple(sorted((str(k), repr(v)) for k, v in kw.items())) for kw in value)
    return ("invalid", repr(value))  # refused when a backward is traced


@contextlib.contextmanager
def backward_autocast() -> Iterator[None]:
    """The autocast state the backward is traced under. See Note [Autocast in the backward
    trace]."""
    value = _setting()
    if value == _SAME_AS_FORWARD:
        yield
        return
    if not (value == "off" or (isinstance(value, list) and all(isinstance(kw, dict) for kw in value))):
        raise _bad_setting(value)
    with contextlib.ExitStack() as stack:
        for device in _C._autocast_supported_devices():
            if not hasattr(torch, device):  # a device with no backend module (privateuseone)
                continue
            stack.enter_context(torch.amp.autocast(device, enabled=False))
        if isinstance(value, list):
            for kwargs in value:
                stack.enter_context(torch.amp.autocast(**kwargs))
        yield


# Note [A failed trace leaves autocast as it found it]
# A dynamo graph turns ``with torch.autocast(...)`` into calls of ``_enter_autocast`` and
# ``_exit_autocast`` (not a ``with`` block), so a trace that raises between the two leaves
# the autocast state of the region in force. When aotkit falls back from one trace to
# another (the single-pass attempt to the two-pass flow), the second trace would then run
# under the region's state instead of the caller's (a backward traced with autocast off
# where the caller has it on). Each such attempt runs under preserved_autocast(), which
# puts back every device type's enabled flag and dtype, the cache flag and the nesting
# depth.


@contextlib.contextmanager
def preserved_autocast() -> Iterator[None]:
    """Restore the autocast state on exit. See Note [A failed trace leaves autocast as it
    found it]."""
    devices = [d for d in _C._autocast_supported_devices() if hasattr(torch, d)]
    state = [(d, _C.is_autocast_enabled(d), _C.get_autocast_dtype(d)) for d in devices]
    cache = _C.is_autocast_cache_enabled()
    depth = _C.autocast_increment_nesting() - 1
    _C.autocast_decrement_nesting()
    try:
        yield
    finally:
        for d, enabled, dtype in state:
            if _C.is_autocast_enabled(d) != enabled:
                _C.set_autocast_enabled(d, enabled)
            if _C.get_autocast_dtype(d) != dtype:
                _C.set_autocast_dtype(d, dtype)
        _C.set_autocast_cache_enabled(cache)
        now = _C.autocast_increment_nesting() - 1
        _C.autocast_decrement_nesting()
        for _ in range(now - depth):
            _C.autocast_decrement_nesting()
        for _ in range(depth - now):
            _C.autocast_increment_nesting()


def autocast_at_compile() -> bool:
    """Whether the graphs being compiled now were traced under autocast: then they run
    without it (See Note [Compiled graphs run without autocast])."""
    return bool(_C._is_any_autocast_enabled())


def without_autocast_compiling() -> contextlib.AbstractContextManager[Any]:
    """Autocast off while a user compiler runs (See Note [Compiled graphs run without
    autocast])."""
    return _C._DisableAutocast() if autocast_at_compile() else contextlib.nullcontext()


def run_without_autocast(compiled: Callable[..., Any], disable: bool) -> Callable[..., Any]:
    """``compiled`` (either calling convention) called under ``_DisableAutocast`` when
    ``disable``; boxed. See Note [Compiled graphs run without autocast]."""
    if not disable:
        return compiled
    from aotkit_runtime import as_list_caller

    call = as_list_caller(compiled)
    guard = _C._DisableAutocast

    def run(args: list[Any]) -> Sequence[Any]:
        with guard():
            return call(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run

"""aot_module_simplified's ``pre_grad_passes``: when they run against the on-disk cache.

# Note [Pre-grad passes after the cache lookup]
# torch's ``aot_module_simplified(mod, args, ..., pre_grad_passes=p)`` calls ``p(mod, args)``
# on a GraphModule ``mod`` at a time Inductor's config decides
# (``torch._inductor.codecache.resolve_pre_grad_pass_timing()``, whoever the caller is;
# See Note [Inductor pre-grad passes] in aotkit_backends for the rule and for what
# Inductor's passes do):
#   * "late" (the default): after the parameters and buffers are read and after the
#     compile-cache lookup, on a miss only, before fakification and tracing. aotkit does
#     the same against its on-disk cache: ``compile_flat`` calls the passes back after its
#     lookup missed (or when the disk cache is off), so a warm start never pays for them.
#     The entry's key is made before they run, so it must say what they will do: the
#     program's fingerprint (of the graph as dynamo gave it) is extended with the passes'
#     cache key (``mark_cache_key``, See Note [Compiler cache keys] in aotkit_schemas;
#     ``aotkit_inductor``'s passes carry Inductor's settings, custom passes by ``uuid()``).
#     Passes without a key, or whose settings cannot be described, leave the disk alone
#     (torch bypasses its cache for a custom pass without a uuid): never a stale entry.
#   * "early": first of all, on every compile, as torch; the program is then fingerprinted
#     as the passes left it, so they need no key.
# The module the graph is traced from is the one the passes return (torch keeps calling
# the one it was given, which in-place passes, Inductor's among them, also rewrite).
# Parameters and buffers are read before late passes, as torch reads them: passes that
# add, drop or replace one would make the compiled graph take other tensors than the ones
# read, so they raise instead of compiling a wrong graph.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
import torch.fx
import torch.nn as nn
from aotkit_schemas import compiler_cache_key

log = logging.getLogger(__name__)

PreGradPasses = Callable[[torch.fx.GraphModule, Sequence[Any]], torch.fx.GraphModule]

PASSES_CHANGED_TENSORS_MESSAGE = (
    "aot_module_simplified: pre_grad_passes changed the module's parameters or buffers "
    "({what}). They run after the parameters and buffers are read, as in torch (after the "
    "compile-cache lookup), so the compiled graph would not take the tensors the module "
    "now holds. Make the passes keep the module's parameters and buffers, or run them on "
    "the module before calling aot_module_simplified."
)


def pre_grad_timing() -> Literal["early", "late"]:
    """When ``pre_grad_passes`` run: Inductor's config decides, as in torch. See Note
    [Pre-grad passes after the cache lookup]. Raises RuntimeError as torch does for a
    custom pass without ``uuid()`` asked to run late."""
    # imported only when passes are given: Inductor takes seconds to import (See Note
    # [Import cost])
    from torch._inductor import codecache

    resolve = getattr(codecache, "resolve_pre_grad_pass_timing", None)
    if resolve is None:  # a torch without the choice ran them late
        return "late"
    timing: Literal["early", "late"] = resolve()
    return timing


def passes_identity(identity: str | None, passes: PreGradPasses) -> str | None:
    """The program's cache identity extended with what late ``passes`` will do, or None
    (no disk cache) when they cannot say. See Note [Pre-grad passes after the cache
    lookup]."""
    if identity is None:
        return None
    try:
        key = compiler_cache_key(passes)
    except Exception as e:  # See Note [Compiler cache keys]: settings that cannot be described
        log.debug("aotkit cache: not caching: the pre-grad passes' settings: %s", e)
        return None
    if key is None:
        log.debug(
            "aotkit cache: not caching: the pre-grad passes %r offer no cache key "
            "(aotkit_schemas.mark_cache_key)", getattr(passes, "__qualname__", passes),
        )
        return None
    return f"{identity}|pre_grad:{key}"


def tensor_slots(mod: nn.Module) -> dict[str, int]:
    """The module's parameters and buffers by name, as object ids."""
    return {
        **{n: id(p) for n, p in mod.named_parameters(remove_duplicate=False)},
        **{n: id(b) for n, b in mod.named_buffers(remove_duplicate=False)},
    }


def check_tensors_kept(before: dict[str, int], after: nn.Module) -> None:
    """Raise when late passes changed the module's parameters or buffers. See Note
    [Pre-grad passes after the cache lookup]."""
    now = tensor_slots(after)
    if now == before:
        return
    gone = sorted(set(before) - set(now))
    added = sorted(set(now) - set(before))
    replaced = sorted(n for n in set(before) & set(now) if before[n] != now[n])
    what = "; ".join(
        f"{label}: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''}"
        for label, names in (("removed", gone), ("added", added), ("replaced", replaced))
        if names
    )
    raise RuntimeError(PASSES_CHANGED_TENSORS_MESSAGE.format(what=what))

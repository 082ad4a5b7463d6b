"""The on-disk compile cache, wired into the pipeline when aotkit-cache is installed.

Without the package every entry point compiles uncached (See Note [The compile cache seam]
in aotkit_schemas); with it, an entry point whose cache is on hands ``compile_flat`` one
``DiskCompileCache`` per compilation.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import torch.utils._pytree as pytree
from aotkit_capture import PipelineCache
from aotkit_schemas import CacheSidecar, Uncacheable

try:  # imported with aotkit: See Note [Import cost] in _dynamo_backend
    import aotkit_cache
except ImportError:  # aotkit-cache is not installed: no disk cache
    aotkit_cache = None  # type: ignore[assignment]

log = logging.getLogger(__name__)


def disk_cache(identity: str | None, sidecar: CacheSidecar | None) -> PipelineCache | None:
    """The compile cache of one compilation of the program ``identity`` names, or None
    (no identity, or no aotkit-cache)."""
    if identity is None or aotkit_cache is None:
        return None
    return aotkit_cache.DiskCompileCache(identity, sidecar)


def fingerprint_or_none(program: Any) -> str | None:
    """aotkit_cache's ``program_fingerprint(program)``, or None: no aotkit-cache, or a
    program that cannot be fingerprinted (logged)."""
    if aotkit_cache is None:
        return None
    try:
        return aotkit_cache.program_fingerprint(program)
    except Uncacheable as e:
        log.debug("aotkit cache: not caching %s: %s", type(program).__name__, e)
        return None


# Note [The program in aot_function's disk key]
# The on-disk key's program part (See Note [On-disk cache keys] in aotkit_cache) must
# describe everything the flat function traces besides its flat inputs:
#   * the user's program: the function for aot_function; for aot_module the module itself
#     (class code, attributes, submodules, hooks), not the aotkit wrapper that calls it.
#     The wrapper is aotkit code, which the fingerprint names without reading its
#     closures, so keying it would key no module at all: two module classes with the same
#     parameter shapes shared an entry, and a warm start ran the other module's graph;
#   * the call's structure (the pytree spec of args and kwargs): the flat inputs are
#     matched to the function's parameters through it, so ``f(x, y)`` and
#     ``f(b=x, a=y)`` have the same flat inputs and different programs.


def disk_identity(program: Any, in_spec: pytree.TreeSpec) -> str | None:
    """The on-disk cache identity of calling ``program`` with arguments structured as
    ``in_spec``, or None (logged) when it cannot be fingerprinted. See Note [The program
    in aot_function's disk key]."""
    fingerprint = fingerprint_or_none(program)
    if fingerprint is None:
        return None
    return hashlib.sha256(f"{fingerprint}\x00{in_spec!r}".encode()).hexdigest()

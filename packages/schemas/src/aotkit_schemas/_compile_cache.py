"""The seam between the compile pipeline and a compile cache.

# Note [The compile cache seam]
# The pipeline (``aotkit_capture.compile_flat``) knows no on-disk cache: its caller may hand
# it one ``CompileCache`` per compilation, and the pipeline calls it at three points:
#   1. ``lookup(flat_args, cfg)`` before anything is fakified or traced: a restored
#      compilation (the pipeline's own ``(runner, artifacts)``) ends the compile there;
#   2. ``tracing()``, a context entered around the trace, partition and compilers after a
#      miss, so the cache can record what its store needs to know of the trace (the
#      operators it called: See Note [Refusing only the compilations that reach an
#      unkeyable kernel] in aotkit_cache);
#   3. ``store(artifacts)`` once the compilation has been checked (generators made inside
#      the trace raise before it).
# aotkit_cache's ``DiskCompileCache`` is the implementation; frontends build one per call
# when the package is installed and the cache is on for the entry point (See Note
# [On-disk compile cache] in aotkit_cache), and pass None otherwise, so everything works,
# uncached, without aotkit-cache installed. A cache's failures never fail a compilation:
# a lookup that cannot restore returns None, a store that cannot write logs and returns.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from ._config import AOTConfig

ResultT = TypeVar("ResultT", covariant=True)
ArtifactsT = TypeVar("ArtifactsT", contravariant=True)

# what compilations did, process-wide: ``trace`` counts full compilations (the pipeline),
# the cache counts its lookups, hits, misses, stores and refusals under its own names
cache_counters: collections.Counter[str] = collections.Counter()


class Uncacheable(Exception):
    """Raised while keying or storing a compilation that the cache cannot describe (the
    compilation still runs, uncached)."""


class CacheSidecar(Protocol):
    """Frontend state a compilation fills in while tracing (the output layout), stored
    with the entry and restored on a hit, when no trace runs to fill it."""

    def to_json(self) -> Any: ...

    def load_json(self, d: Any) -> None: ...


class CompileCache(Protocol[ResultT, ArtifactsT]):
    """One compilation's cache. See Note [The compile cache seam]."""

    def lookup(self, flat_args: Sequence[Any], cfg: AOTConfig) -> ResultT | None:
        """The compilation restored for these inputs, or None: trace and compile."""
        ...

    def tracing(self) -> AbstractContextManager[None]:
        """Entered around the trace and compilation that follow a miss."""
        ...

    def store(self, artifacts: ArtifactsT) -> None:
        """Keep the finished compilation (a no-op when the lookup found no key)."""
        ...

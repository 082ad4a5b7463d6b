"""Full garbage collections deferred while aotkit compiles.

# Note [Full collections deferred during a compile]
# Tracing and compiling a graph allocates hundreds of thousands of Python objects (FX
# nodes, fake tensors, sympy expressions, Inductor's IR), most of them alive until the
# compile ends. CPython's cyclic collector counts them as they are allocated and, every
# tenth gen-1 collection (once the survivors add up to a quarter of the long-lived
# objects), runs a full (gen-2) collection, which walks every object of the process: on
# a GPT-2 training step that is 0.4 s of a 6 s first step, spent on objects the compile
# still needs. torch raises the gen-2 threshold for the duration of a dynamo compile and
# of the lazy backward compile (``torch._dynamo.utils.deferred_full_gc``, set by
# ``torch._dynamo.config.gc_gen2_threshold_during_compile``, 1000 by default, ``None`` or
# 0 for off), and aotkit does the same around its compiles: ``compile_flat`` (already
# inside dynamo's deferral when called from a torch.compile backend) and the lazy
# backward compile, which runs at the first backward, outside dynamo's compile. Young
# collections still run; only full ones wait, and the threshold is restored when the
# outermost compile ends, so the deferred collection comes shortly after.
#
# When dynamo is loaded its own context manager is used, so that nested and concurrent
# compiles (dynamo's and aotkit's, in any thread) share one depth counter and restore the
# thresholds once, and a user's setting of the config applies to aotkit's compiles too.
# Without dynamo (``aot_function`` alone; See Note [Import cost] in aotkit_frontends)
# aotkit keeps the same counter itself, with the threshold of torch's environment
# variable ``TORCH_DYNAMO_GC_GEN2_THRESHOLD_DURING_COMPILE`` (1000 when unset, 0 for off).
# Like torch's, it is off on free-threaded builds, whose collector is not generational.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import sysconfig
import threading
from collections.abc import Iterator
from typing import Any

_DEFAULT_THRESHOLD = 1000

_lock = threading.Lock()
_depth = 0
_saved: tuple[int, int, int] | None = None


def deferred_full_collections() -> contextlib.AbstractContextManager[Any]:
    """A context manager that defers full (gen-2) garbage collections while it is
    entered. See Note [Full collections deferred during a compile]."""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    deferred = getattr(dynamo_utils, "deferred_full_gc", None)
    if deferred is not None:
        manager: contextlib.AbstractContextManager[Any] = deferred()
        return manager
    return _deferred_without_dynamo()


def _threshold() -> int | None:
    if sysconfig.get_config_var("Py_GIL_DISABLED") == 1:
        return None
    try:
        value = int(
            os.environ.get("TORCH_DYNAMO_GC_GEN2_THRESHOLD_DURING_COMPILE", _DEFAULT_THRESHOLD)
        )
    except ValueError:
        return _DEFAULT_THRESHOLD
    return value or None


@contextlib.contextmanager
def _deferred_without_dynamo() -> Iterator[None]:
    global _depth, _saved
    threshold = _threshold()
    if threshold is None:
        yield
        return
    with _lock:
        if _depth == 0:
            _saved = gc.get_threshold()
            gen0, gen1, gen2 = _saved
            gc.set_threshold(gen0, gen1, max(gen2, threshold))  # never lower a raised one
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                _saved = None


# Note [Collections paused while a cache entry is restored]
# A warm hit of the on-disk cache (See Note [On-disk compile cache]) parses the entry's
# JSON and rebuilds its graphs: thousands of lists, dicts, FX nodes and metadata objects,
# all alive until the compiled entry is built, most for as long as it lives. CPython's
# collector counts them as they are allocated and runs a young collection every 700 net
# allocations, each of which walks every object allocated since the last one, and every
# tenth a gen-1 collection that also walks the survivors of the last ten: on compare.py's
# convnet a warm first call ran four collections, 1.5 ms of a 10 ms restore, and freed
# nothing of the restore's objects. So the collector is off while aotkit reads and
# rebuilds an entry (``CollectionPause``), and back on before any compiler runs (a
# compiler's work is not bounded by the entry: Inductor compiling on its own cache miss
# allocates hundreds of thousands of objects, some of them garbage). What the restore
# allocates is bounded by the entry's size; once the collector is back on, the next
# allocation runs one young collection over all of it (the count kept going up), so no
# garbage is kept beyond it. Pauses nest and may overlap across threads: the collector is
# off while any pause is active, and the outermost one leaves it as it found it (a
# collector the user turned off stays off).
_pause_lock = threading.Lock()
_pauses = 0
_was_enabled = False


class CollectionPause:
    """The collector off from ``__enter__`` until ``resume()`` or ``__exit__``, whichever
    comes first. See Note [Collections paused while a cache entry is restored]."""

    __slots__ = ("_active",)

    def __init__(self) -> None:
        self._active = False

    def __enter__(self) -> CollectionPause:
        global _pauses, _was_enabled
        with _pause_lock:
            if _pauses == 0:
                _was_enabled = gc.isenabled()
                gc.disable()
            _pauses += 1
            self._active = True
        return self

    def resume(self) -> None:
        """End this pause early (idempotent)."""
        global _pauses
        with _pause_lock:
            if not self._active:
                return
            self._active = False
            _pauses -= 1
            if _pauses == 0 and _was_enabled:
                gc.enable()

    def __exit__(self, *exc: object) -> None:
        self.resume()

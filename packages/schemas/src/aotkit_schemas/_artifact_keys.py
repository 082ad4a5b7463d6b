"""Compiled-artifact keys: how a compiler hands the on-disk cache a handle to its own
cached output, and gets it back on a warm start.

# Note [Compiled-artifact keys]
# A compiler with a cache of its own (Inductor's FX graph cache) can make a warm start
# cheaper than "compile the restored graph again and let my cache find it": computing its
# own cache key may cost more than loading the artifact (Inductor's key hashes the graph,
# its whole config and the sources of torch and triton). So a compiler may record, on the
# GraphModule it compiled, a short string naming its artifact
# (``record_artifact_key(gm, "fxgraph/...")``). aotkit's on-disk cache stores the string
# with that graph and sets it on the graph it restores (``artifact_key(gm)``), and the
# compiler may then load its artifact by that key instead of recomputing it.
# Rules:
#   * The string is only a handle, never code or data: at most 256 characters of
#     ``[A-Za-z0-9_./:=-]``; the cache refuses any other as a damaged entry. The compiler's
#     artifact stays in the compiler's own cache, which is the compiler's business.
#   * The compiler must check that the handle still applies before using it (its own
#     settings and versions, which aotkit's key does not cover, are part of the string or
#     checked against it), and fall back to compiling when the artifact is missing or does
#     not apply. A handle is an optimization, never a source of truth.
#   * A backward graph is compiled at its first call, after the entry was written; the
#     cache registers ``on_artifact_key`` callbacks to add keys recorded later.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable
from typing import Any

ARTIFACT_KEY_META = "aotkit_artifact_key"
# the callbacks live beside the graphs, not in their ``meta``: a graph stays picklable
_listeners: weakref.WeakKeyDictionary[Any, list[Callable[[str], None]]] = (
    weakref.WeakKeyDictionary()
)
ARTIFACT_KEY_PATTERN = re.compile(r"[A-Za-z0-9_./:=-]{1,256}")


def record_artifact_key(gm: Any, key: str) -> None:
    """Record ``key`` as the handle of ``gm``'s compiled artifact (See Note [Compiled-artifact
    keys]) and tell the callbacks registered with ``on_artifact_key``. A key that is not a
    valid handle is ignored."""
    meta = getattr(gm, "meta", None)
    if not isinstance(meta, dict) or not ARTIFACT_KEY_PATTERN.fullmatch(key):
        return
    if meta.get(ARTIFACT_KEY_META) == key:
        return
    meta[ARTIFACT_KEY_META] = key
    for callback in list(_listeners.get(gm, ())):
        callback(key)


def artifact_key(gm: Any) -> str | None:
    """The handle recorded on ``gm`` (by its compiler, or restored by the cache), or None."""
    meta = getattr(gm, "meta", None)
    key = meta.get(ARTIFACT_KEY_META) if isinstance(meta, dict) else None
    return key if isinstance(key, str) and ARTIFACT_KEY_PATTERN.fullmatch(key) else None


def on_artifact_key(gm: Any, callback: Callable[[str], None]) -> None:
    """Call ``callback(key)`` when a new handle is recorded on ``gm``."""
    _listeners.setdefault(gm, []).append(callback)

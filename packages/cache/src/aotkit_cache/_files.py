"""The on-disk compile cache: the entry file format, reading and writing entry files.

# Note [On-disk compile cache]
# What: one compiled entry (one program, one input pattern, one ambient state; See Note
# [On-disk cache keys]) is one file ``<dir>/v<FORMAT>/<key[:2]>/<key>.json``: a header line
#     {"aotkit": "<source hash>", "format": 4, "key": "<key>", "sha256": "<hash of payload>",
#      "torch": "..."}
# then the payload's JSON text. (Format 2 held the payload as a JSON string inside the
# header object: reading it parsed the payload twice, the second time out of an escaped
# string, which was 0.2-0.5 ms of a warm hit on compare.py's models.)
# The payload holds the ViewAndMutationMeta (versioned JSON, See Note [Cache JSON format]
# in aotkit_schemas), the input layout (its key and the user inputs whose mutation chose
# synthetic bases), the epilogue's output offsets, the plan's stale tangents and
# backward-mutated inputs, the trace path flags, the frontend's output layout (the
# ``CacheSidecar``), and the forward/backward or inference graphs in a structured form:
# every node with its op, name, target, arguments and the shape/stride/dtype/device/
# requires_grad of its value (See Note [Graph nodes in the cache JSON] in
# ``entry._graph``; each distinct value stored once: See Note [The value table of a
# cached graph]).
# Invariants:
#   * Never unpickle, never evaluate. Targets are looked up, not evaluated: ATen overloads
#     through ``torch.ops`` and a closed table of Python operators; dtypes, enums and
#     output types through closed tables. Reading an entry never runs code from the cache
#     directory.
#   * Never crash, never a wrong result. A file that does not parse, has another format,
#     torch or aotkit hash, another key, a wrong checksum, or a payload that fails any
#     check on rebuild (unknown op, a node reading a value no earlier node made,
#     metadata that breaks a dataclass invariant, placeholders that do not describe the
#     call's inputs, another input layout) is logged at WARNING, ignored, and the
#     program is compiled again (the entry is then rewritten). The checksum catches
#     damage, not forgery: a forged entry still goes through every check above, and the
#     key covers what the checks cannot.
#   * Atomic writes. Writes go to a temporary file in the entry's directory, then
#     ``os.replace``: readers and a second writer of the same key see the old file or the
#     new one, never a half-written one; two writers leave one valid entry.
#   * A warm hit skips fakification, the metadata pass, the joint trace and the
#     partitioner: it rebuilds the graphs with fake values (checked now, built when first
#     read: See Note [Lazy node values of restored graphs]), hands them to the compilers
#     (``_compile.training_call``/``inference_call``, the same code a fresh compilation
#     runs) and wraps the epilogue. The compiler's own artifact is not stored by aotkit:
#     nop recompiles from the graph (cheap); ``aotkit_inductor``'s compilers record the
#     key of their artifact in Inductor's FX graph cache (in Inductor's own cache
#     directory), which the entry stores with each graph (``artifact_keys``, a short
#     checked string, added to the entry when the backward compiles) and gives back to the
#     restored graphs, so that Inductor loads its artifact without recomputing its key
#     (See Note [Compiled-artifact keys] in aotkit_schemas and Note [Inductor artifact
#     keys] in aotkit_backends).
#   * Graphs with symbolic sizes carry their shape facts (sizes as JSON expression trees,
#     the ShapeEnv's guards) and are used only where those hold: See Note [Dynamic shapes
#     in the on-disk cache]. Such entries are ``<key>-<hash of the facts>.json``: one key
#     may hold several (one per specialization), tried newest first.
#   * Graphs calling higher-order operators store their FX subgraphs the same way: See
#     Note [Higher-order operators in the on-disk cache]; effect tokens: See Note [Effect
#     tokens in the on-disk cache].
#   * Tensor constants are stored with their bytes and a checksum: See Note [Tensor
#     constants in the on-disk cache]; functionalization's recorded view chains by their
#     ViewMeta classes' names and arguments: See Note [View chains in the cache JSON
#     format] in aotkit_schemas.
#   * Not stored (compiled every time, never an error), each for its reason:
#       - tensor subclass inputs/outputs: the subclass layer's metadata holds the user's
#         classes and their ``__tensor_flatten__`` contexts (arbitrary Python objects),
#         which the entry could only restore by constructing types named in the file;
#       - aliased or duplicated inputs under dynamic shapes: the synthetic-base layout is
#         keyed by concrete sizes, strides and offsets, which the shape facts do not
#         relate (dynamo passes each parameter once, so tied weights do not reach this);
#       - higher-order ops outside that note's list (process-local state, Python
#         callables, export-only ones);
#       - exports: their result is the graphs handed to the caller, not a compiled call;
#       - and
#     programs, inputs or compilers the key cannot describe (``Uncacheable``).
# When: off by default for aot_function/aot_module (and then only with compilers and a
# partitioner that declare a cache key, See Note [Compiler cache keys] in aotkit_schemas),
# on by default for the ``aotkit_eager``/``aotkit_inductor`` torch.compile backends.
# ``AOTKIT_CACHE=0/1`` or ``aotkit_schemas.disk_cache_config.enabled`` overrides both;
# ``AOTKIT_CACHE_DIR`` or ``disk_cache_config.dir`` picks the directory (default
# ``~/.cache/aotkit``). ``aotkit cache`` shows, lists and clears it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import re
import tempfile
from typing import Any

import torch
from aotkit_schemas import cache_counters as counters
from aotkit_schemas import disk_cache_dir

from aotkit_cache.key._key import CACHE_FORMAT, aotkit_source_hash

log = logging.getLogger(__name__)

# aotkit_schemas' counters: trace (full compilations, counted by the pipeline); hit/miss:
# disk lookups; store: entries written; reject: entries found but ignored; uncacheable:
# compilations the key could not describe
cache_counters = counters


def cache_dir() -> pathlib.Path:
    """The cache's root directory (not created); see ``aotkit_schemas.DiskCacheConfig``."""
    return disk_cache_dir()


def _entries_root() -> pathlib.Path:
    return cache_dir() / f"v{CACHE_FORMAT}"


def entry_path(key: str) -> pathlib.Path:
    return _entries_root() / key[:2] / f"{key}.json"


_ENTRY_NAME = re.compile(r"[0-9a-f]{64}(-[0-9a-f]{16})?\.json|\.tmp.*\.part")


def variants(key: str) -> list[str]:
    """The names of the entries stored under ``key`` with shape facts (``<key>-<hash>``),
    newest first. See Note [Dynamic shapes in the on-disk cache]."""
    try:
        found = [
            (p.stat().st_mtime_ns, p.stem)
            for p in entry_path(key).parent.glob(f"{key}-*.json")
            if _ENTRY_NAME.fullmatch(p.name)
        ]
    except OSError:
        return []
    return [name for _, name in sorted(found, reverse=True)]


def _entry_files() -> list[pathlib.Path]:
    """Entry files (and temporary files of writes) under the cache directory: only names
    the cache writes, ``v<N>/<xx>/<sha256>.json``, so a directory shared with other files
    (``AOTKIT_CACHE_DIR=~``) is never swept."""
    root = cache_dir()
    if not root.is_dir():
        return []
    found = []
    for version in root.glob("v[0-9]*"):
        for p in version.glob("??/*"):
            if p.is_file() and _ENTRY_NAME.fullmatch(p.name):
                found.append(p)
    return sorted(found)


def list_entries() -> list[tuple[pathlib.Path, int]]:
    """Every entry file under the cache directory, with its size in bytes."""
    return [(p, p.stat().st_size) for p in _entry_files() if p.suffix == ".json"]


def clear_entries() -> int:
    """Remove every entry file (and leftover temporary file); the count removed."""
    removed = 0
    for p in _entry_files():
        p.unlink(missing_ok=True)
        removed += 1
    return removed


# ---- reading and writing entry files ---------------------------------------------------


def store(key: str, payload: dict[str, Any], counter: str = "store") -> None:
    """Write one entry atomically (counted in ``cache_counters[counter]``). See Note
    [On-disk compile cache]."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    header = {
        "format": CACHE_FORMAT,
        "torch": torch.__version__,
        "aotkit": aotkit_source_hash(),
        "key": key,
    }
    path = entry_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp", suffix=".part", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(entry_bytes(header, text))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        log.warning("aotkit cache: could not write %s: %s", path, e)
        return
    cache_counters[counter] += 1


def entry_bytes(header: dict[str, Any], payload_text: str) -> bytes:
    """An entry file's bytes: the header (``header`` with the payload's checksum) on the
    first line, the payload's JSON text after it. See Note [On-disk compile cache]."""
    body = payload_text.encode()
    head = json.dumps({**header, "sha256": hashlib.sha256(body).hexdigest()}, sort_keys=True)
    return head.encode() + b"\n" + body


def split_entry(raw: bytes) -> tuple[Any, bytes]:
    """An entry file's header (parsed, unchecked) and payload bytes (unparsed)."""
    head, sep, body = raw.partition(b"\n")
    if not sep:
        raise ValueError("no header line")
    return json.loads(head), body


def load(key: str) -> dict[str, Any] | None:
    """The payload of the entry for ``key``, or None (missing, or rejected and logged)."""
    path = entry_path(key)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        cache_counters["miss"] += 1
        return None
    except OSError as e:
        return _reject(path, f"unreadable ({e})")
    try:
        doc, body = split_entry(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        return _reject(path, f"not an entry file ({e})")
    if not isinstance(doc, dict):
        return _reject(path, "the header is not a JSON object")
    expected = {"format": CACHE_FORMAT, "torch": torch.__version__,
                "aotkit": aotkit_source_hash(), "key": key}
    for field, want in expected.items():
        if doc.get(field) != want:
            return _reject(path, f"{field} is {doc.get(field)!r}, expected {want!r}")
    if hashlib.sha256(body).hexdigest() != doc.get("sha256"):
        return _reject(path, "checksum mismatch")
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        return _reject(path, f"payload is not valid JSON ({e})")
    if not isinstance(payload, dict):
        return _reject(path, "payload is not a JSON object")
    return payload


def _reject(path: pathlib.Path, why: str) -> dict[str, Any] | None:
    cache_counters["reject"] += 1
    log.warning("aotkit cache: ignoring entry %s: %s; compiling again", path, why)
    return None


def reject_payload(key: str, why: str) -> None:
    """Log that a checksummed payload failed a consistency check on load."""
    cache_counters["reject"] += 1
    log.warning("aotkit cache: ignoring entry %s: %s; compiling again", entry_path(key), why)

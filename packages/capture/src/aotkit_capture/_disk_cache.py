"""The on-disk compile cache: the entry file format, reading and writing, graphs as JSON.

# Note [On-disk compile cache]
# What: one compiled entry (one program, one input pattern, one ambient state; See Note
# [On-disk cache keys]) is one file ``<dir>/v<FORMAT>/<key[:2]>/<key>.json``: a header line
#     {"aotkit": "<source hash>", "format": 3, "key": "<key>", "sha256": "<hash of payload>",
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
# requires_grad of its value (each distinct value stored once: See Note [The value table
# of a cached graph]).
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

import collections
import hashlib
import json
import logging
import math
import operator
import os
import pathlib
import re
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from aotkit_schemas import (
    CacheFormatError,
    TensorSpec,
    disk_cache_dir,
    dtype_from_name,
    dtype_name,
)
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx._lazy_graph_module import _make_graph_module, _use_lazy_graph_module

from ._disk_cache_constants import attach_constants, constants_to_json
from ._disk_cache_hops import (
    check_subgraph_reads,
    hop_target_from_json,
    hop_target_to_json,
    is_attribute_name,
    owner_from_json,
    rng_state_json,
    rng_state_values,
    subgraphs_to_json,
)
from ._disk_cache_key import CACHE_FORMAT, Uncacheable, aotkit_source_hash
from ._disk_cache_stamps import output_stamp_from_json, output_stamp_to_json
from ._disk_cache_symbolic import SymbolicForm
from ._disk_cache_value_table import ValueTable, ValueTableWriter
from ._disk_cache_values import add_node, parse_device, put_meta

log = logging.getLogger(__name__)

# trace: full compilations (fakify + metadata + trace + partition); hit/miss: disk lookups;
# store: entries written; reject: entries found but ignored; uncacheable: compilations
# the key could not describe
cache_counters: collections.Counter[str] = collections.Counter()


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


# ---- graphs ---------------------------------------------------------------------------

_PY_TARGETS: dict[str, Callable[..., Any]] = {
    f"operator.{name}": getattr(operator, name)
    for name in ("getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg",
                 "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "not_")
}
_PY_TARGETS.update({
    f"torch.{name}": getattr(torch, name)
    for name in ("sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_sqrt", "sym_ite")
    if hasattr(torch, name)
})
_PY_TARGETS["math.sqrt"] = math.sqrt
_PY_TARGET_NAMES = {id(v): k for k, v in _PY_TARGETS.items()}
_LAYOUTS = {str(v).removeprefix("torch."): v for v in (torch.strided, torch.sparse_coo)}
_FORMATS = {
    str(v).removeprefix("torch."): v
    for v in (torch.contiguous_format, torch.channels_last, torch.preserve_format,
              torch.channels_last_3d)
}


def _target_to_json(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"op:{target._schema.name}.{target._overloadname}"
    name = _PY_TARGET_NAMES.get(id(target))
    if name is None:
        hop = hop_target_to_json(target)  # See Note [Higher-order operators in the on-disk cache]
        if hop is not None:
            return hop
        raise Uncacheable(f"graph target {target!r} has no cache form")
    return f"py:{name}"


# operators already looked up by this process (``torch.ops`` attribute lookups build op
# packets and overloads; a graph names the same few operators many times)
_OP_TARGETS: dict[str, Any] = {}


def _target_from_json(name: Any) -> Any:
    if not isinstance(name, str):
        raise CacheFormatError("a node target must be a string")
    known = _OP_TARGETS.get(name)
    if known is not None:
        return known
    if name.startswith("py:") and name[3:] in _PY_TARGETS:
        return _PY_TARGETS[name[3:]]
    if name.startswith("hop:"):
        return hop_target_from_json(name)
    if name.startswith("op:") and "::" in name:
        qual, _, overload = name[3:].rpartition(".")
        ns, _, op = qual.partition("::")
        try:
            packet = getattr(getattr(torch.ops, ns), op)
            target = getattr(packet, overload)
        except (AttributeError, RuntimeError) as e:
            raise CacheFormatError(f"unknown operator {name!r}") from e
        if isinstance(target, torch._ops.OpOverload):
            _OP_TARGETS[name] = target
            return target
    raise CacheFormatError(f"unknown node target {name!r}")


def _arg_to_json(a: Any) -> Any:
    if isinstance(a, torch.fx.Node):
        return {"n": a.name}
    if a is None or isinstance(a, (bool, int, str)):
        return a
    if isinstance(a, float):
        return {"f": a.hex()}
    if isinstance(a, (list, tuple)):
        return {"l" if isinstance(a, list) else "t": [_arg_to_json(x) for x in a]}
    if isinstance(a, torch.dtype):
        return {"dtype": dtype_name(a)}
    if isinstance(a, torch.device):
        return {"device": str(a)}
    if isinstance(a, torch.layout) and str(a).removeprefix("torch.") in _LAYOUTS:
        return {"layout": str(a).removeprefix("torch.")}
    if isinstance(a, torch.memory_format) and str(a).removeprefix("torch.") in _FORMATS:
        return {"mf": str(a).removeprefix("torch.")}
    # arguments only higher-order operators take (See Note [Higher-order operators in the
    # on-disk cache])
    if isinstance(a, torch._ops.OpOverload):
        return {"op": _target_to_json(a)}
    if isinstance(a, dict) and all(type(k) is str for k in a):
        return {"d": [[k, _arg_to_json(v)] for k, v in a.items()]}
    raise Uncacheable(f"graph argument {type(a).__name__} has no cache form")


_PLAIN_ARGS = frozenset({bool, int, str})


def _arg_from_json(a: Any, env: dict[str, torch.fx.Node]) -> Any:
    if a is None or type(a) in _PLAIN_ARGS:
        return a
    if type(a) is dict and len(a) == 1:
        (tag, v), = a.items()
        if tag == "n":
            node = env.get(v) if type(v) is str else None
            if node is not None:
                return node
            raise CacheFormatError(f"bad graph argument {a!r}")
        if tag == "f" and isinstance(v, str):
            try:
                return float.fromhex(v)
            except ValueError as e:
                raise CacheFormatError(f"bad float {v!r}") from e
        if tag in ("l", "t") and isinstance(v, list):
            items = [_arg_from_json(x, env) for x in v]
            return items if tag == "l" else tuple(items)
        if tag == "dtype" and isinstance(v, str):
            return dtype_from_name(v)
        if tag == "device" and isinstance(v, str):
            return parse_device(v)
        if tag == "layout" and v in _LAYOUTS:
            return _LAYOUTS[v]
        if tag == "mf" and v in _FORMATS:
            return _FORMATS[v]
        if tag == "op" and isinstance(v, str) and v.startswith("op:"):
            return _target_from_json(v)
        if tag == "d" and isinstance(v, list):
            return _dict_arg_from_json(v, env)
    raise CacheFormatError(f"bad graph argument {a!r}")


def _dict_arg_from_json(items: list[Any], env: dict[str, torch.fx.Node]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, list) or len(item) != 2 or type(item[0]) is not str:
            raise CacheFormatError("bad dict argument")
        if item[0] in out:
            raise CacheFormatError("a dict argument repeats a key")
        out[item[0]] = _arg_from_json(item[1], env)
    return out


def _val_to_json(val: Any, form: SymbolicForm | None) -> Any:
    if isinstance(val, torch.Tensor):
        spec = TensorSpec.of(val)
        if not spec.is_static:
            if form is None:
                raise Uncacheable("a graph value has symbolic sizes")
            # See Note [Dynamic shapes in the on-disk cache]
            sym = form.tensor(val)
            sym["dtype"], sym["device"] = dtype_name(val.dtype), str(val.device)
            return {"ST": sym, "rg": val.requires_grad}
        return {"T": spec.to_json(), "rg": val.requires_grad}
    if isinstance(val, torch.SymInt):
        if form is None:
            raise Uncacheable("a graph value is a SymInt")
        return {"si": form.tree(val)}
    if isinstance(val, (list, tuple)):
        return {"l": [_val_to_json(v, form) for v in val]}
    if val is None or isinstance(val, (bool, int, float)):
        return {"s": None if val is None else type(val).__name__}
    raise Uncacheable(f"a graph value of type {type(val).__name__} has no cache form")


# Note [Static input stamps of cached graphs]
# The partitioners stamp each primal placeholder with ``meta["is_static_input"]`` (whether
# it keeps its address from call to call), and aotkit_inductor reads the stamps to hand
# Inductor torch's ``static_input_idxs`` (See Note [Static inputs of aotkit_inductor's
# graphs] in aotkit_backends). The indices are part of Inductor's FX-graph-cache key, so a
# restored graph carries the stamps: without them a warm start compiles with other
# indices than the cold one and misses the Inductor artifact the entry stored.
_STATIC_INPUT_KEY = "is_static_input"


def graph_to_json(gm: torch.fx.GraphModule, form: SymbolicForm | None = None) -> dict[str, Any]:
    """``gm``'s graph in the structured form of Note [On-disk compile cache]; ``form``
    converts symbolic sizes (See Note [Dynamic shapes in the on-disk cache])."""
    nodes = []
    vals = ValueTableWriter()  # See Note [The value table of a cached graph]
    rng = rng_state_values(gm)  # See Note [RNG state operators in the on-disk cache]
    for node in gm.graph.nodes:
        if node.op not in ("placeholder", "call_function", "output", "get_attr"):
            raise Uncacheable(f"graph node {node.name} is a {node.op}")
        entry: dict[str, Any] = {"op": node.op, "name": node.name}
        if node.op in ("placeholder", "get_attr"):
            entry["target"] = str(node.target)
        elif node.op == "call_function":
            entry["target"] = _target_to_json(node.target)
        entry["args"] = _arg_to_json(tuple(node.args))
        # pairs, not an object: the entry is written with sorted keys, and the order of a
        # node's keyword arguments shows in the restored graph's code
        entry["kwargs"] = [[k, _arg_to_json(v)] for k, v in node.kwargs.items()]
        if node in rng:
            val = node.meta.get("val")
            entry["val"] = vals.ref(
                rng_state_json(val) if rng[node] == "state"
                else {"l": [rng_state_json(val[0]), _val_to_json(val[1], form)]}
            )
        elif node.op not in ("output", "get_attr"):
            entry["val"] = vals.ref(_val_to_json(node.meta.get("val"), form))
        static = node.meta.get(_STATIC_INPUT_KEY)
        if node.op == "placeholder" and isinstance(static, bool):
            entry["static"] = static  # See Note [Static input stamps of cached graphs]
        if node.op == "output":
            output_stamp_to_json(node, entry)
        nodes.append(entry)
    subgraphs = subgraphs_to_json(gm, lambda sub: graph_to_json(sub, form))
    # See Note [Higher-order operators in the on-disk cache]
    out: dict[str, Any] = {"nodes": nodes, "vals": vals.values}
    if subgraphs:
        out["subgraphs"] = subgraphs
    constants = constants_to_json(gm)  # See Note [Tensor constants in the on-disk cache]
    if constants:
        out["constants"] = constants
    return out


def graph_from_json(
    d: Any, fake_mode: FakeTensorMode, symbols: dict[str, Any] | None = None
) -> torch.fx.GraphModule:
    """The GraphModule ``graph_to_json`` described; node values become fakes in
    ``fake_mode``, symbolic sizes are evaluated with ``symbols``."""
    if not isinstance(d, dict) or not isinstance(d.get("nodes"), list):
        raise CacheFormatError("a graph must be an object with a node list")
    graph = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}
    values = ValueTable(d.get("vals"), fake_mode, symbols)
    for entry in d["nodes"]:
        if not isinstance(entry, dict):
            raise CacheFormatError("a node must be an object")
        op, name = entry.get("op"), entry.get("name")
        if not isinstance(name, str) or name in env:
            raise CacheFormatError(f"bad node name {name!r}")
        args = _arg_from_json(entry.get("args"), env)
        kwargs_raw = entry.get("kwargs")
        if not isinstance(args, tuple) or not isinstance(kwargs_raw, list):
            raise CacheFormatError(f"bad arguments of node {name}")
        kwargs = _dict_arg_from_json(kwargs_raw, env)
        if op in ("placeholder", "get_attr"):
            target: Any = entry.get("target")
            if not isinstance(target, str):
                raise CacheFormatError(f"a {op}'s target must be a string")
        elif op == "call_function":
            target = _target_from_json(entry.get("target"))
        elif op == "output":
            target = "output"
        else:
            raise CacheFormatError(f"node op {op!r} is not cached")
        node = add_node(graph, op, target, args, kwargs, name)
        if node.name != name:
            raise CacheFormatError(f"node name {name!r} is not a valid identifier")
        if op == "placeholder":
            values.set_value(node, entry.get("val"))
            static = entry.get("static")
            if static is not None:
                if not isinstance(static, bool):
                    raise CacheFormatError(f"bad static flag of input {name}")
                put_meta(node, _STATIC_INPUT_KEY, static)
        elif op == "output":
            output_stamp_from_json(node, entry)
        elif op != "get_attr":
            values.set_value(node, entry.get("val"))
        env[name] = node
    # See Note [Higher-order operators in the on-disk cache]
    owner = owner_from_json(
        d.get("subgraphs"), lambda sub: graph_from_json(sub, fake_mode, symbols)
    )
    # See Note [Tensor constants in the on-disk cache]
    constants = attach_constants(owner, d.get("constants"), is_attribute_name)
    check_subgraph_reads(graph, owner, constants)
    # no ``graph.lint()``: what it checks holds by construction (every node is this
    # graph's, an argument is read from ``env``, which holds only earlier nodes of this
    # graph, names are checked unique above, ops are the four read here, and
    # ``check_subgraph_reads`` checks every ``get_attr`` target)
    # lazy: FX code is generated on first use (nop reads only the graph)
    with _use_lazy_graph_module(True):
        return _make_graph_module(owner, graph)

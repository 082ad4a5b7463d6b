"""Tensor constants in the on-disk cache: stored with their bytes and a checksum, and
keyed by value where the program holds them.

# Note [Tensor constants in the on-disk cache]
# A traced graph holds a tensor constant as a ``get_attr`` of a plain tensor attribute of
# its module: ``torch.tensor([1.0, 2.0])`` written in the program is traced as
# ``_tensor_constant0`` and ``lift_fresh_copy``, under aot_function and torch.compile
# alike; a dynamo graph can hold one too.
# Stored form: the graph's JSON gains ``"constants": {name: record}``, one per ``get_attr``
# of a tensor, with the record
#     {"dtype": "float32", "size": [4], "stride": [1], "rg": false,
#      "bytes": "<base64 of the elements in memory order>", "sha256": "<of those bytes>",
#      "order": "little"}
# Reading decodes the bytes (never unpickles), checks their length against dtype and
# sizes, their sha256 against the record's and the byte order against this machine's,
# and allocates exactly the stored sizes and strides (dense, non-overlapping: a record
# describing any other layout is refused, so a forged record cannot make a large or
# overlapping allocation). Only plain strided CPU tensors of a dtype the format names are
# stored, up to ``MAX_CONSTANT_BYTES`` per entry; any other constant (a subclass, another
# device or layout, a quantized dtype, a bigger one) leaves the compilation uncached
# (``Uncacheable``). Every restored graph gets its own copy, as a trace makes its own.
# Key: a constant's value must be covered by the key, or a warm start would run a graph
# built with another value. A literal in the program's code is covered by the program's
# fingerprint (its bytecode constants); a tensor the program holds (a dynamo graph's
# tensor attribute, a module's plain tensor attribute reached by the fingerprint) is
# keyed by value with ``tensor_fingerprint``: dtype, sizes, strides, storage offset,
# requires_grad, device and the sha256 of its bytes. A different value misses.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import sys
from typing import Any

import torch
import torch.fx
from aotkit_schemas import CacheFormatError, Uncacheable, dtype_from_name, dtype_name

# per entry graph (subgraphs included), and per keyed tensor: larger constants are not
# stored (an entry is read whole on every warm start) nor hashed on every compilation
MAX_CONSTANT_BYTES = 64 << 20


def _check_storable(t: Any, what: str) -> torch.Tensor:
    if type(t) is not torch.Tensor:
        raise Uncacheable(f"{what} is a {type(t).__name__}")
    if t.layout != torch.strided or t.device.type != "cpu" or t.is_quantized:
        raise Uncacheable(f"{what} is a {t.layout} tensor on {t.device} ({t.dtype})")
    try:
        dtype_name(t.dtype)
    except Exception as e:  # a dtype the cache format does not name
        raise Uncacheable(f"{what} has dtype {t.dtype}") from e
    if t.numel() * t.element_size() > MAX_CONSTANT_BYTES:
        raise Uncacheable(f"{what} is larger than {MAX_CONSTANT_BYTES} bytes")
    return t


def _raw_bytes(t: torch.Tensor) -> bytes:
    """The elements in memory order (strides ignored: the record carries them)."""
    flat = t.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return bytes(flat.view(torch.uint8).numpy().tobytes())


def tensor_fingerprint(t: Any, what: str) -> tuple[Any, ...]:
    """A tensor the program holds, by value: See Note [Tensor constants in the on-disk
    cache]. Raises Uncacheable."""
    _check_storable(t, what)
    return (
        "tensor", dtype_name(t.dtype), tuple(t.shape), tuple(t.stride()), t.storage_offset(),
        t.requires_grad, str(t.device), hashlib.sha256(_raw_bytes(t)).hexdigest(),
    )


def _is_dense(size: list[int], stride: list[int]) -> bool:
    """Whether ``size``/``stride`` lay the elements out densely without overlap."""
    expected = 1
    for st, sz in sorted(zip(stride, size, strict=True)):
        if sz == 1:
            continue
        if st != expected:
            return False
        expected *= sz
    return True


def constant_to_json(t: Any, name: str) -> dict[str, Any]:
    """A tensor constant's record. Raises Uncacheable."""
    t = _check_storable(t, f"tensor constant {name}")
    size, stride = list(t.shape), list(t.stride())
    if not _is_dense(size, stride):
        raise Uncacheable(f"tensor constant {name} is not dense")
    raw = _raw_bytes(t.permute(*_memory_order(stride, size)) if t.dim() else t)
    return {
        "dtype": dtype_name(t.dtype), "size": size, "stride": stride, "rg": t.requires_grad,
        "bytes": base64.b64encode(raw).decode("ascii"),
        "sha256": hashlib.sha256(raw).hexdigest(), "order": sys.byteorder,
    }


def _memory_order(stride: list[int], size: list[int]) -> list[int]:
    """Dimensions from the outermost in memory to the innermost (ties by position)."""
    return sorted(range(len(stride)), key=lambda i: (-stride[i], -size[i], i))


def constant_from_json(d: Any, name: str) -> torch.Tensor:
    """The tensor a record describes, checked. Raises CacheFormatError."""
    if not isinstance(d, dict) or set(d) != {"dtype", "size", "stride", "rg", "bytes", "sha256", "order"}:
        raise CacheFormatError(f"bad tensor constant {name}")
    size, stride, text = d["size"], d["stride"], d["bytes"]
    if not (
        isinstance(size, list) and isinstance(stride, list) and len(size) == len(stride)
        and all(type(x) is int and x >= 0 for x in (*size, *stride))
        and isinstance(text, str) and isinstance(d["sha256"], str) and isinstance(d["rg"], bool)
        and isinstance(d["dtype"], str)
    ):
        raise CacheFormatError(f"bad tensor constant {name}")
    if d["order"] != sys.byteorder:
        raise CacheFormatError(f"tensor constant {name} was stored with another byte order")
    if not _is_dense(size, stride):
        raise CacheFormatError(f"tensor constant {name} is not dense")
    dtype = dtype_from_name(d["dtype"])
    numel = 1
    for s in size:
        numel *= s
    itemsize = torch.empty((), dtype=dtype).element_size()
    if numel * itemsize > MAX_CONSTANT_BYTES:
        raise CacheFormatError(f"tensor constant {name} is too large")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as e:
        raise CacheFormatError(f"tensor constant {name} is not base64") from e
    if len(raw) != numel * itemsize or hashlib.sha256(raw).hexdigest() != d["sha256"]:
        raise CacheFormatError(f"tensor constant {name} does not match its checksum")
    out = torch.empty_strided(size, stride, dtype=dtype)
    if numel:
        data = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype)
        order = _memory_order(stride, size)
        # the bytes are the elements in memory order: the permuted (contiguous) view
        dense = out.permute(*order) if order else out
        dense.copy_(data.reshape([size[i] for i in order]))
    if d["rg"]:
        out.requires_grad_(True)
    return out


def constants_to_json(gm: torch.fx.GraphModule) -> dict[str, Any]:
    """Records of the tensor constants ``gm``'s ``get_attr`` nodes read, by name (the
    subgraphs they read are stored by ``subgraphs_to_json``). Raises Uncacheable."""
    out: dict[str, Any] = {}
    total = 0
    for node in gm.graph.find_nodes(op="get_attr"):
        target = str(node.target)
        if target in out:
            continue
        value = getattr(gm, target, None) if "." not in target else None
        if isinstance(value, torch.Tensor):
            out[target] = constant_to_json(value, target)
            total += value.numel() * value.element_size()
    if total > MAX_CONSTANT_BYTES:
        raise Uncacheable(f"tensor constants larger than {MAX_CONSTANT_BYTES} bytes")
    return out


def attach_constants(owner: torch.nn.Module, d: Any, is_name: Any) -> frozenset[str]:
    """Set the stored constants on ``owner`` (the module a rebuilt graph's ``get_attr``
    nodes read); their names. Raises CacheFormatError."""
    if d is None:
        return frozenset()
    if not isinstance(d, dict) or not d:
        raise CacheFormatError("tensor constants must be a non-empty object")
    for name, record in d.items():
        if not isinstance(name, str) or not is_name(name) or hasattr(owner, name):
            raise CacheFormatError(f"bad tensor constant name {name!r}")
        setattr(owner, name, constant_from_json(record, name))
    return frozenset(d)

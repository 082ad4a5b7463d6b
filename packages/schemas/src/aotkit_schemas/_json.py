"""Versioned JSON forms of the metadata classes, for the on-disk compile cache.

# Note [Cache JSON format]
# The compile cache (aotkit_capture._cache) never unpickles anything: metadata is stored
# as plain JSON built from the dataclasses field by field, and read back through the
# dataclasses' own constructors, so that every ``__post_init__`` invariant is checked
# again on load. Enums are stored by name, types and dtypes by a name looked up in a
# closed table (an unknown name raises ``CacheFormatError``, never imports a module).
# Fake tensors in the metadata (``traced_tangents``) become ``TensorSpec``s: shape, stride,
# dtype and device, all the runtime reads of them. ``JSON_SCHEMA_VERSION`` changes with
# any change to these forms; a reader rejects any other version.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from ._alias_info import InputAliasInfo, OutputAliasInfo, OutputType
from ._json_basics import CacheFormatError, dtype_from_name, dtype_name
from ._view_and_mutation_meta import ViewAndMutationMeta
from ._view_chains_json import view_chain_from_json, view_chain_to_json

JSON_SCHEMA_VERSION = 2
_T = TypeVar("_T")
_CACHE_KEY_ATTR = "_aotkit_cache_key"
_CACHE_SETTINGS_ATTR = "_aotkit_cache_settings"


@dataclass(frozen=True)
class TensorSpec:
    """Shape, stride, dtype and device of a tensor (a symbolic size is its string)."""

    shape: tuple[int | str, ...]
    stride: tuple[int | str, ...]
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorSpec:
        def dim(d: Any) -> int | str:
            return d if type(d) is int else str(d)

        return cls(
            tuple(dim(d) for d in t.shape), tuple(dim(d) for d in t.stride()), t.dtype, t.device
        )

    @property
    def is_static(self) -> bool:
        return all(type(d) is int for d in (*self.shape, *self.stride))

    def to_json(self) -> dict[str, Any]:
        return {
            "shape": list(self.shape),
            "stride": list(self.stride),
            "dtype": dtype_name(self.dtype),
            "device": str(self.device),
        }

    @classmethod
    def from_json(cls, d: Any) -> TensorSpec:
        obj = _dict(d, "tensor spec")
        return cls(
            tuple(_dim(x) for x in _list(obj.get("shape"), "shape")),
            tuple(_dim(x) for x in _list(obj.get("stride"), "stride")),
            dtype_from_name(_str(obj.get("dtype"), "dtype")),
            torch.device(_str(obj.get("device"), "device")),
        )


# ---- names of dtypes and of the few output types the metadata records -----------------

_RAW_TYPES: dict[str, type] = {
    "Tensor": torch.Tensor,
    "Parameter": torch.nn.Parameter,
    "int": int,
    "float": float,
    "bool": bool,
    "SymInt": torch.SymInt,
    "SymFloat": torch.SymFloat,
    "SymBool": torch.SymBool,
    "NoneType": type(None),
}
_RAW_TYPE_NAMES = {v: k for k, v in _RAW_TYPES.items()}


def raw_type_serializable(t: type) -> bool:
    return t in _RAW_TYPE_NAMES


# ---- the metadata -----------------------------------------------------------------------

_INPUT_FIELDS = (
    "is_leaf",
    "mutates_data",
    "mutates_metadata",
    "mutations_hidden_from_autograd",
    "mutations_under_no_grad_or_inference_mode",
    "mutates_storage_metadata",
    "requires_grad",
    "keep_input_mutations",
)


def input_info_to_json(info: InputAliasInfo) -> dict[str, Any]:
    out: dict[str, Any] = {f: getattr(info, f) for f in _INPUT_FIELDS}
    if info.view_meta_sequence is not None:  # See Note [View chains in the cache JSON format]
        out["view_chain"] = view_chain_to_json(info.view_meta_sequence)
    return out


def input_info_from_json(d: Any) -> InputAliasInfo:
    obj = _dict(d, "input info")
    chain = obj.get("view_chain")
    return _construct(
        InputAliasInfo,
        **{f: _bool(obj.get(f), f) for f in _INPUT_FIELDS},
        view_meta_sequence=None if chain is None else view_chain_from_json(chain),
    )


def output_info_to_json(info: OutputAliasInfo) -> dict[str, Any]:
    if info.raw_type not in _RAW_TYPE_NAMES:
        raise CacheFormatError(f"output type {info.raw_type!r} has no cache form")
    return {
        "output_type": info.output_type.name,
        "raw_type": _RAW_TYPE_NAMES[info.raw_type],
        "base_idx": info.base_idx,
        "dynamic_dims": None if info.dynamic_dims is None else sorted(info.dynamic_dims),
        "requires_grad": info.requires_grad,
        "requires_grad_for_backward": info.requires_grad_for_backward,
        "grad_view_of_no_grad_view": info.grad_view_of_no_grad_view,
        "fresh_leaf": info.fresh_leaf,
        # See Note [View chains in the cache JSON format]: views of inputs only
        "view_chain": None
        if info.view_meta_sequence is None or info.output_type is not OutputType.alias_of_input
        else view_chain_to_json(info.view_meta_sequence),
    }


def output_info_from_json(d: Any) -> OutputAliasInfo:
    obj = _dict(d, "output info")
    kind = _str(obj.get("output_type"), "output_type")
    raw = _str(obj.get("raw_type"), "raw_type")
    if kind not in OutputType.__members__ or raw not in _RAW_TYPES:
        raise CacheFormatError(f"unknown output kind {kind!r} or type {raw!r}")
    base = obj.get("base_idx")
    dims = obj.get("dynamic_dims")
    chain = obj.get("view_chain")
    if chain is not None and kind != OutputType.alias_of_input.name:
        raise CacheFormatError("a view chain on an output that views no input")
    return _construct(
        OutputAliasInfo,
        output_type=OutputType[kind],
        raw_type=_RAW_TYPES[raw],
        base_idx=None if base is None else _int(base, "base_idx"),
        dynamic_dims=None if dims is None else frozenset(_int(x, "dim") for x in _list(dims, "dims")),
        requires_grad=_bool(obj.get("requires_grad"), "requires_grad"),
        requires_grad_for_backward=_bool(
            obj.get("requires_grad_for_backward"), "requires_grad_for_backward"
        ),
        grad_view_of_no_grad_view=_bool(
            obj.get("grad_view_of_no_grad_view", False), "grad_view_of_no_grad_view"
        ),
        fresh_leaf=_bool(obj.get("fresh_leaf", False), "fresh_leaf"),
        view_meta_sequence=None if chain is None else view_chain_from_json(chain),
    )


def meta_to_json(meta: ViewAndMutationMeta) -> dict[str, Any]:
    """``meta`` as JSON data. See Note [Cache JSON format]."""
    # functionalization's recorded view chains of inputs and of outputs that view inputs
    # are stored (See Note [View chains in the cache JSON format]). Chains of views of
    # intermediates are left out of the entry: without them the runtime replays the graph
    # value's own view (See Note [View replay of intermediate aliases] in aotkit_analysis),
    # correct for a base laid out as the graph's.
    tangents = []
    for t in meta.traced_tangents:
        if isinstance(t, torch.Tensor):
            tangents.append(TensorSpec.of(t).to_json())
        elif isinstance(t, TensorSpec):
            tangents.append(t.to_json())
        else:
            raise CacheFormatError(f"traced tangent {type(t).__name__} has no cache form")
    return {
        "version": JSON_SCHEMA_VERSION,
        "input_info": [input_info_to_json(i) for i in meta.input_info],
        "output_info": [output_info_to_json(o) for o in meta.output_info],
        "num_intermediate_bases": meta.num_intermediate_bases,
        "keep_input_mutations": meta.keep_input_mutations,
        "traced_tangents": tangents,
        "is_train": meta.is_train,
        "grad_enabled_mutation": meta.grad_enabled_mutation,
        "static_input_indices": list(meta.static_input_indices),
        "native_functionalization_ok": meta.native_functionalization_ok,
        "bw_donated_idxs": None if meta.bw_donated_idxs is None else list(meta.bw_donated_idxs),
    }


def meta_from_json(d: Any) -> ViewAndMutationMeta:
    """The ViewAndMutationMeta ``meta_to_json`` wrote; ``traced_tangents`` are TensorSpecs.

    Raises CacheFormatError for anything else (See Note [Cache JSON format]).
    """
    obj = _dict(d, "metadata")
    if obj.get("version") != JSON_SCHEMA_VERSION:
        raise CacheFormatError(f"metadata version {obj.get('version')!r}, expected {JSON_SCHEMA_VERSION}")
    gem = obj.get("grad_enabled_mutation")
    donated = obj.get("bw_donated_idxs")
    return _construct(
        ViewAndMutationMeta,
        input_info=[input_info_from_json(x) for x in _list(obj.get("input_info"), "input_info")],
        output_info=[output_info_from_json(x) for x in _list(obj.get("output_info"), "output_info")],
        num_intermediate_bases=_int(obj.get("num_intermediate_bases"), "num_intermediate_bases"),
        keep_input_mutations=_bool(obj.get("keep_input_mutations"), "keep_input_mutations"),
        traced_tangents=[
            TensorSpec.from_json(x) for x in _list(obj.get("traced_tangents"), "traced_tangents")
        ],
        is_train=_bool(obj.get("is_train"), "is_train"),
        grad_enabled_mutation=None if gem is None else _bool(gem, "grad_enabled_mutation"),
        static_input_indices=tuple(
            _int(x, "index") for x in _list(obj.get("static_input_indices"), "static_input_indices")
        ),
        native_functionalization_ok=_bool(
            obj.get("native_functionalization_ok"), "native_functionalization_ok"
        ),
        bw_donated_idxs=None
        if donated is None
        else [_int(x, "index") for x in _list(donated, "bw_donated_idxs")],
    )


# ---- compilers' cache keys ---------------------------------------------------------------

# Note [Compiler cache keys]
# A compiled entry can be reused from disk only if every callable that shaped it (the
# forward, backward and inference compilers, the partitioner) says what it does with a
# stable string: ``mark_cache_key(fn, "mycompiler/3")``. The string must change whenever
# the callable's output for the same graph would. A callable without a key makes its
# compilations uncacheable (aot_function's arbitrary user compilers stay off the disk).
# A callable whose output also depends on process-wide settings (aotkit_inductor's
# partitioner runs Inductor's joint-graph passes, which read ``torch._inductor.config``)
# declares them with ``settings``: a function of no arguments returning a string that
# changes whenever those settings would change the callable's output. It is read every
# time a key is made (it must be cheap); ``compiler_cache_key`` returns the stable key and
# that string together. A ``settings`` that raises means "cannot describe the settings
# now": the compilation is not cached.


def mark_cache_key(
    fn: Callable[..., Any], key: str, *, settings: Callable[[], str] | None = None
) -> None:
    """Declare ``fn``'s stable cache key and, optionally, a reader of the process-wide
    settings its output also depends on. See Note [Compiler cache keys]."""
    setattr(fn, _CACHE_KEY_ATTR, key)
    setattr(fn, _CACHE_SETTINGS_ATTR, settings)


def compiler_cache_key(fn: Any) -> str | None:
    """``fn``'s cache key (with its settings, See Note [Compiler cache keys]), looking
    through ``functools.wraps`` wrappers; None if it has none."""
    seen = 0
    while fn is not None and seen < 8:
        key = getattr(fn, _CACHE_KEY_ATTR, None)
        if isinstance(key, str):
            settings = getattr(fn, _CACHE_SETTINGS_ATTR, None)
            # See Note [Compiler cache keys]: a settings reader that raises propagates
            return key if settings is None else f"{key}|{settings()}"
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    return None


# ---- checked readers ----------------------------------------------------------------------


def _construct(cls: Callable[..., _T], **kwargs: Any) -> _T:
    try:
        return cls(**kwargs)
    except (AssertionError, ValueError, TypeError) as e:
        raise CacheFormatError(f"invalid {getattr(cls, '__name__', cls)}: {e}") from e


def _dict(x: Any, what: str) -> dict[str, Any]:
    if not isinstance(x, dict):
        raise CacheFormatError(f"{what}: expected an object")
    return x


def _list(x: Any, what: str) -> Sequence[Any]:
    if not isinstance(x, list):
        raise CacheFormatError(f"{what}: expected a list")
    return x


def _str(x: Any, what: str) -> str:
    if not isinstance(x, str):
        raise CacheFormatError(f"{what}: expected a string")
    return x


def _bool(x: Any, what: str) -> bool:
    if not isinstance(x, bool):
        raise CacheFormatError(f"{what}: expected a bool")
    return x


def _int(x: Any, what: str) -> int:
    if type(x) is not int:
        raise CacheFormatError(f"{what}: expected an int")
    return x


def _dim(x: Any) -> int | str:
    if type(x) is int or isinstance(x, str):
        return x
    raise CacheFormatError("a size must be an int or a symbol")

"""One compiled entry as the on-disk cache stores it (See Note [On-disk compile cache])."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch.fx
from aotkit_runtime import TangentLayout
from aotkit_schemas import (
    AOTConfig,
    CacheFormatError,
    CacheSidecar,
    PartitionResult,
    TensorSpec,
    Uncacheable,
    ViewAndMutationMeta,
    graph_outputs,
    is_sym_node,
    meta_from_json,
    meta_to_json,
)
from torch._guards import detect_fake_mode

from aotkit_cache._files import cache_counters
from aotkit_cache.key._key import entry_key
from aotkit_cache.key._symbolic import SymbolicForm

from ._artifacts import FIELD as ARTIFACT_KEYS
from ._artifacts import artifact_keys_json, compiled_graphs
from ._fake_mode import FakeModeLike
from ._graph import graph_from_json, graph_to_json
from ._hops import tokens_from_json, tokens_to_json
from ._values import PY_SCALAR, LazyValueMeta

if TYPE_CHECKING:
    from aotkit_capture import CompiledArtifacts

log = logging.getLogger(__name__)


def cache_key_or_none(identity: str | None, flat_args: Sequence[Any], cfg: AOTConfig) -> str | None:
    """The entry's key, or None when there is no identity or the key cannot describe the
    compilation (logged at DEBUG; see Note [On-disk cache keys])."""
    if identity is None:
        return None
    try:
        return entry_key(identity, flat_args, cfg)
    except Uncacheable as e:
        cache_counters["uncacheable"] += 1
        log.debug("aotkit cache: not caching this compilation: %s", e)
        return None
    except Exception as e:  # never an error: See Note [On-disk compile cache]
        cache_counters["uncacheable"] += 1
        log.warning("aotkit cache: could not key this compilation (%s: %s); not caching it",
                    type(e).__name__, e)
        return None


def entry_payload(
    artifacts: CompiledArtifacts, sidecar: CacheSidecar | None, symbolic: bool = False
) -> dict[str, Any] | None:
    """The JSON payload of a fresh compilation, or None when part of it has no cache form.
    ``symbolic``: traced with symbolic sizes; the payload then carries the entry's shape
    facts (See Note [Dynamic shapes in the on-disk cache])."""
    try:
        if artifacts.subclass_layer:
            raise Uncacheable("tensor subclass inputs or outputs")
        if artifacts.relative_offsets is None:
            raise Uncacheable("the output offsets were not recorded")
        _check_tangent_layouts_round_trip(artifacts.meta.traced_tangents)
        payload: dict[str, Any] = {
            "meta": meta_to_json(artifacts.meta),
            "layout_key": repr(artifacts.layout.key),
            "mutated_user_inputs": None
            if artifacts.mutated_user_inputs is None
            else list(artifacts.mutated_user_inputs),
            "relative": artifacts.relative_offsets,
            "stale_tangents": [list(t) for t in artifacts.stale_tangents],
            "single_pass": artifacts.single_pass,
            "native_functionalization": artifacts.native_functionalization,
            "backward_mutated_inputs": list(artifacts.backward_mutated_inputs),
            # See Note [Programs whose backward is not the forward's derivative]
            "higher_order_blocked": artifacts.higher_order_blocked,
            "sidecar": None if sidecar is None else sidecar.to_json(),
            # See Note [Effect tokens in the on-disk cache]
            "tokens": tokens_to_json(artifacts.meta),
            # See Note [Inputs whose requires_grad the function changes]
            "requires_grad_changes": [list(c) for c in artifacts.requires_grad_changes],
        }
        form = _symbolic_form(artifacts) if symbolic else None
        if form is not None:
            payload["shape"] = form.facts(_placeholder_values(artifacts))
        # See Note [Compiled-artifact keys] in aotkit_schemas
        payload[ARTIFACT_KEYS] = artifact_keys_json(compiled_graphs(artifacts))
        if artifacts.partition is not None:
            payload["fw"] = graph_to_json(artifacts.partition.fw_module, form)
            payload["bw"] = graph_to_json(artifacts.partition.bw_module, form)
        elif artifacts.inference_module is not None:
            payload["inference"] = graph_to_json(artifacts.inference_module, form)
        else:
            raise Uncacheable("no graph to store")
    except (Uncacheable, CacheFormatError) as e:
        cache_counters["uncacheable"] += 1
        log.debug("aotkit cache: not storing this compilation: %s", e)
        return None
    except Exception as e:  # never an error: See Note [On-disk compile cache]
        cache_counters["uncacheable"] += 1
        log.warning("aotkit cache: could not store this compilation (%s: %s)",
                    type(e).__name__, e)
        return None
    return payload


def _check_tangent_layouts_round_trip(traced_tangents: Sequence[Any]) -> None:
    """The backward is traced for each tangent's layout, and a restored entry restrides
    runtime tangents to the layout its stored TensorSpecs give (See Note [Tangent strides
    follow the outputs] in aotkit_analysis). A layout the spec cannot carry (a memory format
    other than contiguous behind symbolic strides, a subclass's inner layout) would be
    restored as another one, feeding the backward tangents it was not compiled for: such
    entries are not stored."""
    for t in traced_tangents:
        if not isinstance(t, torch.Tensor):
            continue
        if TangentLayout.of(t) != TangentLayout.of(TensorSpec.of(t)):
            raise Uncacheable("a tangent layout the cache format cannot carry")


def _placeholder_values(artifacts: CompiledArtifacts) -> list[Any]:
    graph = artifacts.partition.fw_module if artifacts.partition else artifacts.inference_module
    if graph is None:
        raise Uncacheable("no graph to store")
    values = [n.meta.get("val") for n in graph.graph.find_nodes(op="placeholder")]
    if len(values) != len(artifacts.meta.input_info):
        raise Uncacheable("the graph's inputs are not the compiled inputs")
    return values


def _symbolic_form(artifacts: CompiledArtifacts) -> SymbolicForm:
    if not artifacts.layout.is_trivial:
        raise Uncacheable("aliased or duplicated inputs under dynamic shapes")
    mode = detect_fake_mode(_placeholder_values(artifacts))
    if mode is None or mode.shape_env is None:
        raise Uncacheable("a dynamic-shape graph without a ShapeEnv")
    return SymbolicForm(mode.shape_env)


@dataclass(frozen=True)
class CachedEntry:
    """A payload read back and checked; graphs rebuilt with fake values."""

    meta: ViewAndMutationMeta
    layout_key: str
    mutated_user_inputs: tuple[int, ...] | None
    relative: list[int | None]
    stale_tangents: tuple[tuple[int, str, str], ...]
    single_pass: bool
    native_functionalization: bool
    backward_mutated_inputs: tuple[int, ...]
    # See Note [Programs whose backward is not the forward's derivative]
    higher_order_blocked: str | None
    partition: PartitionResult | None
    inference: torch.fx.GraphModule | None


def read_entry(
    payload: dict[str, Any], fake_mode: FakeModeLike, env: dict[str, Any] | None = None
) -> CachedEntry:
    """Check and rebuild a payload; raises CacheFormatError (or the constructors' errors).
    ``env``: the symbols of a symbolic entry (See Note [Dynamic shapes in the on-disk
    cache])."""
    meta = tokens_from_json(meta_from_json(payload.get("meta")), payload.get("tokens"), fake_mode)
    layout_key = payload.get("layout_key")
    users = payload.get("mutated_user_inputs")
    relative = payload.get("relative")
    stale = payload.get("stale_tangents")
    single = payload.get("single_pass")
    native = payload.get("native_functionalization")
    bw_mutated = payload.get("backward_mutated_inputs")
    # an entry stored without the record is restored blocked
    blocked = payload.get("higher_order_blocked", "the cache entry does not record it")
    if blocked is not None and not isinstance(blocked, str):
        raise CacheFormatError("bad higher-order record")
    if not isinstance(layout_key, str) or not isinstance(single, bool):
        raise CacheFormatError("bad layout key or single-pass flag")
    if not isinstance(native, bool) or not (
        isinstance(bw_mutated, list) and all(type(i) is int for i in bw_mutated)
    ):
        raise CacheFormatError("bad path flag or backward-mutated input list")
    if users is not None and not (isinstance(users, list) and all(type(u) is int for u in users)):
        raise CacheFormatError("bad mutated-input list")
    if not isinstance(relative, list) or not all(r is None or type(r) is int for r in relative):
        raise CacheFormatError("bad output offsets")
    if len(relative) != meta.num_outputs:
        raise CacheFormatError("output offsets do not match the outputs")
    # (tangent, exception class, message); See Note [Deferred backward errors]
    if not isinstance(stale, list) or not all(
        isinstance(t, list) and len(t) == 3 and type(t[0]) is int
        and isinstance(t[1], str) and isinstance(t[2], str)
        for t in stale
    ):
        raise CacheFormatError("bad stale-tangent list")
    partition = None
    inference = None
    if meta.is_train:
        fw = graph_from_json(payload.get("fw"), fake_mode, env)
        bw = graph_from_json(payload.get("bw"), fake_mode, env)
        partition = _partition(fw, bw, meta.num_forward_returns + len(meta.tokens))
    else:
        inference = graph_from_json(payload.get("inference"), fake_mode, env)
    return CachedEntry(
        meta=meta,
        layout_key=layout_key,
        mutated_user_inputs=None if users is None else tuple(users),
        relative=list(relative),
        stale_tangents=tuple((t[0], t[1], t[2]) for t in stale),
        single_pass=single,
        native_functionalization=native,
        backward_mutated_inputs=tuple(bw_mutated),
        higher_order_blocked=blocked,
        partition=partition,
        inference=inference,
    )


def _partition(
    fw: torch.fx.GraphModule, bw: torch.fx.GraphModule, num_fwd_outputs: int
) -> PartitionResult:
    """``PartitionResult.from_modules``, telling saved tensors from saved scalars by the
    recipes of restored values instead of building them (See Note [Lazy node values of
    restored graphs])."""
    saved = graph_outputs(fw)[num_fwd_outputs:]
    tensors: list[str] = []
    symints: list[str] = []
    for value in saved:
        if not isinstance(value, torch.fx.Node):
            raise CacheFormatError(f"saved value {value!r} is not a graph node")
        if isinstance(value.meta, LazyValueMeta) and not value.meta.is_built:
            # the cold trace's is_sym_node(value) (its value was an int, float or bool)
            scalar = value.meta.recipe is PY_SCALAR
        else:
            scalar = is_sym_node(value)
        if scalar:
            symints.append(value.name)
        elif symints:
            raise CacheFormatError("a saved tensor follows a saved scalar")
        else:
            tensors.append(value.name)
    return PartitionResult(
        fw_module=fw,
        bw_module=bw,
        num_fwd_outputs=num_fwd_outputs,
        saved_tensor_names=tuple(tensors),
        saved_symint_names=tuple(symints),
    )

"""``compile_flat``: the compile pipeline behind the on-disk cache.

A lookup before tracing, a restore that skips fakification, the metadata pass, the joint
trace and the partitioner, and a store after a fresh compilation. See Note [On-disk
compile cache] in ``_disk_cache``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx
from aotkit_analysis import compute_input_layout
from aotkit_schemas import AOTConfig, CacheFormatError
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode

from ._batch_norm_cma import cumulative_batch_norm
from ._compile import CompiledArtifacts, Runner, compile_traced, finish
from ._compile import _fakify as fakify_compiled
from ._compile_lock import COMPILE_LOCK
from ._compiled_calls import compiling_under_fakes, inference_call, training_call
from ._disk_cache import cache_counters, reject_payload, variants
from ._disk_cache import load as cache_load
from ._disk_cache import store as cache_store
from ._disk_cache_artifacts import apply_artifact_keys, compiled_graphs, keep_artifact_keys_current
from ._disk_cache_entry import (
    CacheSidecar,
    cache_key_or_none,
    entry_payload,
    read_entry,
)
from ._disk_cache_key import aotkit_source_hash, symbolic_kind

# imported with the cache, not at the first key (a warm start's first call paid for it)
from ._disk_cache_ops import unkeyable_operators
from ._disk_cache_reach import (
    keep_called_operators,
    recording_called_operators,
    stored_refusal,
)
from ._disk_cache_symbolic import bind_symbols, check_facts, install_guards, restored_guard
from ._fakify import construct_fake_mode
from ._gc import CollectionPause, deferred_full_collections
from ._generators import check_no_created_generators, recording_generators
from ._input_rebinds import InputRebindError, checking_input_rebinds
from ._logs import log_restored_partition
from ._paths import notify_compiled
from ._requires_grad_changes import (
    changes_from_json,
    compile_following_flips,
    flipping_runner,
    temporarily_flipped,
)
from ._restore_fake_mode import DeferredFakeMode, FakeModeLike
from ._restored_fakes import RestoredFakes
from ._rng_states import generator_state_kept
from ._trace import FlatFn
from ._trace_scope import new_compilation

log = logging.getLogger(__name__)

# The hash of aotkit's sources (part of every key) describes the sources the process
# started with: taken when the cache is imported, with aotkit's modules, rather than at
# the first key, where it cost a warm start's first call about 0.6 ms of file stats.
aotkit_source_hash()


def compile_flat(
    flat_fn: FlatFn,
    flat_args: Sequence[Any],
    cfg: AOTConfig,
    *,
    cache_identity: str | None = None,
    cache_sidecar: CacheSidecar | None = None,
    before_trace: Callable[[], None] | None = None,
) -> tuple[Runner, CompiledArtifacts]:
    """Trace, partition and compile ``flat_fn`` for inputs shaped like ``flat_args``.

    Returns ``runner(flat_args) -> flat graph outputs`` (user outputs only).
    ``cache_identity``: a fingerprint of the program ``flat_fn`` runs
    (``program_fingerprint``) to look the compilation up in, and store it to, the on-disk
    cache; None leaves the disk alone. ``cache_sidecar``: frontend state the trace fills in
    (the output layout), stored with the entry and restored on a hit. See Note [On-disk
    compile cache]. ``before_trace``: called when the compilation is not restored from the
    disk (its lookup missed, or no ``cache_identity``), before the inputs are fakified and
    ``flat_fn`` is traced; the key must already cover what it does (aot_module_simplified's
    late pre-grad passes: See Note [Pre-grad passes after the cache lookup] in
    aotkit_frontends).
    """
    # See Note [Concurrent first calls]; See Note [Full collections deferred during a compile]
    # See Note [Generator states the function sets]
    with COMPILE_LOCK, deferred_full_collections(), generator_state_kept(flat_args):
        return _compile_flat(flat_fn, flat_args, cfg, cache_identity, cache_sidecar, before_trace)


def _compile_flat(
    flat_fn: FlatFn,
    flat_args: Sequence[Any],
    cfg: AOTConfig,
    cache_identity: str | None,
    cache_sidecar: CacheSidecar | None,
    before_trace: Callable[[], None] | None,
) -> tuple[Runner, CompiledArtifacts]:
    key = cache_key_or_none(cache_identity, flat_args, cfg)
    symbolic = key is not None and symbolic_kind(flat_args, cfg) is not None
    # See Note [Refusing only the compilations that reach an unkeyable kernel]
    unkeyable = unkeyable_operators() if key is not None else {}
    if key is not None:
        # See Note [Collections paused while a cache entry is restored]
        with CollectionPause() as pause:
            restored = _lookup(key, symbolic, flat_args, cfg, cache_sidecar, unkeyable, pause)
        if restored is not None:
            cache_counters["hit"] += 1
            return restored
    if before_trace is not None:
        before_trace()
    cache_counters["trace"] += 1
    # See Note [BatchNorm's cumulative moving average]; See Note [Generators created
    # while tracing]: checked before the store below
    # See Note [Contexts that span the backward trace]
    def compile_one(changes: Mapping[int, bool], watch_all: bool) -> tuple[Runner, CompiledArtifacts]:
        # See Note [Input changes no graph records]
        traced = cumulative_batch_norm(checking_input_rebinds(flat_fn, changes, watch_all))
        return compile_traced(traced, flat_args, cfg)

    with (
        recording_generators() as created,
        new_compilation(),
        recording_called_operators(bool(unkeyable)) as called,
    ):
        # See Note [Inputs whose requires_grad the function changes]
        runner, artifacts, changes = compile_following_flips(compile_one, flat_args)
        artifacts.requires_grad_changes = tuple(sorted(changes.items()))
    check_no_created_generators(created, (
        artifacts.fw_module, artifacts.bw_module, artifacts.inference_module,
        artifacts.joint_module,
    ))
    if key is not None:
        payload = entry_payload(artifacts, cache_sidecar, symbolic)
        if payload is not None and unkeyable:
            payload = keep_called_operators(payload, called, unkeyable)
        if payload is not None:
            name = key
            if "shape" in payload:  # See Note [Dynamic shapes in the on-disk cache]
                facts = json.dumps(payload["shape"], sort_keys=True).encode()
                name = f"{key}-{hashlib.sha256(facts).hexdigest()[:16]}"
            cache_store(name, payload)
            keep_artifact_keys_current(name, compiled_graphs(artifacts))
    return runner, artifacts


def _lookup(
    key: str,
    symbolic: bool,
    flat_args: Sequence[Any],
    cfg: AOTConfig,
    sidecar: CacheSidecar | None,
    unkeyable: dict[str, str],
    pause: CollectionPause,
) -> tuple[Runner, CompiledArtifacts] | None:
    if not symbolic:
        payload = cache_load(key)
        if payload is None or _refused(payload, unkeyable):
            return None
        return _restore(key, payload, flat_args, cfg, sidecar, pause)
    # See Note [Dynamic shapes in the on-disk cache]: the newest entry whose facts hold
    names = variants(key)
    if not names:
        cache_counters["miss"] += 1
    for name in names:
        payload = cache_load(name)
        if payload is None or _refused(payload, unkeyable):
            continue
        try:
            applies = "shape" in payload and check_facts(payload["shape"], flat_args)
        except CacheFormatError as e:
            reject_payload(name, str(e))
            continue
        if not applies:
            cache_counters["guard_fail"] += 1
            continue
        restored = _restore(name, payload, flat_args, cfg, sidecar, pause)
        if restored is not None:
            return restored
    return None


def _refused(payload: dict[str, Any], unkeyable: dict[str, str]) -> bool:
    """Whether the entry's trace may reach an unkeyable kernel (logged, counted). See
    Note [Refusing only the compilations that reach an unkeyable kernel]."""
    if not unkeyable:
        return False
    reason = stored_refusal(payload, unkeyable)
    if reason is None:
        return False
    cache_counters["unkeyable_reach"] += 1
    log.debug("aotkit cache: not using this entry: %s", reason)
    return True


def _restore(
    key: str,
    payload: dict[str, Any],
    flat_args: Sequence[Any],
    cfg: AOTConfig,
    sidecar: CacheSidecar | None,
    pause: CollectionPause,
) -> tuple[Runner, CompiledArtifacts] | None:
    """The compiled entry for a checksummed payload, or None (logged) when it does not
    check out against the inputs. See Note [On-disk compile cache]; an entry whose
    function changes inputs' ``requires_grad`` is restored with the new flags and flips
    them at run time (See Note [Inputs whose requires_grad the function changes])."""
    try:
        changes = changes_from_json(payload.get("requires_grad_changes", []))
    except CacheFormatError as e:
        reject_payload(key, str(e))
        return None
    if not changes:
        return _restore_entry(key, payload, flat_args, cfg, sidecar, pause)
    try:
        with temporarily_flipped(flat_args, changes):
            restored = _restore_entry(key, payload, flat_args, cfg, sidecar, pause)
    except (RuntimeError, InputRebindError):  # eager's error for this input: the trace raises it
        return None
    if restored is None:
        return None
    runner, artifacts = restored
    artifacts.requires_grad_changes = tuple(sorted(changes.items()))
    return flipping_runner(runner, changes), artifacts


def _restore_entry(
    key: str,
    payload: dict[str, Any],
    flat_args: Sequence[Any],
    cfg: AOTConfig,
    sidecar: CacheSidecar | None,
    pause: CollectionPause,
) -> tuple[Runner, CompiledArtifacts] | None:
    symbolic = "shape" in payload
    fake_mode = detect_fake_mode(list(flat_args))
    own_mode = fake_mode is None
    fake: Sequence[Any]
    try:
        env = None
        if symbolic:
            fake_mode, fake, env = _symbolic_inputs(payload["shape"], flat_args, cfg)
        # See Note [A restored entry's fake mode] and Note [A restored entry's fake mode
        # made when first needed]
        restored_mode = fake_mode or DeferredFakeMode()
        entry = read_entry(payload, restored_mode, env)
        graphs = compiled_graphs(entry)
        apply_artifact_keys(payload, graphs)  # See Note [Compiled-artifact keys]
        keep_artifact_keys_current(key, graphs)
        users = entry.mutated_user_inputs
        layout = (
            compute_input_layout(flat_args)
            if users is None
            else compute_input_layout(flat_args, frozenset(users).__contains__)
        )
        if repr(layout.key) != entry.layout_key:
            raise CacheFormatError("the input layout differs from the cached one")
        graph = entry.partition.fw_module if entry.partition else entry.inference
        assert graph is not None
        meta = entry.meta
        if symbolic:
            _use_fakes(graph, fake, meta)
        else:
            restored = _compiled_fakes(graph, meta, layout.num_compiled_inputs, restored_mode)
            restored.check_inputs(flat_args, layout)
            fake = restored
        if sidecar is not None:
            sidecar.load_json(payload.get("sidecar"))
        artifacts = CompiledArtifacts(
            meta=meta,
            layout=layout,
            single_pass=entry.single_pass,
            native_functionalization=entry.native_functionalization,
            from_cache=True,
            mutated_user_inputs=users,
            relative_offsets=entry.relative,
            stale_tangents=entry.stale_tangents,
            backward_mutated_inputs=entry.backward_mutated_inputs,
        )
        if symbolic and own_mode:
            artifacts.guard = restored_guard(payload["shape"], layout)
        # before any compiler runs: See Note [Collections paused while a cache entry is
        # restored]
        pause.resume()
        if entry.partition is not None:
            # a restored compilation logs torch's metadata line as a traced one does
            # (See Note [torch's aot_graphs metadata line])
            log_restored_partition(entry.partition.fw_module, entry.partition.bw_module, meta, cfg.aot_id)
            artifacts.partition = entry.partition
            artifacts.fw_module = entry.partition.fw_module
            artifacts.bw_module = entry.partition.bw_module
            with compiling_under_fakes(fake, cfg.fw_compiler):
                call = training_call(
                    entry.partition, fake, meta, cfg, entry.stale_tangents,
                    entry.backward_mutated_inputs,
                )
        else:
            artifacts.inference_module = entry.inference
            with compiling_under_fakes(fake, cfg.inference_compiler or cfg.fw_compiler):
                call = inference_call(graph, fake, meta, cfg)
    except Exception as e:  # any failure to rebuild means: compile again
        reject_payload(key, f"{type(e).__name__}: {e}")
        return None
    notify_compiled(artifacts)
    return finish(call, artifacts, meta, layout, cfg, fake, flat_args, None, entry.relative)


def _symbolic_inputs(
    facts: dict[str, Any], flat_args: Sequence[Any], cfg: AOTConfig
) -> tuple[FakeTensorMode, list[Any], dict[str, Any]]:
    """Fakes of the inputs with the cached entry's symbols bound to theirs, and the cached
    guards asserted in their ShapeEnv. See Note [Dynamic shapes in the on-disk cache]."""
    layout = compute_input_layout(flat_args)
    if not layout.is_trivial:
        raise CacheFormatError("a symbolic entry for aliased inputs")
    # aot_function(dynamic=True): a fresh ShapeEnv, as a trace makes; under dynamo, its
    # own, whose symbols the fakes of its inputs take (See Note [Shape guards])
    fake_mode, shape_env = construct_fake_mode(flat_args, dynamic=True)
    fake = fakify_compiled(flat_args, layout, cfg, fake_mode, shape_env)
    env = bind_symbols(facts, fake)
    install_guards(facts, env)
    return fake_mode, fake, env


def _use_fakes(graph: torch.fx.GraphModule, fake: Sequence[Any], meta: Any) -> None:
    """The compiled inputs' fakes become the graph's placeholder values (as in a trace)."""
    nodes = list(graph.graph.find_nodes(op="placeholder"))[len(meta.tokens):]
    if len(nodes) != len(fake) or len(meta.input_info) != len(fake):
        raise CacheFormatError("the cached graph takes another number of inputs")
    for node, f, info in zip(nodes, fake, meta.input_info, strict=True):
        if isinstance(f, torch.Tensor) and info.requires_grad != f.requires_grad:
            raise CacheFormatError("an input's requires_grad differs from the cached one")
        node.meta["val"] = f


def _compiled_fakes(
    graph: torch.fx.GraphModule, meta: Any, n_inputs: int, fake_mode: FakeModeLike
) -> RestoredFakes:
    """Fakes of the compiled inputs, as a fresh compilation has them, built when first
    read (See Note [Restored inputs' fakes built when read])."""
    # See Note [Effect tokens]: the forward's token inputs lead, and are not compiled inputs
    nodes = [n for n in graph.graph.nodes if n.op == "placeholder"][len(meta.tokens):]
    if len(nodes) != n_inputs or len(meta.input_info) != n_inputs:
        raise CacheFormatError("the cached graph takes another number of inputs")
    return RestoredFakes(
        [n.meta for n in nodes], [info.requires_grad for info in meta.input_info], fake_mode
    )

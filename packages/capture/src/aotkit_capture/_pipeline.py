"""``compile_flat``: the compile pipeline, from a flat function and its flat inputs to a
runner and the compiled artifacts, in the steps of docs/architecture.md.

A compile cache plugs in through ``aotkit_schemas.CompileCache`` (See Note [The compile
cache seam]): looked up before the first step, entered around the trace after a miss, and
handed the finished compilation to store. The steps themselves (input layout,
fakification, metadata, trace, partition, compile, wrap) are ``compile_traced``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any

from aotkit_schemas import AOTConfig, CompileCache, cache_counters
from aotkit_tracing import FlatFn, checking_input_rebinds, generator_state_kept, new_compilation

from .compile._checkpoint_modes import (
    eager_selective_checkpointing,
    fx_meta_restored,
    is_sac_mutation_error,
)
from .compile._compile import CompiledArtifacts, Runner, compile_traced
from .compile._compile_lock import COMPILE_LOCK
from .compile._gc import deferred_full_collections
from .inputs._batch_norm_cma import cumulative_batch_norm
from .inputs._generators import check_no_created_generators, recording_generators
from .inputs._requires_grad_changes import compile_following_flips

# what a compile cache restores, and what it stores
PipelineCache = CompileCache[tuple[Runner, CompiledArtifacts], CompiledArtifacts]


def compile_flat(
    flat_fn: FlatFn,
    flat_args: Sequence[Any],
    cfg: AOTConfig,
    *,
    cache: PipelineCache | None = None,
    before_trace: Callable[[], None] | None = None,
) -> tuple[Runner, CompiledArtifacts]:
    """Trace, partition and compile ``flat_fn`` for inputs shaped like ``flat_args``.

    Returns ``runner(flat_args) -> flat graph outputs`` (user outputs only) and the
    compilation's artifacts. ``cache``: this compilation's compile cache, or None (See Note
    [The compile cache seam]). ``before_trace``: called when the compilation is not
    restored from the cache, before the inputs are fakified and ``flat_fn`` is traced; the
    cache's key must already cover what it does (aot_module_simplified's late pre-grad
    passes: See Note [Pre-grad passes after the cache lookup] in aotkit_frontends).
    """
    # See Note [Concurrent first calls]; See Note [Full collections deferred during a compile]
    # See Note [Generator states the function sets]
    with COMPILE_LOCK, deferred_full_collections(), generator_state_kept(flat_args):
        if cache is not None:
            restored = cache.lookup(flat_args, cfg)
            if restored is not None:
                return restored
        if before_trace is not None:
            before_trace()
        cache_counters["trace"] += 1
        runner, artifacts = _trace_and_compile(flat_fn, flat_args, cfg, cache)
        if cache is not None:
            cache.store(artifacts)
        return runner, artifacts


def _trace_and_compile(
    flat_fn: FlatFn, flat_args: Sequence[Any], cfg: AOTConfig, cache: PipelineCache | None
) -> tuple[Runner, CompiledArtifacts]:
    # See Note [BatchNorm's cumulative moving average]; See Note [Generators created
    # while tracing]: checked before the cache stores the compilation
    # See Note [Contexts that span the backward trace]
    def compile_one(changes: Mapping[int, bool], watch_all: bool) -> tuple[Runner, CompiledArtifacts]:
        # See Note [Input changes no graph records]
        traced = cumulative_batch_norm(checking_input_rebinds(flat_fn, changes, watch_all))
        try:
            with fx_meta_restored():
                return compile_traced(traced, flat_args, cfg)
        except Exception as e:
            if not is_sac_mutation_error(e):
                raise
        # See Note [Selective checkpointing with in-place ops]
        with eager_selective_checkpointing(), fx_meta_restored():
            return compile_traced(traced, flat_args, cfg)

    with (
        recording_generators() as created,
        new_compilation(),
        cache.tracing() if cache is not None else nullcontext(),
    ):
        # See Note [Inputs whose requires_grad the function changes]
        runner, artifacts, changes = compile_following_flips(compile_one, flat_args)
        artifacts.requires_grad_changes = tuple(sorted(changes.items()))
    check_no_created_generators(created, (
        artifacts.fw_module, artifacts.bw_module, artifacts.inference_module,
        artifacts.joint_module,
    ))
    return runner, artifacts

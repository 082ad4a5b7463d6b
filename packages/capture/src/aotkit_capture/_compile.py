"""Compiling one flat function for one input pattern: the core AOT pipeline.

    flat args ──layout──▶ compiled args ──fakify──▶ metadata pass ──▶ inference or joint trace
       ──partition──▶ fw/bw graphs ──compilers──▶ autograd.Function + epilogue ──▶ runner

See Note [Duplicate and aliased inputs], Note [Forward graph calling convention] and
Note [Runtime epilogue order].
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from aotkit_analysis import InputLayout, collect_metadata, compute_input_layout
from aotkit_runtime import (
    AutogradPlan,
    as_list_caller,
    make_autograd_function,
    make_epilogue,
    needs_epilogue,
)
from aotkit_schemas import (
    RUNTIME_MUTATED_INPUT_KEY,
    AOTConfig,
    CacheFormatError,
    OutputType,
    PartitionResult,
    ViewAndMutationMeta,
    reads_graph_only,
)
from torch._dispatch.python import enable_python_dispatcher
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.fx._lazy_graph_module import _use_lazy_graph_module

from ._cache import cache_counters, reject_payload
from ._cache import load as cache_load
from ._cache import store as cache_store
from ._cache_entry import CacheSidecar, cache_key_or_none, entry_payload, read_entry
from ._context import track_graph_compiling
from ._errors import explain_tracing_errors
from ._fakify import construct_fake_mode, fakify_inputs
from ._plan import (
    gradless_inputs,
    plain_view_outputs,
    returning_plain_tensors,
    static_tangent_like,
    tangent_dependencies,
)
from ._shape_guards import ShapeGuard
from ._single_pass import trace_single_pass
from ._trace import STALE_TANGENTS_KEY, FlatFn, trace_inference, trace_joint

Runner = Callable[[list[Any]], Sequence[Any]]


@dataclass
class CompiledArtifacts:
    """What one compilation produced; kept for inspection and tests."""

    meta: ViewAndMutationMeta
    layout: InputLayout
    fw_module: torch.fx.GraphModule | None = None
    bw_module: torch.fx.GraphModule | None = None
    inference_module: torch.fx.GraphModule | None = None
    joint_module: torch.fx.GraphModule | None = None
    partition: PartitionResult | None = None
    # the ShapeEnv guards this entry is valid under (dynamic shapes, when aotkit made the
    # ShapeEnv); see Note [Shape guards]
    guard: ShapeGuard | None = None
    # metadata and joint came from one trace (See Note [Single-pass joint trace])
    single_pass: bool = False
    # restored from the on-disk cache (See Note [On-disk compile cache]): no trace ran
    from_cache: bool = False
    # what the on-disk cache stores besides the graphs: the user inputs whose mutation
    # made the layout use synthetic bases (None: the plain layout), the epilogue's output
    # offsets, and the tangents whose backward raises (Note [Backward paths through stale
    # saved values])
    mutated_user_inputs: tuple[int, ...] | None = None
    relative_offsets: list[int | None] | None = None
    stale_tangents: tuple[tuple[int, str], ...] = ()


@contextlib.contextmanager
def _tracing_context(fake_mode: FakeTensorMode, symbolic: bool) -> Any:
    rng = torch.get_rng_state()
    try:
        with fake_mode, (enable_python_dispatcher() if symbolic else contextlib.nullcontext()):
            yield
    finally:
        torch.set_rng_state(rng)


def _output_needs_grad(meta: ViewAndMutationMeta) -> bool:
    """Whether any output or visible input mutation actually needs a backward."""
    for out in meta.output_info:
        if not out.requires_grad:
            continue
        if out.output_type in (OutputType.alias_of_input, OutputType.is_input):
            assert out.base_idx is not None
            if meta.input_info[out.base_idx].requires_grad:
                continue  # view replay gives it grad_fn at run time
        return True
    return any(
        i.requires_grad
        and i.mutates_data
        and not i.mutations_under_no_grad_or_inference_mode
        and not i.mutations_hidden_from_autograd
        for i in meta.input_info
    )


def _metadata(
    flat_fn: FlatFn,
    flat_args: Sequence[Any],
    layout: InputLayout,
    cfg: AOTConfig,
    fake_mode: FakeTensorMode,
    shape_env: Any,
    fake_args: list[Any] | None = None,
) -> tuple[ViewAndMutationMeta, list[Any], FlatFn, list[Any]]:
    """The metadata pass; ``fake_args``: the compiled inputs, already fakified."""
    traced_fn = layout.wrap_for_tracing(flat_fn)
    fake = fake_args if fake_args is not None else _fakify(flat_args, layout, cfg, fake_mode, shape_env)
    # Not gated on grad mode: a function called under no_grad may enable grad itself.
    # Whether a backward is needed is decided from the outputs (``_output_needs_grad``),
    # which the metadata pass computes under the caller's grad mode.
    needs_autograd = any(isinstance(a, torch.Tensor) and a.requires_grad for a in fake)
    meta, fw_outs = collect_metadata(
        traced_fn,
        fake,
        # See Note [Input mutations kept in the training graph] (exports keep them in
        # inference graphs only)
        keep_input_mutations=cfg.keep_inference_input_mutations
        and not (needs_autograd and cfg.is_export),
        is_train=needs_autograd,
        static_input_indices=cfg.static_input_indices or (),
        eager_leaf_checks=not cfg.is_export,
    )
    return meta, fake, traced_fn, fw_outs


def _fakify(
    flat_args: Sequence[Any],
    layout: InputLayout,
    cfg: AOTConfig,
    fake_mode: FakeTensorMode,
    shape_env: Any,
) -> list[Any]:
    with unset_fake_temporarily():
        # synthetic bases are built from the real inputs, outside the fake mode
        compiled_args = layout.compiled_args(flat_args)
    return fakify_inputs(
        compiled_args,
        fake_mode,
        shape_env,
        static_positions=_static_positions(layout, cfg.num_params_buffers),
        is_export=cfg.is_export,
    )


def _static_positions(layout: InputLayout, num_params_buffers: int) -> frozenset[int]:
    """Compiled positions of the parameters and buffers (fakified with static shapes)."""
    return frozenset(c for c, i in layout.kept_positions() if i < num_params_buffers)


def _as_inference(meta: ViewAndMutationMeta, keep_input_mutations: bool) -> ViewAndMutationMeta:
    infos = [dataclasses.replace(i, keep_input_mutations=keep_input_mutations) for i in meta.input_info]
    return dataclasses.replace(
        meta,
        input_info=infos,
        keep_input_mutations=keep_input_mutations,
        traced_tangents=[],
        is_train=False,
    )


def _relative_offsets(
    meta: ViewAndMutationMeta, fake_args: Sequence[Any], fw_outs: Sequence[Any]
) -> list[int | None]:
    n_mut = meta.num_mutated_inp_runtime_indices
    n_out = meta.num_outputs
    outs = fw_outs[n_mut : n_mut + n_out]
    bases = fw_outs[n_mut + n_out :]
    result: list[int | None] = []
    for j, info in enumerate(meta.output_info):
        base: Any = None
        if info.output_type is OutputType.alias_of_input:
            base = fake_args[info.base_idx] if info.base_idx is not None else None
        elif info.output_type in (
            OutputType.alias_of_intermediate,
            OutputType.alias_of_intermediate_save_as_output,
        ):
            base = bases[info.base_idx] if info.base_idx is not None else None
        elif info.output_type is OutputType.alias_of_intermediate_base_is_user_output:
            base = outs[info.base_idx] if info.base_idx is not None else None
        if base is None or not isinstance(outs[j], torch.Tensor):
            result.append(None)
            continue
        rel = outs[j].storage_offset() - base.storage_offset()
        result.append(rel if isinstance(rel, int) else None)
    return result


def compile_flat(
    flat_fn: FlatFn,
    flat_args: Sequence[Any],
    cfg: AOTConfig,
    *,
    cache_identity: str | None = None,
    cache_sidecar: CacheSidecar | None = None,
) -> tuple[Runner, CompiledArtifacts]:
    """Trace, partition and compile ``flat_fn`` for inputs shaped like ``flat_args``.

    Returns ``runner(flat_args) -> flat graph outputs`` (user outputs only).
    ``cache_identity``: a fingerprint of the program ``flat_fn`` runs (``program_fingerprint``)
    to look the compilation up in, and store it to, the on-disk cache (See Note [On-disk
    compile cache]); None leaves the disk alone.
    """
    key = cache_key_or_none(cache_identity, flat_args, cfg)
    if key is not None:
        payload = cache_load(key)
        if payload is not None:
            restored = _restore(key, payload, flat_args, cfg, cache_sidecar)
            if restored is not None:
                cache_counters["hit"] += 1
                return restored
    cache_counters["trace"] += 1
    runner, artifacts = _compile_traced(flat_fn, flat_args, cfg)
    if key is not None:
        payload = entry_payload(artifacts, cache_sidecar)
        if payload is not None:
            cache_store(key, payload)
    return runner, artifacts


def _compile_traced(
    flat_fn: FlatFn, flat_args: Sequence[Any], cfg: AOTConfig
) -> tuple[Runner, CompiledArtifacts]:
    fake_mode, shape_env = construct_fake_mode(flat_args, dynamic=cfg.dynamic_shapes)
    layout = compute_input_layout(flat_args)
    with explain_tracing_errors(), _tracing_context(fake_mode, shape_env is not None):
        fake_args: list[Any] | None = None
        single = None
        if _single_pass_applies(flat_args, layout, cfg, shape_env):
            fake_args = _fakify(flat_args, layout, cfg, fake_mode, shape_env)
            single = _try_single_pass(flat_fn, fake_args, layout, cfg)
        if single is not None and fake_args is not None:
            # See Note [Single-pass joint trace]
            meta, traced_fn, fw_outs, traced = single
            fake = fake_args
            artifacts = CompiledArtifacts(meta=meta, layout=layout, single_pass=True)
            relative = _relative_offsets(meta, fake, fw_outs)
            call = _compile_training(traced_fn, fake, meta, cfg, artifacts, traced=traced)
        else:
            call, artifacts, meta, layout, fake, relative = _compile_two_pass(
                flat_fn, flat_args, layout, cfg, fake_mode, shape_env, fake_args
            )
    artifacts.relative_offsets = relative
    return _finish(call, artifacts, meta, layout, cfg, fake, flat_args, shape_env, relative)


def _restore(
    key: str,
    payload: dict[str, Any],
    flat_args: Sequence[Any],
    cfg: AOTConfig,
    sidecar: CacheSidecar | None,
) -> tuple[Runner, CompiledArtifacts] | None:
    """The compiled entry for a cached payload, or None (logged) when it does not check
    out. See Note [On-disk compile cache]."""
    fake_mode = detect_fake_mode(list(flat_args)) or FakeTensorMode()
    try:
        entry = read_entry(payload, fake_mode)
        users = entry.mutated_user_inputs
        layout = (
            compute_input_layout(flat_args)
            if users is None
            else compute_input_layout(flat_args, frozenset(users).__contains__)
        )
        if repr(layout.key) != entry.layout_key:
            raise CacheFormatError("the input layout differs from the cached one")
        meta = entry.meta
        if sidecar is not None:
            sidecar.load_json(payload.get("sidecar"))
        artifacts = CompiledArtifacts(
            meta=meta, layout=layout, single_pass=entry.single_pass, from_cache=True,
            mutated_user_inputs=users, relative_offsets=entry.relative,
            stale_tangents=entry.stale_tangents,
        )
        graph = entry.partition.fw_module if entry.partition else entry.inference
        assert graph is not None
        fake = [n.meta["val"] for n in graph.graph.nodes if n.op == "placeholder"]
        if len(fake) != layout.num_compiled_inputs:
            raise CacheFormatError("the cached graph takes another number of inputs")
        if entry.partition is not None:
            artifacts.partition = entry.partition
            artifacts.fw_module = entry.partition.fw_module
            artifacts.bw_module = entry.partition.bw_module
            call = _training_call(entry.partition, fake, meta, cfg, entry.stale_tangents)
        else:
            artifacts.inference_module = entry.inference
            call = _inference_call(graph, fake, meta, cfg)
    except Exception as e:  # any failure to rebuild means: compile again
        reject_payload(key, f"{type(e).__name__}: {e}")
        return None
    return _finish(call, artifacts, meta, layout, cfg, fake, flat_args, None, entry.relative)


def _compile_two_pass(
    flat_fn: FlatFn,
    flat_args: Sequence[Any],
    layout: InputLayout,
    cfg: AOTConfig,
    fake_mode: FakeTensorMode,
    shape_env: Any,
    fake_args: list[Any] | None = None,
) -> tuple[
    Callable[[list[Any]], Sequence[Any]],
    CompiledArtifacts,
    ViewAndMutationMeta,
    InputLayout,
    list[Any],
    list[int | None],
]:
    """The general flow: the metadata pass, then the inference or joint trace.

    ``fake_args``: the inputs already fakified for ``layout`` (by a single-pass attempt).
    """
    meta, fake, traced_fn, fw_outs = _metadata(
        flat_fn, flat_args, layout, cfg, fake_mode, shape_env, fake_args
    )
    first_meta, first_layout = meta, layout

    def mutated(user_index: int) -> bool:
        ci = first_layout.compiled_index_of_user_input(user_index)
        # Only data mutations are seen through an alias; a metadata mutation (t_,
        # unsqueeze_) changes one tensor and is replayed on it alone.
        return ci is not None and first_meta.input_info[ci].mutates_data

    with_bases = compute_input_layout(flat_args, mutated)
    mutated_users: tuple[int, ...] | None = None
    if with_bases.key != layout.key:
        layout = with_bases
        mutated_users = tuple(i for i in range(len(flat_args)) if mutated(i))
        meta, fake, traced_fn, fw_outs = _metadata(
            flat_fn, flat_args, layout, cfg, fake_mode, shape_env
        )
    if meta.is_train and not _output_needs_grad(meta):
        meta = _as_inference(meta, cfg.keep_inference_input_mutations)
    artifacts = CompiledArtifacts(meta=meta, layout=layout, mutated_user_inputs=mutated_users)
    relative = _relative_offsets(meta, fake, fw_outs)
    if meta.is_train:
        call = _compile_training(traced_fn, fake, meta, cfg, artifacts)
    else:
        call = _compile_inference(traced_fn, fake, meta, cfg, artifacts)
    return call, artifacts, meta, layout, fake, relative


def _single_pass_applies(
    flat_args: Sequence[Any], layout: InputLayout, cfg: AOTConfig, shape_env: Any
) -> bool:
    """Whether to try Note [Single-pass joint trace]: training calls (grad mode on, an
    input requiring grad) with static shapes and no duplicated inputs or inputs sharing
    memory, outside export."""
    return not (
        shape_env is not None
        or cfg.is_export
        or cfg.keep_inference_input_mutations  # Note [Input mutations kept in the training graph]
        or not layout.is_trivial
        or not torch.is_grad_enabled()
        or not any(isinstance(a, torch.Tensor) and a.requires_grad for a in flat_args)
        # inputs that share memory need the two-pass flow's synthetic bases as soon as one
        # of them is mutated, which only the metadata pass can tell
        or _inputs_share_storage(flat_args)
    )


def _inputs_share_storage(flat_args: Sequence[Any]) -> bool:
    storages: set[int] = set()
    for a in flat_args:
        if isinstance(a, torch.Tensor) and not (a.is_sparse or a.is_mkldnn):
            s = a.untyped_storage()._cdata
            if s in storages:
                return True
            storages.add(s)
    return False


def _try_single_pass(
    flat_fn: FlatFn, fake_args: list[Any], layout: InputLayout, cfg: AOTConfig
) -> tuple[ViewAndMutationMeta, FlatFn, list[Any], tuple[torch.fx.GraphModule, list[Any]]] | None:
    """(metadata, traced function, forward outputs, (joint, joint inputs)) from one
    trace, or None for the two-pass flow. See Note [Single-pass joint trace]."""
    traced_fn = layout.wrap_for_tracing(flat_fn)
    try:
        joint, joint_inputs, meta, fw_outs = trace_single_pass(
            traced_fn, fake_args, cfg.decompositions,
            static_input_indices=cfg.static_input_indices or (),
        )
    except Exception:  # NotSinglePass, or an error the two-pass flow reports in its own way
        return None
    return meta, traced_fn, fw_outs, (joint, joint_inputs)


def _finish(
    call: Callable[[list[Any]], Sequence[Any]],
    artifacts: CompiledArtifacts,
    meta: ViewAndMutationMeta,
    layout: InputLayout,
    cfg: AOTConfig,
    fake: list[Any],
    flat_args: Sequence[Any],
    shape_env: Any,
    relative: list[int | None],
) -> tuple[Runner, CompiledArtifacts]:
    """Guard the entry and wrap the compiled call with the epilogue and input layout."""
    if shape_env is not None and detect_fake_mode(list(flat_args)) is None:
        # A ShapeEnv made for this compilation: guard the entry (See Note [Shape guards]).
        # A fake mode that came with the inputs (dynamo's) belongs to a caller that guards.
        static = _static_positions(layout, cfg.num_params_buffers)
        dynamic = [c for c in range(len(fake)) if c not in static]
        artifacts.guard = ShapeGuard.build(shape_env, fake, dynamic, layout)
    trivial = layout.is_trivial
    if trivial and not needs_epilogue(meta):
        # the forward returns are the user outputs (See Note [Specialised runtime paths])
        return call, artifacts
    epilogue = make_epilogue(meta, relative)

    if trivial:

        def run_trivial(args: list[Any]) -> list[Any]:
            return epilogue(args, call(args))

        return run_trivial, artifacts

    effects = layout.member_effects

    def run(args: list[Any]) -> list[Any]:
        compiled_args = layout.compiled_args(args)
        outs = epilogue(compiled_args, call(compiled_args))
        # See Note [Duplicate and aliased inputs]
        return effects.apply(args, outs)

    return run, artifacts


def _compile_inference(
    traced_fn: FlatFn,
    fake: list[Any],
    meta: ViewAndMutationMeta,
    cfg: AOTConfig,
    artifacts: CompiledArtifacts,
) -> Callable[[list[Any]], Sequence[Any]]:
    compiler = cfg.inference_compiler or cfg.fw_compiler
    with _lazy_modules(reads_graph_only(compiler)):
        gm = trace_inference(traced_fn, fake, meta, cfg.decompositions)
    artifacts.inference_module = gm
    return _inference_call(gm, fake, meta, cfg)


def _inference_call(
    gm: torch.fx.GraphModule, fake: Sequence[Any], meta: ViewAndMutationMeta, cfg: AOTConfig
) -> Callable[[list[Any]], Sequence[Any]]:
    """Compile the inference graph ``gm`` and wrap it for the epilogue."""
    compiler = cfg.inference_compiler or cfg.fw_compiler
    with track_graph_compiling(cfg, "inference"):
        raw = compiler(gm, list(fake))
    compiled = as_list_caller(raw)
    if compiled is raw:
        # A boxed graph may clear the list it gets (Note [Boxed calling convention]); the
        # epilogue still reads the arguments, so it gets a copy. (The training path's
        # autograd.Function builds its own list.)
        boxed: Callable[[list[Any]], Sequence[Any]] = compiled

        def call_with_copy(args: list[Any]) -> Sequence[Any]:
            return boxed(list(args))

        compiled = call_with_copy
    grad_free = not any(isinstance(a, torch.Tensor) and a.requires_grad for a in fake)
    plain_views = plain_view_outputs(gm, meta)
    if plain_views:
        compiled = returning_plain_tensors(compiled, plain_views)

    if grad_free:
        return compiled

    def run_no_grad(args: list[Any]) -> Sequence[Any]:
        with torch.no_grad():
            return compiled(args)

    return run_no_grad


def _lazy_modules(lazy: bool) -> contextlib.AbstractContextManager[None]:
    """Build GraphModules lazily for compilers that read only the graph (See Note
    [Compilers that read only the graph] in aotkit_schemas); otherwise leave the choice to
    the caller (torch.compile sets it)."""
    return _use_lazy_graph_module(True) if lazy else contextlib.nullcontext()


def _compile_training(
    traced_fn: FlatFn,
    fake: list[Any],
    meta: ViewAndMutationMeta,
    cfg: AOTConfig,
    artifacts: CompiledArtifacts,
    *,
    traced: tuple[torch.fx.GraphModule, list[Any]] | None = None,
) -> Callable[[list[Any]], Sequence[Any]]:
    if traced is not None:
        joint, joint_inputs = traced
    else:
        native = _native_functionalization(meta, cfg, artifacts.layout)
        joint, joint_inputs = trace_joint(traced_fn, fake, meta, cfg.decompositions, native=native)
    _mark_runtime_mutated_primals(joint, meta)
    artifacts.joint_module = joint
    n_fwd = meta.num_forward_returns
    lazy = reads_graph_only(cfg.fw_compiler) and reads_graph_only(cfg.bw_compiler)
    with track_graph_compiling(cfg, "joint"), _lazy_modules(lazy):
        fw_module, bw_module = cfg.partition_fn(joint, joint_inputs, num_fwd_outputs=n_fwd)
    partition = PartitionResult.from_modules(fw_module, bw_module, n_fwd)
    artifacts.fw_module, artifacts.bw_module, artifacts.partition = fw_module, bw_module, partition
    artifacts.stale_tangents = tuple(sorted(joint.meta.get(STALE_TANGENTS_KEY, {}).items()))
    return _training_call(partition, fake, meta, cfg, artifacts.stale_tangents)


def _training_call(
    partition: PartitionResult,
    fake: Sequence[Any],
    meta: ViewAndMutationMeta,
    cfg: AOTConfig,
    stale_tangents: tuple[tuple[int, str], ...],
) -> Callable[[list[Any]], Sequence[Any]]:
    """Compile the forward now and the backward at its first call; the autograd.Function."""
    fw_module, bw_module = partition.fw_module, partition.bw_module
    with track_graph_compiling(cfg, "forward"):
        compiled_fw = cfg.fw_compiler(fw_module, list(fake))
    with track_graph_compiling(cfg, "backward"):  # torch's ahead-of-time backward stage
        bw_example = [n.meta.get("val") for n in bw_module.graph.nodes if n.op == "placeholder"]
    fake_mode = detect_fake_mode(fake) or FakeTensorMode()
    symbolic = fake_mode.shape_env is not None

    def compile_backward() -> Callable[..., Any]:
        # Like torch, the backward is compiled at the first backward call, under the
        # forward's fake mode; the autograd.Function caches the result.
        with _tracing_context(fake_mode, symbolic), track_graph_compiling(cfg, "backward"):
            compiled: Callable[..., Any] = cfg.bw_compiler(bw_module, bw_example)
        return compiled

    plan = AutogradPlan(
        meta=meta,
        num_saved_tensors=partition.num_saved_tensors,
        num_saved_symints=partition.num_saved_symints,
        tangent_deps=tangent_dependencies(
            bw_module, partition.num_saved_symints + partition.num_saved_tensors,
            len(meta.tangent_indices),
        ),
        plain_view_outputs=plain_view_outputs(fw_module, meta),
        stale_tangents=stale_tangents,
        static_tangent_like=static_tangent_like(meta),
        gradless_inputs=gradless_inputs(bw_module, fake, meta),
    )
    run = make_autograd_function(compiled_fw, compile_backward, plan)
    return run


def _native_functionalization(meta: ViewAndMutationMeta, cfg: AOTConfig, layout: InputLayout) -> bool:
    """Whether the joint is traced with the C++ Functionalize key (See Note [Native
    functionalization] in aotkit_functional).

    Only for programs without input mutations, aliased outputs or aliased inputs: there
    the joint is op for op the one torch's Python mode traces (minus no-op detach nodes).
    Mutation and aliasing programs, and exports, keep torch's exact graph text (view
    replay numbers its nodes differently on the native path).
    """
    return (
        meta.native_functionalization_ok
        and not cfg.is_export
        and layout.is_trivial
        and not meta.mutated_inp_runtime_indices
        and not meta.mutated_inp_in_graph_indices
        and meta.num_intermediate_bases == 0
        and all(o.output_type is OutputType.non_alias for o in meta.output_info)
    )


def _mark_runtime_mutated_primals(joint: torch.fx.GraphModule, meta: ViewAndMutationMeta) -> None:
    """Tell the partitioner which primals the epilogue mutates after the forward.

    See Note [Joint graph calling convention].
    """
    primals = [n for n in joint.graph.nodes if n.op == "placeholder"][: len(meta.input_info)]
    for i in meta.mutated_inp_runtime_indices:
        if meta.input_info[i].mutates_data:
            primals[i].meta[RUNTIME_MUTATED_INPUT_KEY] = True

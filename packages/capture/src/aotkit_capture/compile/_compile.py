"""Compiling one flat function for one input pattern: the core AOT pipeline.

    flat args ──layout──▶ compiled args ──fakify──▶ metadata pass ──▶ inference or joint trace
       ──partition──▶ fw/bw graphs ──compilers──▶ autograd.Function + epilogue ──▶ runner

See Note [Duplicate and aliased inputs], Note [Forward graph calling convention] and
Note [Runtime epilogue order].
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from aotkit_analysis import InputLayout, collect_metadata, compute_input_layout
from aotkit_runtime import (
    make_epilogue,
    needs_epilogue,
)
from aotkit_schemas import (
    RUNTIME_MUTATED_INPUT_KEY,
    AOTConfig,
    OutputType,
    PartitionResult,
    ViewAndMutationMeta,
    reads_graph_only,
)
from aotkit_tracing import (
    BACKWARD_MUTATED_INPUTS_KEY,
    NATIVE_FALLBACK_KEY,
    STALE_TANGENTS_KEY,
    FlatFn,
    SubclassLayer,
    check_layer_applies,
    check_no_effects_in_subgraphs,
    compiler_kernel_choices,
    count_backward_tokens,
    effects_in_subgraph_error,
    explain_tracing_errors,
    needs_subclass_layer,
    preserved_autocast,
    propagate_mutation_meta,
    retry_with_shape_env,
    trace_inference,
    trace_joint,
    trace_single_pass,
    with_backward_tokens,
    without_autocast_compiling,
    without_effect_tokens,
)
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.fx._lazy_graph_module import _use_lazy_graph_module

from aotkit_capture._saved_tensor_hooks import (
    compile_hooks,
    hooks_hidden_while_tracing,
    inline_after_partition,
    with_hooks_runtime,
)
from aotkit_capture._subclass_calls import subclass_inference_call, subclass_training_call
from aotkit_capture.inputs._fakify import construct_fake_mode, fakify_inputs
from aotkit_capture.inputs._symbolic_members import with_symbolic_members

from ._compiled_calls import (
    _tracing_context,
    inference_call,
    training_call,
)
from ._context import track_graph_compiling
from ._descriptors import describe_inference, describe_joint, describe_partition, run_joint_passes
from ._donated_buffers import with_donated_buffers
from ._higher_order import current_rewrites, recording_backward_rewrites
from ._logs import log_inference, log_joint, log_partition
from ._paths import describe_failure, native_blocker, notify_compiled, single_pass_blocker
from ._shape_guards import ShapeGuard, guardable_positions
from ._static_inputs import partition_kwargs, static_lifetime_indices

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
    # See Note [Why a graph took the path it took]: why the single pass was not used
    # (None when it was), whether the joint was traced with the C++ Functionalize key,
    # and why not
    single_pass_skipped: str | None = None
    native_functionalization: bool = False
    native_skipped: str | None = None
    # See Note [On-disk compile cache]: restored from disk (no trace ran), and what the
    # disk entry stores besides the graphs: the user inputs whose mutation made the layout
    # use synthetic bases (None: the plain layout), the epilogue's output offsets, the
    # stale tangents and backward-mutated inputs of the plan, and whether the tensor
    # subclass layer was used (such entries are not stored)
    from_cache: bool = False
    mutated_user_inputs: tuple[int, ...] | None = None
    relative_offsets: list[int | None] | None = None
    stale_tangents: tuple[tuple[int, str, str], ...] = ()
    backward_mutated_inputs: tuple[int, ...] = ()
    # See Note [Programs whose backward is not the forward's derivative]: why a backward
    # with create_graph=True can't recompute (None: it can)
    higher_order_blocked: str | None = None
    subclass_layer: bool = False
    # See Note [Inputs whose requires_grad the function changes]: (input, new flag)
    requires_grad_changes: tuple[tuple[int, bool], ...] = ()

    @property
    def path(self) -> str:
        """``single pass``, ``native``, ``python`` or ``inference``: how the graphs were
        traced. See Note [Why a graph took the path it took]."""
        if not self.meta.is_train:
            return "inference"
        if self.single_pass:
            return "single pass"
        return "native" if self.native_functionalization else "python"

    @property
    def path_reason(self) -> str | None:
        """Why the faster paths were not taken (None on the single pass)."""
        if self.single_pass or not self.meta.is_train:
            return self.single_pass_skipped if not self.meta.is_train else None
        if self.native_functionalization:
            return f"not single pass: {self.single_pass_skipped}"
        return f"not single pass: {self.single_pass_skipped}; not native: {self.native_skipped}"


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
    fake = (
        fake_args
        if fake_args is not None
        else _fakify(flat_args, layout, cfg, fake_mode, shape_env)
    )
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
    return without_effect_tokens(meta, cfg.disable_functionalization), fake, traced_fn, fw_outs


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
    infos = [
        dataclasses.replace(i, keep_input_mutations=keep_input_mutations) for i in meta.input_info
    ]
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


def compile_traced(
    flat_fn: FlatFn, flat_args: Sequence[Any], cfg: AOTConfig
) -> tuple[Runner, CompiledArtifacts]:
    """Trace, partition and compile ``flat_fn`` for inputs shaped like ``flat_args``.

    Returns ``runner(flat_args) -> flat graph outputs`` (user outputs only). The public
    entry, ``compile_flat``, adds a compile cache around it (See Note [The compile cache
    seam] in aotkit_schemas).
    """
    fake_mode, shape_env = construct_fake_mode(flat_args, dynamic=cfg.dynamic_shapes)
    # See Note [Programs whose backward is not the forward's derivative]
    with recording_backward_rewrites() as rewrites, hooks_hidden_while_tracing():
        compile_in = functools.partial(_compile_flat, rewrites.watching(flat_fn), flat_args, cfg)
        # See Note [Inlined saved-tensors hooks]
        runner, artifacts = retry_with_shape_env(compile_in, fake_mode, shape_env)  # while_loop
        hooks = compile_hooks() if artifacts.meta.is_train else None
    return with_hooks_runtime(runner, hooks), artifacts


def _compile_flat(
    flat_fn: FlatFn, flat_args: Sequence[Any], cfg: AOTConfig, fake_mode: FakeTensorMode,
    shape_env: Any,
) -> tuple[Runner, CompiledArtifacts]:
    # the steps of docs/architecture.md: 1. input layout
    layout = compute_input_layout(flat_args)
    # See Note [A failed trace leaves autocast as it found it]
    with (
        explain_tracing_errors(),
        _tracing_context(fake_mode, shape_env is not None),
        preserved_autocast(),
    ):
        fake_args: list[Any] | None = None
        single: Any = None
        # See Note [Why a graph took the path it took]
        skipped = single_pass_blocker(flat_args, layout, cfg, shape_env)
        if skipped is None:
            # 2. fakify; 3+4. metadata and joint in one trace (the single pass)
            fake_args = _fakify(flat_args, layout, cfg, fake_mode, shape_env)
            single = _try_single_pass(flat_fn, fake_args, layout, cfg)
            if isinstance(single, str):
                skipped, single = single, None
        if single is not None and fake_args is not None:
            # See Note [Single-pass joint trace]
            meta, traced_fn, fw_outs, traced = single
            fake = fake_args
            artifacts = CompiledArtifacts(
                meta=meta, layout=layout, single_pass=True, native_functionalization=True
            )
            relative = _relative_offsets(meta, fake, fw_outs)
            # 5. partition, 6. compile
            call = _compile_training(traced_fn, fake, meta, cfg, artifacts, traced=traced)
        else:
            # 2. fakify, 3. metadata, 4. trace, 5. partition, 6. compile: the general flow
            call, artifacts, meta, layout, fake, relative = _compile_two_pass(
                flat_fn, flat_args, layout, cfg, fake_mode, shape_env, fake_args, skipped
            )
    notify_compiled(artifacts)
    artifacts.relative_offsets = relative
    # 7. wrap: the autograd.Function, the epilogue and the shape guards
    return finish(call, artifacts, meta, layout, cfg, fake, flat_args, shape_env, relative)


def _compile_two_pass(
    flat_fn: FlatFn,
    flat_args: Sequence[Any],
    layout: InputLayout,
    cfg: AOTConfig,
    fake_mode: FakeTensorMode,
    shape_env: Any,
    fake_args: list[Any] | None = None,
    single_pass_skipped: str | None = None,
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
        mutated_users = tuple(i for i in range(len(flat_args)) if mutated(i))
        fake = _fakify(flat_args, with_bases, cfg, fake_mode, shape_env)
        # See Note [Symbolic geometry of aliased members]
        layout = with_symbolic_members(with_bases, flat_args, fake, fake_mode, shape_env)
        meta, fake, traced_fn, fw_outs = _metadata(
            flat_fn, flat_args, layout, cfg, fake_mode, shape_env, fake
        )
    if meta.is_train and not _output_needs_grad(meta):
        meta = _as_inference(meta, cfg.keep_inference_input_mutations)
    artifacts = CompiledArtifacts(
        meta=meta,
        layout=layout,
        single_pass_skipped=single_pass_skipped,
        mutated_user_inputs=mutated_users,
    )
    relative = _relative_offsets(meta, fake, fw_outs)
    # See Note [Tensor subclasses are desugared] in aotkit_schemas
    layer = SubclassLayer.build(fake, meta) if needs_subclass_layer(fake, fw_outs) else None
    if layer is not None:
        check_layer_applies(meta, layer)
        artifacts.subclass_layer = True
    if meta.is_train:
        call = _compile_training(traced_fn, fake, meta, cfg, artifacts, subclasses=layer)
    else:
        call = _compile_inference(traced_fn, fake, meta, cfg, artifacts, subclasses=layer)
    if layer is not None:
        artifacts.meta = layer.with_metas(artifacts.meta)
    return call, artifacts, meta, layout, fake, relative


def _try_single_pass(
    flat_fn: FlatFn, fake_args: list[Any], layout: InputLayout, cfg: AOTConfig
) -> tuple[ViewAndMutationMeta, FlatFn, list[Any], tuple[torch.fx.GraphModule, list[Any]]] | str:
    """(metadata, traced function, forward outputs, (joint, joint inputs)) from one
    trace, or, for the two-pass flow, why not. See Note [Single-pass joint trace]."""
    traced_fn = layout.wrap_for_tracing(flat_fn)
    try:  # See Note [A failed trace leaves autocast as it found it]
        with preserved_autocast():
            joint, joint_inputs, meta, fw_outs = trace_single_pass(
                traced_fn,
                fake_args,
                cfg.decompositions,
                static_input_indices=cfg.static_input_indices or (),
                keep_input_mutations=cfg.keep_inference_input_mutations,
            )
    except Exception as e:  # NotSinglePass, or an error the two-pass flow reports its way
        return describe_failure(e)
    return meta, traced_fn, fw_outs, (joint, joint_inputs)


def finish(
    call: Callable[[list[Any]], Sequence[Any]],
    artifacts: CompiledArtifacts,
    meta: ViewAndMutationMeta,
    layout: InputLayout,
    cfg: AOTConfig,
    fake: Sequence[Any],
    flat_args: Sequence[Any],
    shape_env: Any,
    relative: list[int | None],
) -> tuple[Runner, CompiledArtifacts]:
    """Guard the entry and wrap the compiled call with the epilogue and input layout."""
    if shape_env is not None and detect_fake_mode(list(flat_args)) is None:
        # A ShapeEnv made for this compilation: guard the entry (See Note [Shape guards]).
        # A fake mode that came with the inputs (dynamo's) belongs to a caller that guards.
        static = _static_positions(layout, cfg.num_params_buffers)
        dynamic = guardable_positions(fake, static)
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
    *,
    subclasses: SubclassLayer | None = None,
) -> Callable[[list[Any]], Sequence[Any]]:
    compiler = cfg.inference_compiler or cfg.fw_compiler
    with _lazy_modules(reads_graph_only(compiler)):
        gm = trace_inference(
            traced_fn, fake, meta, cfg.decompositions, subclasses,
            functionalize=not cfg.disable_functionalization,
        )
    check_no_effects_in_subgraphs(gm)  # See Note [Higher-order operators]
    propagate_mutation_meta(gm.graph)  # See Note [Preserved node meta]
    if subclasses is None:  # See Note [Where descriptors are attached]
        describe_inference(gm, meta, artifacts.layout, cfg)
    log_inference(gm, meta)
    artifacts.inference_module = gm
    if subclasses is None:
        return inference_call(gm, fake, meta, cfg)
    return subclass_inference_call(gm, fake, meta, cfg, subclasses)


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
    subclasses: SubclassLayer | None = None,
) -> Callable[[list[Any]], Sequence[Any]]:
    if traced is not None:
        joint, joint_inputs = traced
    else:
        # See Note [Why a graph took the path it took]
        blocker = (
            "tensor subclass inputs"
            if subclasses is not None
            else native_blocker(meta, cfg, artifacts.layout)
        )
        try:
            joint, joint_inputs = trace_joint(
                traced_fn, fake, meta, cfg.decompositions, native=blocker is None,
                subclasses=subclasses, functionalize=not cfg.disable_functionalization,
            )
        except TypeError as e:  # See Note [Higher-order operators]
            if (error := effects_in_subgraph_error(e)) is not None:
                raise error from e
            raise
        artifacts.native_skipped = joint.meta.get(NATIVE_FALLBACK_KEY, blocker)
        artifacts.native_functionalization = artifacts.native_skipped is None
    check_no_effects_in_subgraphs(joint)  # See Note [Higher-order operators]
    # See Note [Effect tokens]
    meta = artifacts.meta = with_backward_tokens(meta, count_backward_tokens(joint))
    n_tok = len(meta.tokens)
    _mark_runtime_mutated_primals(joint, meta, subclasses, n_tok)
    propagate_mutation_meta(joint.graph)  # See Note [Preserved node meta]
    if subclasses is None:  # See Note [Where descriptors are attached]
        describe_joint(joint, meta, artifacts.layout, cfg)
    joint = run_joint_passes(joint, joint_inputs, cfg)  # See Note [Joint graph passes]
    log_joint(joint, single_pass=artifacts.single_pass)
    artifacts.joint_module = joint
    n_fwd = meta.num_forward_returns + n_tok
    if subclasses is not None:
        # See Note [Tensor subclasses are desugared] in aotkit_schemas
        n_fwd = subclasses.num_flat_forward_returns + n_tok
        fake = list(joint_inputs[0])
    lazy = reads_graph_only(cfg.fw_compiler) and reads_graph_only(cfg.bw_compiler)
    with track_graph_compiling(cfg, "joint"), _lazy_modules(lazy), without_autocast_compiling(), (
        compiler_kernel_choices()  # See Note [Compilers see the caller's oneDNN setting]
    ):
        # desugared subclasses: the primals are their inner tensors, none marked static
        static = static_lifetime_indices(meta, artifacts.layout, n_tok) if not subclasses else []
        kw = partition_kwargs(cfg.partition_fn, static)
        fw_module, bw_module = cfg.partition_fn(joint, joint_inputs, num_fwd_outputs=n_fwd, **kw)
        inline_after_partition(fw_module, bw_module, n_fwd, meta, cfg.decompositions)
    describe_partition(joint, fw_module, bw_module, n_fwd)
    partition = PartitionResult.from_modules(fw_module, bw_module, n_fwd)
    meta = artifacts.meta = with_donated_buffers(meta, partition, n_fwd)  # Note [Donated buffers]
    log_partition(joint, fw_module, bw_module, n_fwd, meta, _name(cfg.partition_fn), cfg.aot_id)
    artifacts.fw_module, artifacts.bw_module, artifacts.partition = fw_module, bw_module, partition
    stale = joint.meta.get(STALE_TANGENTS_KEY, {})
    artifacts.stale_tangents = tuple((k, *stale[k]) for k in sorted(stale))
    artifacts.backward_mutated_inputs = tuple(joint.meta.get(BACKWARD_MUTATED_INPUTS_KEY, ()))
    rewrites = current_rewrites()
    artifacts.higher_order_blocked = (
        rewrites.reason if rewrites is not None else "compiled outside compile_traced"
    )
    if subclasses is None:
        return training_call(
            partition, fake, meta, cfg, artifacts.stale_tangents, artifacts.backward_mutated_inputs,
            artifacts.higher_order_blocked,
        )
    return subclass_training_call(partition, fake, meta, cfg, subclasses, artifacts.stale_tangents)


def _name(fn: Any) -> str:
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


def _mark_runtime_mutated_primals(
    joint: torch.fx.GraphModule,
    meta: ViewAndMutationMeta,
    subclasses: SubclassLayer | None,
    n_tokens: int = 0,
) -> None:
    """Tell the partitioner which primals the epilogue mutates after the forward (every
    inner tensor of a subclass input). See Note [Joint graph calling convention]."""
    placeholders = [n for n in joint.graph.nodes if n.op == "placeholder"]
    for i in meta.mutated_inp_runtime_indices:
        if meta.input_info[i].mutates_data:
            positions = subclasses.flat_positions(i) if subclasses is not None else (i,)
            for p in positions:
                placeholders[n_tokens + p].meta[RUNTIME_MUTATED_INPUT_KEY] = True

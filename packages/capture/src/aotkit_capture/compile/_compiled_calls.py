"""Compile a partitioned (or inference) graph and wrap it for the runtime: the step of
``compile_traced`` that a compilation restored from the on-disk cache shares with a fresh
one (See Note [On-disk compile cache]). Programs with tensor subclasses take their own path
in ``_compile``; these take plain tensors, and effect tokens lead the graphs' inputs and
outputs (See Note [Effect tokens])."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from aotkit_runtime import (
    AutogradPlan,
    as_list_caller,
    backward_with_tokens,
    forward_with_tokens,
    make_autograd_function,
    tangent_layouts,
)
from aotkit_schemas import (
    AOTConfig,
    PartitionResult,
    ViewAndMutationMeta,
    example_inputs_unused,
    reads_graph_only,
)
from aotkit_tracing import (
    autocast_at_compile,
    compiler_kernel_choices,
    run_without_autocast,
    symbolic_dispatch,
    without_autocast_compiling,
)
from torch._guards import TracingContext, tracing
from torch._subclasses.fake_tensor import FakeTensorMode

from ._compile_lock import COMPILE_LOCK
from ._context import track_graph_compiling
from ._donated_buffers import donated_inputs_offered, keep_donation_mark
from ._examples import (
    DeferredExamples,
    compile_fake_mode,
    examples_for,
    requires_grad_flags,
)
from ._gc import deferred_full_collections
from ._graph_facts import (
    gradless_inputs,
    plain_view_outputs,
    returning_plain_tensors,
    static_tangent_like,
    tangent_dependencies,
)
from ._higher_order import higher_order_plan
from ._saved_strides import (
    Strides,
    reported_output_strides,
    restride_saved,
    saved_tensor_strides,
)
from ._tracing_context_meta import inference_meta_in_tracing_context


@contextlib.contextmanager
def _tracing_context(fake_mode: FakeTensorMode | None, symbolic: bool) -> Any:
    """Under ``fake_mode`` (None: no fake mode; See Note [A restored entry's fake mode made
    when first needed]), the RNG state restored after."""
    rng = torch.get_rng_state()
    try:
        with (
            fake_mode if fake_mode is not None else contextlib.nullcontext(),
            symbolic_dispatch(symbolic),  # See Note [Recurrent layers under the Python dispatcher]
        ):
            yield
    finally:
        torch.set_rng_state(rng)


def compiling_under_fakes(fake: Sequence[Any], compiler: Any) -> Any:
    """The context ``compiler`` runs in for a graph whose inputs' fakes are ``fake``: their
    fake mode (for a restored entry, none when the compiler needs none: See Note [A
    restored entry's fake mode made when first needed]), the RNG state restored after."""
    mode = compile_fake_mode(fake, compiler)
    return _tracing_context(mode, mode is not None and mode.shape_env is not None)


def inference_call(
    gm: torch.fx.GraphModule, fake: Sequence[Any], meta: ViewAndMutationMeta, cfg: AOTConfig
) -> Callable[[list[Any]], Sequence[Any]]:
    """Compile the inference graph ``gm`` (no tensor subclasses) and wrap it for the
    epilogue; shared with the on-disk cache's restore."""
    compiler = cfg.inference_compiler or cfg.fw_compiler
    n_tok = len(meta.tokens)  # See Note [Effect tokens]: the tokens lead
    example = examples_for(compiler, fake)  # See Note [Restored inputs' fakes built when read]
    if n_tok:
        example = [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]
    disable_amp = autocast_at_compile()  # See Note [Compiled graphs run without autocast]
    with track_graph_compiling(cfg, "inference"), without_autocast_compiling(), (
        compiler_kernel_choices()  # See Note [Compilers see the caller's oneDNN setting]
    ):
        # See Note [Metadata in the TracingContext for Inductor's freezing]
        with inference_meta_in_tracing_context(meta):
            raw = forward_with_tokens(compiler(gm, example), n_tok)
    raw = run_without_autocast(raw, disable_amp)
    compiled = as_list_caller(raw)
    if compiled is raw:
        # A boxed graph may clear the list it gets (Note [Boxed calling convention]); the
        # epilogue still reads the arguments, so it gets a copy. (The training path's
        # autograd.Function builds its own list.)
        boxed: Callable[[list[Any]], Sequence[Any]] = compiled

        def call_with_copy(args: list[Any]) -> Sequence[Any]:
            return boxed(list(args))

        compiled = call_with_copy
    plain_views = plain_view_outputs(gm, meta, n_tok)
    if plain_views:
        compiled = returning_plain_tensors(compiled, plain_views)
    return _no_grad_unless_grad_free(compiled, fake)


def _no_grad_unless_grad_free(
    compiled: Callable[[list[Any]], Sequence[Any]], fake: Sequence[Any]
) -> Callable[[list[Any]], Sequence[Any]]:
    if not any(requires_grad_flags(fake)):
        return compiled

    def run_no_grad(args: list[Any]) -> Sequence[Any]:
        with torch.no_grad():
            return compiled(args)

    return run_no_grad


def _backward_compiler(
    partition: PartitionResult,
    fake: Sequence[Any],
    cfg: AOTConfig,
    n_bw_tokens: int = 0,
    saved_strides: Strides | None = None,
    donated: Sequence[int] | None = None,
) -> Callable[[], Callable[..., Any]]:
    bw_module = partition.bw_module
    inputs = list(bw_module.graph.find_nodes(op="placeholder"))

    def backward_examples() -> list[Any]:
        # See Note [Saved tensors keep the compiled forward's strides]
        return restride_saved([n.meta.get("val") for n in inputs], saved_strides, partition)

    bw_example: Sequence[Any]
    with track_graph_compiling(cfg, "backward"):  # torch's ahead-of-time backward stage
        if example_inputs_unused(cfg.bw_compiler):
            # See Note [Compilers that ignore their example inputs] in aotkit_schemas
            bw_example = DeferredExamples(backward_examples, len(inputs))
        else:
            bw_example = backward_examples()
    disable_amp = autocast_at_compile()  # See Note [Compiled graphs run without autocast]
    # the compile's TracingContext (dynamo's), entered again for the backward: Inductor's
    # FX graph cache reads the ShapeEnv from it and bypasses the cache without one
    saved = TracingContext.try_get()
    done: list[Callable[..., Any]] = []

    def compile_backward() -> Callable[..., Any]:
        # See Note [Concurrent first calls]: threads making the first backward call of
        # one entry at once compile it once
        with COMPILE_LOCK:
            if not done:
                done.append(compile_now())
            return done[0]

    def compile_now() -> Callable[..., Any]:
        # Like torch, the backward is compiled at the first backward call, under the
        # forward's fake mode (and the forward's TracingContext); the autograd.Function
        # caches the result.
        context = (
            tracing(saved)
            if saved is not None and TracingContext.try_get() is None
            else contextlib.nullcontext()
        )
        no_amp = torch._C._DisableAutocast() if disable_amp else contextlib.nullcontext()
        # See Note [Full collections deferred during a compile]
        with (
            deferred_full_collections(),
            context,
            # looked up now: See Note [A restored entry's fake mode made when first needed]
            compiling_under_fakes(fake, cfg.bw_compiler),
            track_graph_compiling(cfg, "backward"),
        ):
            # See Note [Donated buffers reused by the backward's compiler] in aotkit_schemas
            with no_amp, compiler_kernel_choices(), donated_inputs_offered(bw_module, donated):
                raw = cfg.bw_compiler(bw_module, bw_example)
                compiled: Callable[..., Any] = backward_with_tokens(raw, n_bw_tokens)
        return keep_donation_mark(raw, run_without_autocast(compiled, disable_amp))

    return compile_backward


def training_call(
    partition: PartitionResult,
    fake: Sequence[Any],
    meta: ViewAndMutationMeta,
    cfg: AOTConfig,
    stale_tangents: tuple[tuple[int, str, str], ...],
    backward_mutated_inputs: tuple[int, ...],
    higher_order_blocked: str | None,
) -> Callable[[list[Any]], Sequence[Any]]:
    """Compile the forward now and the backward at its first call (no tensor subclasses);
    the autograd.Function. Shared with the on-disk cache's restore.
    ``higher_order_blocked``: See Note [Programs whose backward is not the forward's
    derivative]."""
    fw_module, bw_module = partition.fw_module, partition.bw_module
    # See Note [Effect tokens]: the forward's leading inputs and outputs are its tokens
    n_tok, n_bw_tok = len(meta.tokens), meta.num_backward_tokens
    # before the forward's compiler runs, which may change the graph
    graph_only = reads_graph_only(cfg.fw_compiler)
    ho = higher_order_plan(
        fw_module, meta, n_tok, partition.num_saved_tensors, higher_order_blocked,
        copy_now=not graph_only, trust_saved_inputs=graph_only,
    )
    # See Note [Restored inputs' fakes built when read]
    fw_example = examples_for(cfg.fw_compiler, fake)
    if n_tok:
        fw_example = [n.meta.get("val") for n in fw_module.graph.find_nodes(op="placeholder")]
    disable_amp = autocast_at_compile()  # See Note [Compiled graphs run without autocast]
    # See Note [Saved tensors keep the compiled forward's strides]
    with track_graph_compiling(cfg, "forward"), without_autocast_compiling(), (
        compiler_kernel_choices()  # See Note [Compilers see the caller's oneDNN setting]
    ), reported_output_strides() as fw_strides:
        compiled_fw = forward_with_tokens(cfg.fw_compiler(fw_module, fw_example), n_tok)
    compiled_fw = run_without_autocast(compiled_fw, disable_amp)
    saved_strides = saved_tensor_strides(fw_strides, partition)
    # donated positions count no effect tokens: none offered with tokens
    donated = None if n_bw_tok else meta.bw_donated_idxs
    compile_backward = _backward_compiler(partition, fake, cfg, n_bw_tok, saved_strides, donated)
    plan = AutogradPlan(
        meta=meta,
        num_saved_tensors=partition.num_saved_tensors,
        num_saved_symints=partition.num_saved_symints,
        tangent_deps=tangent_dependencies(
            bw_module,
            partition.num_saved_symints + partition.num_saved_tensors,
            len(meta.tangent_indices),
            n_bw_tok,
        ),
        plain_view_outputs=plain_view_outputs(fw_module, meta, n_tok),
        stale_tangents=stale_tangents,
        static_tangent_like=static_tangent_like(meta),
        gradless_inputs=gradless_inputs(bw_module, fake, meta, n_bw_tok),
        backward_mutated_inputs=backward_mutated_inputs,
        tangent_layouts=tangent_layouts(meta.traced_tangents),
        higher_order=ho if not isinstance(ho, str) else None,
        higher_order_blocked=ho if isinstance(ho, str) else "",
    )
    return make_autograd_function(compiled_fw, compile_backward, plan)

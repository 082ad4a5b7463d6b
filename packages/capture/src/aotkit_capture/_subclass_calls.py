"""Compile the desugared graphs of a tensor-subclass program and wrap them for the
runtime: the subclass counterpart of ``_compiled_calls`` (See Note [Tensor subclasses are
desugared] in aotkit_schemas).

The compiled graphs take and return plain tensors, effect tokens first (See Note [Effect
tokens]): ``forward_with_tokens`` / ``backward_with_tokens`` hide the tokens, then
``subclass_forward`` / ``subclass_backward`` flatten the user's values into the graphs'
and rebuild what they return. The autograd.Function works on the user's values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from aotkit_runtime import (
    AutogradPlan,
    as_list_caller,
    forward_with_tokens,
    make_autograd_function,
    subclass_backward,
    subclass_forward,
    tangent_layouts,
)
from aotkit_schemas import (
    AOTConfig,
    PartitionResult,
    SubclassCreationMeta,
    ViewAndMutationMeta,
    num_unwrapped,
)
from aotkit_tracing import (
    SubclassLayer,
    autocast_at_compile,
    compiler_kernel_choices,
    run_without_autocast,
    without_autocast_compiling,
)

from aotkit_capture.compile._compiled_calls import _backward_compiler, _no_grad_unless_grad_free
from aotkit_capture.compile._context import track_graph_compiling
from aotkit_capture.compile._graph_facts import tangent_dependencies
from aotkit_capture.compile._tracing_context_meta import inference_meta_in_tracing_context


def _example_inputs(gm: torch.fx.GraphModule) -> list[Any]:
    """The graph's placeholder values: tokens, then the inner tensors (all plain)."""
    return [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]


def subclass_inference_call(
    gm: torch.fx.GraphModule,
    fake: Sequence[Any],
    meta: ViewAndMutationMeta,
    cfg: AOTConfig,
    layer: SubclassLayer,
) -> Callable[[list[Any]], Sequence[Any]]:
    """Compile the desugared inference graph ``gm``; the call takes the user's values."""
    compiler = cfg.inference_compiler or cfg.fw_compiler
    disable_amp = autocast_at_compile()  # See Note [Compiled graphs run without autocast]
    with track_graph_compiling(cfg, "inference"), without_autocast_compiling(), (
        compiler_kernel_choices()  # See Note [Compilers see the caller's oneDNN setting]
    ):
        # See Note [Metadata in the TracingContext for Inductor's freezing]
        with inference_meta_in_tracing_context(meta, layer.inp_metas):
            raw = forward_with_tokens(compiler(gm, _example_inputs(gm)), len(meta.tokens))
    raw = run_without_autocast(raw, disable_amp)
    # flattening the inputs makes a new list, so a boxed graph may clear it
    raw = subclass_forward(raw, layer.inp_metas, layer.fw_out_metas)
    return _no_grad_unless_grad_free(as_list_caller(raw), fake)


def subclass_training_call(
    partition: PartitionResult,
    fake: Sequence[Any],
    meta: ViewAndMutationMeta,
    cfg: AOTConfig,
    layer: SubclassLayer,
    stale_tangents: tuple[tuple[int, str, str], ...],
) -> Callable[[list[Any]], Sequence[Any]]:
    """Compile the desugared forward now and the backward at its first call; the
    autograd.Function over the user's values. ``fake``: the joint's flat primals."""
    disable_amp = autocast_at_compile()  # See Note [Compiled graphs run without autocast]
    with track_graph_compiling(cfg, "forward"), without_autocast_compiling(), (
        compiler_kernel_choices()  # See Note [Compilers see the caller's oneDNN setting]
    ):
        compiled_fw = forward_with_tokens(
            cfg.fw_compiler(partition.fw_module, _example_inputs(partition.fw_module)),
            len(meta.tokens),
        )
    compiled_fw = run_without_autocast(compiled_fw, disable_amp)
    compile_backward = _backward_compiler(partition, fake, cfg, meta.num_backward_tokens)
    n_saved = partition.num_saved_symints + partition.num_saved_tensors

    def compile_subclass_backward() -> Callable[..., Any]:
        # See Note [Subclass gradients of plain outputs] in aotkit_runtime: copied before
        # the compiler sees (and may rewrite) the graph
        uncompiled = (
            _uncompiled_backward(partition.bw_module)
            if meta.num_backward_tokens == 0
            and any(not isinstance(m, SubclassCreationMeta) for m in layer.tangent_metas)
            else None
        )
        return subclass_backward(
            compile_backward(),
            n_saved,
            layer.tangent_metas,
            layer.grad_metas,
            tangent_layouts(layer.unwrap_tangents(meta.traced_tangents)),
            uncompiled,
        )

    # the Function works on the user's values; only the compiled calls see the inner
    # tensors, so the plan's graph-derived facts (positions in the graphs) are not used
    plan = AutogradPlan(
        meta=meta,
        num_saved_tensors=partition.num_saved_tensors,
        num_saved_symints=partition.num_saved_symints,
        tangent_deps=_user_tangent_deps(partition, layer, meta.num_backward_tokens),
        stale_tangents=stale_tangents,
        subclass_zeros=layer.zero_tangents(meta),
        tangent_layouts=tangent_layouts(meta.traced_tangents),
        # See Note [Programs whose backward is not the forward's derivative]
        higher_order_blocked="its graphs run on the inner tensors of tensor subclasses",
    )
    wrapped_fw = subclass_forward(compiled_fw, layer.inp_metas, layer.fw_out_metas)
    return make_autograd_function(wrapped_fw, compile_subclass_backward, plan)


def _uncompiled_backward(bw_module: torch.fx.GraphModule) -> Callable[[list[Any]], Sequence[Any]]:
    """The backward graph, run op by op (a copy of its nodes, sharing its attributes). See
    Note [Subclass gradients of plain outputs] in aotkit_runtime."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(bw_module.graph, {})
    graph.output(out)
    gm = torch.fx.GraphModule(bw_module, graph)

    def run(args: list[Any]) -> Sequence[Any]:
        result: Sequence[Any] = gm(*args)
        return result

    return run


def _user_tangent_deps(
    partition: PartitionResult, layer: SubclassLayer, n_bw_tokens: int
) -> tuple[frozenset[int], ...] | None:
    """For every user input's gradient, the user tangents it is computed from: the
    backward graph's dependencies between its inner tangents and inner gradients, grouped
    by subclass. See Note [Gradients through unused outputs] in aotkit_runtime."""
    n_saved = partition.num_saved_symints + partition.num_saved_tensors
    flat = tangent_dependencies(
        partition.bw_module, n_saved, num_unwrapped(layer.tangent_metas), n_bw_tokens
    )
    if flat is None or len(flat) != num_unwrapped(layer.grad_metas):
        return None
    owner = [k for k, m in enumerate(layer.tangent_metas) for _ in range(m.arg_count)]
    deps: list[frozenset[int]] = []
    for m in layer.grad_metas:
        start = m.flat_tensor_start_idx if isinstance(m, SubclassCreationMeta) else m.unwrapped_idx
        inner = frozenset().union(*flat[start : start + m.arg_count])
        deps.append(frozenset(owner[t] for t in inner))
    return tuple(deps)

"""Capturing functional ATen graphs: the inference graph and the joint graph.

Both are traced with make_fx over fake inputs, with a FunctionalTensorMode inside the
trace so that every mutation and view is replaced by its functional form. The inputs are
wrapped as FunctionalTensors inside the traced function and unwrapped at the end; the
updates of mutated inputs are returned as extra outputs (See Note [Forward graph calling
convention]) or, for MUTATED_IN_GRAPH inputs, copied back into the placeholder.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from aotkit_functional import (
    from_functional,
    from_native_functional,
    functionalized,
    natively_functionalized,
    needs_python_functionalization,
    to_functional,
    to_native_functional,
)
from aotkit_schemas import (
    DecompositionTable,
    InputAliasInfo,
    ViewAndMutationMeta,
)
from torch.autograd.grad_mode import _unsafe_preserve_version_counter
from torch.fx._lazy_graph_module import _use_lazy_graph_module
from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx

from aotkit_tracing._effects import (
    backward_tokens,
    begin_backward,
    drop_unused_effect_results,
    forward_tokens,
    install_tokens,
    num_tokens,
    token_inputs,
)
from aotkit_tracing._rng_replay import RngTimeline, keyed_rng, rng_forward_end
from aotkit_tracing._rng_states import rewrite_rng_states, trace_inference_rng
from aotkit_tracing._subclass import SubclassLayer
from aotkit_tracing.autocast._autocast_cache import (
    caller_cache_flag,
    cast_cache_leaf,
    wrapped_as_leaf,
)

from ._backward_mutations import (
    BACKWARD_MUTATED_INPUTS_KEY,
    BACKWARD_TAG,
    backward_written_inputs,
    check_backward_mutations,
    mutation_counts,
)
from ._direct_decompositions import direct_decompositions, fake_mode_of
from ._grad_mode_kernels import joint_kernel_choices
from ._joint_parts import STALE_TANGENTS_KEY, forward_returns, primal_grads
from ._kept_copies import record_kept_copy
from ._saved_detaches import (
    SavedOutputRecorder,
    forward_end,
    last_computed,
    match_python_mode_graph,
    nodes_made_so_far,
    tag_forward_and_backward,
)
from ._trace_scope import backward_spanning_scope
from ._unfunctionalized import trace_inference_unfunctionalized, trace_joint_unfunctionalized

FlatFn = Callable[..., Sequence[Any]]


def trace_inference(
    flat_fn: FlatFn,
    fake_args: Sequence[Any],
    meta: ViewAndMutationMeta,
    decompositions: DecompositionTable,
    subclasses: SubclassLayer | None = None,
    *,
    functionalize: bool = True,
) -> torch.fx.GraphModule:
    """Trace the inference graph: ``args -> forward returns`` (no saved values), with the
    effect tokens first on both sides when the program has effectful ops (See Note
    [Effect tokens]).

    With ``subclasses``, the graph takes and returns the inner tensors of the subclass
    inputs and returns (See Note [Tensor subclasses are desugared] in aotkit_schemas).
    """
    if not functionalize:  # See Note [Tracing without functionalization]
        return trace_inference_unfunctionalized(flat_fn, fake_args, meta, decompositions, subclasses)
    in_graph = meta.mutated_inp_in_graph_indices
    n_tokens = num_tokens(meta)

    def inference(*token_args: Any) -> tuple[Any, ...]:
        # See Note [Effect tokens]: ``(*tokens, *args) -> (*tokens, *forward returns)``
        tokens, args = token_args[:n_tokens], token_args[n_tokens:]
        with functionalized(keep_input_mutations=meta.keep_input_mutations) as mode:
            install_tokens(mode, meta, [to_functional(t) for t in tokens])
            # See Note [Autocast's cast cache in the trace]
            f_args = [to_functional(a, leaf=cast_cache_leaf(a)) for a in args]
            returns, _ = forward_returns(
                flat_fn, f_args, meta, for_autograd=False, cache_flag=cache_flag
            )
            # See Note [An output that is a kept-mutated input]
            returned_input = {
                j: i for j, r in enumerate(returns) for i in in_graph if r is f_args[i]
            }
            plain = [from_functional(r) for r in returns]
            updates = [from_functional(f_args[i]) for i in in_graph]
            out_tokens = [from_functional(t) for t in forward_tokens(mode, meta)]
        for i, new in zip(in_graph, updates, strict=True):
            apply_kept_mutation(args[i], new, meta.input_info[i])
        for j, i in returned_input.items():
            plain[j] = args[i]
        return (*out_tokens, *plain)


    cache_flag = caller_cache_flag()
    # Traced under the caller's grad mode: a function that calls torch.autograd.grad
    # itself needs it, and nothing here differentiates the result.
    if subclasses is not None:
        traced, flat_args = subclasses.desugar_forward(
            inference, [*token_inputs(meta), *fake_args]
        )
    else:
        traced, flat_args = inference, [*token_inputs(meta), *fake_args]
    # See Note [Generator states the function sets]
    gm = trace_inference_rng(
        lambda fn: make_fx(fn, decomposition_table=decompositions)(*flat_args), traced
    )
    if n_tokens:
        drop_unused_effect_results(gm)
    # Views that functionalization made and nothing reads (a synthetic-base member's view
    # before its write, say) are dropped, as torch drops them from its inference graph;
    # mutations, random ops and effect tokens' chains are impure or returned, and stay.
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def trace_joint(
    flat_fn: FlatFn,
    fake_args: Sequence[Any],
    meta: ViewAndMutationMeta,
    decompositions: DecompositionTable,
    *,
    native: bool = False,
    subclasses: SubclassLayer | None = None,
    functionalize: bool = True,
) -> tuple[torch.fx.GraphModule, list[Any]]:
    """Trace ``joint(primals, tangents) -> (*forward_returns, *input_grads)``; with
    effectful ops, ``primals`` start with the forward's tokens, the forward returns start
    with them, and the backward's tokens (``tangents_token`` placeholders) end the outputs
    (See Note [Effect tokens]).

    With ``subclasses``, over the inner tensors of subclass values (See Note [Tensor
    subclasses are desugared] in aotkit_schemas); the Python mode then always traces.

    See Note [Joint graph calling convention]. Returns the graph and its example inputs
    ``[primals, tangents]``. With ``native``, the trace functionalizes with the C++ key
    (See Note [Native functionalization]) and falls back to torch's Python mode when that
    fails or leaves an op the Python mode would have rewritten.
    """
    if not functionalize:  # See Note [Tracing without functionalization]
        return trace_joint_unfunctionalized(flat_fn, fake_args, meta, decompositions, subclasses)
    if subclasses is not None or not native:
        return _trace_joint(
            flat_fn, fake_args, meta, decompositions, native=False, subclasses=subclasses
        )
    try:
        traced = _trace_joint(flat_fn, fake_args, meta, decompositions, native=True)
    except Exception as e:  # the Python mode traces it or raises the user-facing error
        reason = f"the native trace failed: {type(e).__name__}: {_first_line(e)}"
    else:
        kept = next((n for n in traced[0].graph.nodes if needs_python_mode(n)), None)
        if kept is None:
            return traced
        reason = f"the native trace kept {kept.target}, which the Python mode rewrites"
    gm, inputs = _trace_joint(flat_fn, fake_args, meta, decompositions, native=False)
    # See Note [Why a graph took the path it took] in _paths
    gm.meta[NATIVE_FALLBACK_KEY] = reason
    return gm, inputs


# The joint's ``meta`` key naming why a native trace was thrown away for the Python mode's
NATIVE_FALLBACK_KEY = "aotkit_native_fallback"


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else ""


def needs_python_mode(node: torch.fx.Node) -> bool:
    """A node the native trace must not leave: an op the Python mode rewrites, a mutable
    op, or a call (HOP, custom op) other than getitem and symbolic-size arithmetic."""
    if node.op != "call_function":
        return False
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return not _is_plain_python_call(target)
    return target._schema.is_mutable or needs_python_functionalization(target)


def _is_plain_python_call(target: Any) -> bool:
    # getitem of multi-output ops; SymInt arithmetic (operator.mul, math.floor,
    # torch.sym_max, ...) with dynamic shapes
    module = getattr(target, "__module__", None)
    return (
        target is operator.getitem
        or module in ("_operator", "operator", "math")
        or getattr(target, "__name__", "").startswith("sym_")
    )


def apply_kept_mutation(original: torch.Tensor, new: torch.Tensor, info: InputAliasInfo) -> None:
    """Record an input mutation that stays in the graph: ``copy_`` (``set_`` for a storage
    swap), under no_grad when the program made it there (a leaf that requires grad may be
    written only so), without bumping the version counter when it was hidden from
    autograd (``.data``), as eager did."""
    if info.mutates_storage_metadata:
        # See Note [set_ on an input]: only kept when autograd need not see it
        with torch.no_grad():
            original.set_(new)  # type: ignore[call-overload]
    elif info.mutations_hidden_from_autograd:
        with torch.no_grad():
            # See Note [Kept mutations recorded directly]
            if not record_kept_copy(original, new, bump_version=False):
                with _unsafe_preserve_version_counter(original):
                    original.copy_(new)
    elif info.mutations_under_no_grad_or_inference_mode:
        with torch.no_grad():
            if not record_kept_copy(original, new, bump_version=True):
                original.copy_(new)
    elif not record_kept_copy(original, new, bump_version=True):
        original.copy_(new)


def last_graph_node() -> torch.fx.Node:
    """The newest non-placeholder node of the graph make_fx is building (placeholders made
    after the forward, like the single pass's tangents, do not count)."""
    mode = get_proxy_mode()
    assert mode is not None, "called inside make_fx"
    graph = mode.tracer.graph
    node = last_computed(graph)
    if node is None:  # a forward that ran no op (it returns its inputs)
        first: torch.fx.Node = next(iter(graph.nodes))
        return first
    return node


def _tag_nodes_after(mark: torch.fx.Node, tag: str) -> None:
    node = mark.next
    while node.op != "root":
        if node.op == "call_function":
            node.meta["partitioner_tag"] = tag
        node = node.next


def move_kept_mutations(
    gm: torch.fx.GraphModule, forward_end: torch.fx.Node, count: int
) -> torch.fx.Node:
    """Put the ``count`` trailing input mutations right after the forward, where torch has
    them (they are recorded after the backward); returns the new end of the forward. See
    Note [Input mutations kept in the training graph]."""
    mutations = [
        n
        for n in gm.graph.nodes
        if n.op == "call_function"
        and n.target in _KEPT_MUTATION_OPS
        and isinstance(n.args[0], torch.fx.Node)
        and n.args[0].op == "placeholder"
        and n.meta.get("partitioner_tag") != BACKWARD_TAG
    ][-count:]
    anchor = forward_end
    for n in mutations:
        anchor.append(n)
        anchor = n
    gm.recompile()
    return anchor


_KEPT_MUTATION_OPS = (torch.ops.aten.copy_.default, torch.ops.aten.set_.source_Tensor)


# Note [Input mutations kept in the training graph]
# With ``keep_inference_input_mutations=True``, torch keeps the data mutations of inputs
# that autograd does not need to see (buffers that do not require grad, or mutations made
# under no_grad) in the graph in training too, not only in inference: the joint ends its
# forward with ``copy_(primals_k, new_value)`` (``set_`` for a storage swap), the partitioner
# leaves that mutation at the end of the forward graph, and the runtime has nothing to copy
# back for it. ``mutation_can_stay_in_graph`` in aotkit_schemas decides which mutations
# qualify; the rest go through the epilogue as usual.


def _trace_joint(
    flat_fn: FlatFn,
    fake_args: Sequence[Any],
    meta: ViewAndMutationMeta,
    decompositions: DecompositionTable,
    *,
    native: bool,
    subclasses: SubclassLayer | None = None,
) -> tuple[torch.fx.GraphModule, list[Any]]:
    tangent_positions = meta.tangent_indices
    wrap = to_native_functional if native else to_functional
    unwrap = from_native_functional if native else from_functional

    def joint(primals: list[Any], tangents: list[Any]) -> list[Any]:
        # See Note [Effect tokens]: the forward's tokens are the leading primals; the
        # backward discovers its own (``tangents_token``)
        tokens, primals = primals[:n_tokens], primals[n_tokens:]
        ctx = (
            natively_functionalized()
            if native
            else functionalized(keep_input_mutations=False, allow_token_discovery=True)
        )
        # See Note [Contexts that span the backward trace]
        with backward_spanning_scope(), ctx as mode:
            install_tokens(mode, meta, [wrap(t) for t in tokens])
            # See Note [Autocast's cast cache in the trace]
            f_primals = [wrap(p, leaf=cast_cache_leaf(p)) for p in primals]
            f_tangents = [wrap(t) for t in tangents]
            with torch.enable_grad():
                returns, run_args = forward_returns(
                    flat_fn, f_primals, meta, for_autograd=True, cache_flag=cache_flag
                )
                # See Note [Input mutations kept in the training graph]
                kept_updates = [unwrap(f_primals[i]) for i in in_graph]
                forward_marks.append(nodes_made_so_far())
                rng_forward_end()  # See Note [Generator states the function sets]
                # See Note [Data mutations in the backward]
                counts_after_forward = mutation_counts(f_primals)
                outs_and_tangents = [
                    (k, returns[pos], f_tangents[k])
                    for k, pos in enumerate(tangent_positions)
                    if isinstance(returns[pos], torch.Tensor) and returns[pos].requires_grad
                ]
                if native:  # See Note [Detach nodes of saved outputs]
                    saved_outputs.watch([o for _, o, _ in outs_and_tangents])
                fw_tokens = forward_tokens(mode, meta)
                begin_backward(mode)
                try:
                    # a leaf's fresh clone is the leaf autograd saw (Note [Autocast's cast
                    # cache in the trace])
                    grads, failed = primal_grads(
                        outs_and_tangents,
                        [r if r is not f and wrapped_as_leaf(f) else f
                         for r, f in zip(run_args, f_primals, strict=True)],
                    )
                finally:
                    saved_outputs.close()
                stale_tangents.update(failed)
            # See Note [Metadata mutations in the backward]
            check_backward_mutations(primals, f_primals, tangents, f_tangents, meta)
            bw_written = backward_written_inputs(f_primals, counts_after_forward, meta)
            bw_updates = [unwrap(f_primals[i]) for i in bw_written]
            plain_returns = [unwrap(r) for r in returns]
            plain_grads = [unwrap(g) if g is not None else None for g in grads]
            plain_tokens = [unwrap(t) for t in fw_tokens]
            plain_bw_tokens = [unwrap(t) for t in backward_tokens(mode)]
        for i, new in zip(in_graph, kept_updates, strict=True):
            apply_kept_mutation(primals[i], new, meta.input_info[i])
        for i, new in zip(bw_written, bw_updates, strict=True):
            mark = last_graph_node()
            with torch.no_grad():  # checked at run time; See Note [Data mutations in the backward]
                primals[i].copy_(new)
            # a subclass input is written through each of its inner tensors: every node the
            # write made belongs to the backward, not just the last one
            _tag_nodes_after(mark, BACKWARD_TAG)
            if meta.input_info[i].requires_grad:
                bw_mutated_requiring_grad.append(i)
        return [*plain_tokens, *plain_returns, *plain_grads, *plain_bw_tokens]

    in_graph = meta.mutated_inp_in_graph_indices
    n_tokens = num_tokens(meta)
    forward_marks: list[list[torch.fx.Node]] = []
    bw_mutated_requiring_grad: list[int] = []
    stale_tangents: dict[int, tuple[str, str]] = {}
    saved_outputs = SavedOutputRecorder()
    primals = [*token_inputs(meta), *fake_args]
    tangents = list(meta.traced_tangents)
    cache_flag = caller_cache_flag()
    # The joint is read as a graph (partitioned), never run: its Python code is generated
    # only if someone asks for it (``gm.code``, a call).
    to_trace: Callable[[list[Any], list[Any]], list[Any]] = joint
    if subclasses is not None:
        to_trace, primals, tangents = subclasses.desugar_joint(joint, primals, tangents)
    with (
        torch.autograd.set_multithreading_enabled(False),
        _use_lazy_graph_module(True),
        joint_kernel_choices(),  # See Note [Kernels that read grad mode]
        direct_decompositions(fake_mode_of(primals)),  # See Note [Decompositions run directly on meta]
    ):
        timeline = RngTimeline()
        gm = make_fx(keyed_rng(to_trace, timeline), decomposition_table=decompositions)(
            primals, tangents
        )
    # See Note [RNG replay keys] and Note [Generator states the function sets]
    rewrite_rng_states(gm, timeline, forward_made=forward_marks[0])
    end = forward_end(gm.graph, forward_marks[0])  # See Note [Forward and backward tags]
    if in_graph:
        # a subclass input is written through each of its inner tensors
        n_kept = (
            sum(subclasses.inp_metas[i].arg_count for i in in_graph)
            if subclasses is not None
            else len(in_graph)
        )
        end = move_kept_mutations(gm, end, n_kept)
    # See Note [Forward and backward tags]
    tag_forward_and_backward(gm.graph, end)
    match_python_mode_graph(gm, saved_outputs)
    # See Note [Backward paths through stale saved values]
    gm.meta[STALE_TANGENTS_KEY] = stale_tangents
    gm.meta[BACKWARD_MUTATED_INPUTS_KEY] = tuple(bw_mutated_requiring_grad)
    return gm, [primals, tangents]

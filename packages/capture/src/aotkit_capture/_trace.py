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
    MutationType,
    OutputType,
    ViewAndMutationMeta,
)
from torch.autograd.grad_mode import _unsafe_preserve_version_counter
from torch.fx._lazy_graph_module import _use_lazy_graph_module
from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx

from ._autocast import backward_autocast
from ._autocast_cache import (
    caller_cache_flag,
    cast_cache_leaf,
    check_leaf_flags,
    eager_cast_cache,
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
from ._effects import (
    backward_tokens,
    begin_backward,
    drop_unused_effect_results,
    forward_tokens,
    install_tokens,
    num_tokens,
    token_inputs,
)
from ._grad_mode_kernels import joint_kernel_choices
from ._kept_copies import record_kept_copy
from ._node_meta import backward_node_meta
from ._rng_replay import RngTimeline, keyed_rng, rng_forward_end
from ._rng_states import rewrite_rng_states, trace_inference_rng
from ._saved_detaches import (
    SavedOutputRecorder,
    forward_end,
    last_computed,
    match_python_mode_graph,
    nodes_made_so_far,
    tag_forward_and_backward,
)
from ._subclass import SubclassLayer
from ._trace_scope import backward_spanning_scope
from ._unfunctionalized import trace_inference_unfunctionalized, trace_joint_unfunctionalized

FlatFn = Callable[..., Sequence[Any]]


def _fresh_input(arg: Any, info: InputAliasInfo, leaf: bool = False) -> Any:
    """An input that autograd can differentiate through after the function mutates it.

    torch.autograd.grad must see the value *before* the mutation, so, as in torch, a
    data-mutated input that requires grad after the call (``x.add_(y)`` makes ``x``
    require grad when ``y`` does) is replaced by a clone, and a metadata-mutated input by a
    trivial view, before the user's function runs.
    """
    if not isinstance(arg, torch.Tensor):
        return arg
    if info.mutates_data and info.requires_grad:
        if leaf:  # See Note [Autocast's cast cache in the trace]
            with torch.no_grad():
                fresh = _clone_keeping_strides(arg)
            return fresh.requires_grad_(True)
        return _clone_keeping_strides(arg)
    if info.mutates_metadata:
        return arg.view(arg.shape)
    return arg


def _clone_keeping_strides(arg: torch.Tensor) -> torch.Tensor:
    """A clone of ``arg`` with ``arg``'s strides. See Note [Fresh inputs keep their strides]."""
    out = arg.clone()
    strides = arg.stride()
    if any(isinstance(s, torch.SymInt) for s in strides) or out.stride() == strides:
        return out
    if any(st == 0 and n > 1 for n, st in zip(arg.size(), strides, strict=True)):
        return out  # overlapping memory cannot be written (eager rejects the mutation too)
    fresh = arg.new_empty_strided(arg.size(), strides)
    return fresh.copy_(arg)


# Note [Fresh inputs keep their strides]
# The function runs on the fresh clone of a data-mutated input that requires grad (see
# ``_fresh_input``), so every view op in the trace sees the clone's layout. ``clone()``
# keeps the strides of a dense input only: a sliced, stepped or expanded input would come
# out contiguous, and then ``reshape`` would trace as a view where eager copies (changing
# which outputs alias the input and how autograd flows through them), and ``view`` would
# succeed where eager raises "view size is not compatible with input tensor's size and
# stride". Such an input is cloned into memory with its own strides (``empty_strided`` +
# ``copy_``), so the trace sees eager's layout. (torch clones with ``clone()``.) Symbolic
# strides keep ``clone()``: comparing them would add guards.


def _forward_returns(
    flat_fn: FlatFn,
    f_args: list[Any],
    meta: ViewAndMutationMeta,
    *,
    for_autograd: bool,
    cache_flag: bool = False,
) -> tuple[list[Any], list[Any]]:
    """Run ``flat_fn`` on functional inputs; return (forward returns, inputs as run).
    ``cache_flag``: autocast's cache flag of the caller (See Note [Autocast's cast cache
    in the trace])."""
    run_args = list(f_args)
    if for_autograd:
        for i, info in enumerate(meta.input_info):
            if info.mutation_type is MutationType.MUTATED_OUT_GRAPH:
                run_args[i] = _fresh_input(f_args[i], info, leaf=wrapped_as_leaf(f_args[i]))
    leaves = [wrapped_as_leaf(a) for a in run_args]
    with eager_cast_cache(cache_flag):
        outs = list(flat_fn(*run_args))
    check_leaf_flags(run_args, leaves)
    bases: list[Any] = [None] * meta.num_intermediate_bases
    for o, out_info in zip(outs, meta.output_info, strict=True):
        if out_info.output_type is OutputType.alias_of_intermediate_save_as_output:
            assert out_info.base_idx is not None and isinstance(o, torch.Tensor)
            bases[out_info.base_idx] = o._base
    if any(b is None for b in bases):
        raise RuntimeError(
            "aotkit: the function's outputs alias its intermediates differently on the "
            "second trace than on the first; it is not deterministic under tracing."
        )
    mutated = [run_args[i] for i in meta.mutated_inp_runtime_indices]
    return [*mutated, *outs, *bases], run_args


# Note [An output that is a kept-mutated input]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# ``def f(a, b): return torch.sin(a, out=b)`` returns its input ``b``, and the inference
# graph keeps b's mutation as ``copy_(b, sin)``. torch's graph then returns the ``copy_``
# node (the input itself, written), not ``sin``; aotkit returns the input after its kept
# write too, so the graph text is torch's. The values are the same either way; the
# runtime regenerates outputs that alias inputs from the inputs.


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
            returns, _ = _forward_returns(
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
                returns, run_args = _forward_returns(
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
    stale_tangents: dict[int, str] = {}
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


# Note [Backward paths through stale saved values]
# An output can depend on a value autograd saved before the function modified it in place
# (``y = x.sin(); x.add_(1); buf.add_(y.mean())``: ``buf``'s gradient needs sin's saved
# ``x``). Eager raises autograd's "modified by an inplace operation" error only if the user
# backpropagates through that output. The joint graph differentiates every
# tangent-receiving output at trace time, so when that raises, each output is
# differentiated on its own; the ones that fail are left out of the joint (their tangents
# go unused) and recorded in ``gm.meta[STALE_TANGENTS_KEY]`` (tangent index -> autograd's
# message). The compiled backward raises the same message when it receives a gradient for
# one of those outputs, so the error appears exactly when eager's would, and after the
# gradients autograd accumulates before reaching a node (``return y, leaf``: the leaf's
# ``.grad`` is set, then backward raises, as in eager).
#
# The same holds for every error a backward node raises when autograd reaches it and only
# then, which the joint would otherwise raise at the call: a custom op registered without
# an autograd formula (``torch.library.custom_op`` with no ``register_autograd``: the
# forward runs, and eager's "Trying to backward through ... but no autograd formula was
# registered" comes at backward, and only through outputs computed from the op).
STALE_TANGENTS_KEY = "aotkit_stale_tangents"
_RAISED_WHEN_REACHED = (
    "modified by an inplace operation",
    "but no autograd formula was registered",
)


def _raised_when_reached(e: RuntimeError) -> bool:
    """Whether eager raises ``e`` only when a backward reaches the node that raised it."""
    text = str(e)
    return any(marker in text for marker in _RAISED_WHEN_REACHED)


def primal_grads(
    outs_and_tangents: Sequence[tuple[int, torch.Tensor, torch.Tensor]],
    f_primals: Sequence[Any],
) -> tuple[list[Any], dict[int, str]]:
    """Gradients of the outputs for every primal (None where it does not require grad),
    and the outputs that could not be differentiated (See Note [Backward paths through
    stale saved values])."""
    grads: list[Any] = [None] * len(f_primals)
    diff = [
        (i, p) for i, p in enumerate(f_primals) if isinstance(p, torch.Tensor) and p.requires_grad
    ]
    if not outs_and_tangents or not diff:
        return grads, {}
    # See Note [Preserved node meta] and Note [Autocast in the backward trace]
    with backward_node_meta([o for _, o, _ in outs_and_tangents]), backward_autocast():
        computed, failed = _input_grads(outs_and_tangents, [p for _, p in diff])
    for (i, _), g in zip(diff, computed, strict=True):
        grads[i] = g
    return grads, failed


def _input_grads(
    outs_and_tangents: Sequence[tuple[int, torch.Tensor, torch.Tensor]],
    inputs: Sequence[torch.Tensor],
) -> tuple[list[Any], dict[int, str]]:
    """Gradients of the outputs w.r.t. ``inputs``; see Note [Backward paths through stale
    saved values] for the outputs that cannot be differentiated."""
    try:
        return list(
            torch.autograd.grad(
                [o for _, o, _ in outs_and_tangents],
                list(inputs),
                grad_outputs=[t for _, _, t in outs_and_tangents],
                allow_unused=True,
                retain_graph=True,
            )
        ), {}
    except RuntimeError as e:
        if not _raised_when_reached(e):
            raise
    totals: list[Any] = [None] * len(inputs)
    failed: dict[int, str] = {}
    for k, out, tangent in outs_and_tangents:
        try:
            partial = torch.autograd.grad(
                [out], list(inputs), grad_outputs=[tangent], allow_unused=True, retain_graph=True
            )
        except RuntimeError as e:
            if not _raised_when_reached(e):
                raise
            failed[k] = str(e)
            continue
        totals = [
            g if total is None else (total if g is None else total + g)
            for total, g in zip(totals, partial, strict=True)
        ]
    return totals, failed

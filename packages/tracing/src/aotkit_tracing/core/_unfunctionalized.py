"""Tracing without functionalization: ``disable_functionalization=True``.

# Note [Tracing without functionalization]
# torch's AOTAutograd takes ``disable_functionalization=True`` (aot_function,
# compiled_function, aot_module_simplified) and then traces the joint and the inference
# graph with plain make_fx, without its functionalization mode: every in-place op the
# program (or its autograd.Function's backward) runs stays in the graph as that op
# (``_foreach_mul_``, ``sin_``, the clone autograd makes of a value an in-place op
# overwrites but its backward reads), where it ran, forward or backward. It is an opt-in
# for compilers that handle mutation themselves; aotkit gives the same graphs:
#   * the metadata pass still runs functionalized (what is mutated, what aliases what);
#   * the forward ends at the last node the forward recorded; everything after it is the
#     backward's, so a backward's write to a saved activation is in the backward graph;
#   * an input mutation that may stay in the graph (Note [Input mutations kept in the
#     training graph]) is the op the program ran on the input itself, not a ``copy_`` at
#     the end; one the runtime applies gets the input's value after the call as its
#     forward return (the runtime's copy is then a copy onto itself, or, for an input that
#     requires grad and was cloned first, the write back);
#   * the partitioner keeps every mutating op (an op with a mutable schema is a side
#     effect) in the graph that ran it.
#   * effectful ops (``_linalg_check_errors``, which every ``torch.linalg`` solver runs, a
#     custom op registered effectful) are traced as the plain calls they are, with no
#     effect tokens: the tokens come from functionalization, and torch clears the ones the
#     metadata pass found on this path. fx and the partitioners count an effectful op as
#     impure, so it stays where it ran even though nothing reads its result, and the
#     error it raises at run time (a singular matrix) is raised as in eager.
#   * random ops are keyed and generator states replayed as on the functionalized path
#     (Note [RNG replay keys], Note [Generator states the function sets]).
# Not supported, with an error naming the cause: tensor-subclass inputs, whose desugaring
# relies on functionalization (torch drops them on this path).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from aotkit_schemas import DecompositionTable, ViewAndMutationMeta
from torch.fx._lazy_graph_module import _use_lazy_graph_module
from torch.fx.experimental.proxy_tensor import make_fx

from aotkit_tracing._errors import AOTCompileError
from aotkit_tracing._rng_replay import RngTimeline, keyed_rng, rng_forward_end
from aotkit_tracing._rng_states import rewrite_rng_states, trace_inference_rng

from ._backward_mutations import BACKWARD_MUTATED_INPUTS_KEY, BACKWARD_TAG
from ._joint_parts import STALE_TANGENTS_KEY, forward_returns, primal_grads
from ._saved_detaches import forward_end, nodes_made_so_far, tag_forward_and_backward
from ._trace_scope import backward_spanning_scope


def _check_supported(meta: ViewAndMutationMeta, subclasses: Any) -> None:
    if subclasses is not None:
        raise AOTCompileError(
            "disable_functionalization=True is not supported with tensor subclass inputs "
            "(their desugaring relies on functionalization). Remedy: leave "
            "disable_functionalization at False. See Note [Tracing without functionalization]."
        )
    # the caller cleared the tokens (``without_effect_tokens``)
    assert not meta.tokens, "effect tokens on the disable_functionalization path"


def without_effect_tokens(meta: ViewAndMutationMeta, disable_functionalization: bool) -> ViewAndMutationMeta:
    """The metadata pass's ``meta`` for the graphs traced without functionalization: no
    effect tokens. See Note [Tracing without functionalization]."""
    if not disable_functionalization or not (meta.tokens or meta.num_backward_tokens):
        return meta
    return dataclasses.replace(meta, tokens={}, num_backward_tokens=0)


def trace_joint_unfunctionalized(
    flat_fn: Any,
    fake_args: Sequence[Any],
    meta: ViewAndMutationMeta,
    decompositions: DecompositionTable,
    subclasses: Any = None,
) -> tuple[torch.fx.GraphModule, list[Any]]:
    """The joint ``(primals, tangents) -> (*forward returns, *input grads)`` with the
    program's mutations left in place. See Note [Tracing without functionalization]."""
    _check_supported(meta, subclasses)
    forward_marks: list[list[torch.fx.Node]] = []
    stale: dict[int, tuple[str, str]] = {}

    def joint(primals: list[Any], tangents: list[Any]) -> list[Any]:
        # See Note [Contexts that span the backward trace]
        with backward_spanning_scope(), torch.enable_grad():
            returns, _ = forward_returns(flat_fn, list(primals), meta, for_autograd=True)
            forward_marks.append(nodes_made_so_far())
            rng_forward_end()  # See Note [Generator states the function sets]
            outs_and_tangents = [
                (k, returns[pos], tangents[k])
                for k, pos in enumerate(meta.tangent_indices)
                if isinstance(returns[pos], torch.Tensor) and returns[pos].requires_grad
            ]
            grads, failed = primal_grads(outs_and_tangents, primals)
        stale.update(failed)
        return [*returns, *grads]

    primals = list(fake_args)
    tangents = list(meta.traced_tangents)
    with torch.autograd.set_multithreading_enabled(False), _use_lazy_graph_module(True):
        timeline = RngTimeline()
        gm = make_fx(keyed_rng(joint, timeline), decomposition_table=decompositions)(
            primals, tangents
        )
    # See Note [RNG replay keys] and Note [Generator states the function sets]
    rewrite_rng_states(gm, timeline, forward_made=forward_marks[0])
    end = forward_end(gm.graph, forward_marks[0])  # See Note [Forward and backward tags]
    _pin_backward_mutations(end)
    tag_forward_and_backward(gm.graph, end)
    gm.meta[STALE_TANGENTS_KEY] = stale
    gm.meta[BACKWARD_MUTATED_INPUTS_KEY] = ()
    return gm, [primals, tangents]


def _pin_backward_mutations(forward_end: torch.fx.Node) -> None:
    """A mutating op the backward ran (on a saved activation, say) stays in the backward
    graph even though nothing reads its result."""
    node = forward_end.next
    while node.op != "root":
        target = node.target
        if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
            node.meta["partitioner_tag"] = BACKWARD_TAG
        node = node.next


def trace_inference_unfunctionalized(
    flat_fn: Any,
    fake_args: Sequence[Any],
    meta: ViewAndMutationMeta,
    decompositions: DecompositionTable,
    subclasses: Any = None,
) -> torch.fx.GraphModule:
    """The inference graph ``args -> forward returns`` with the program's mutations left in
    place. See Note [Tracing without functionalization]."""
    _check_supported(meta, subclasses)

    def inference(*args: Any) -> tuple[Any, ...]:
        returns, _ = forward_returns(flat_fn, list(args), meta, for_autograd=False)
        return tuple(returns)

    # See Note [Generator states the function sets]
    gm = trace_inference_rng(
        lambda fn: make_fx(fn, decomposition_table=decompositions)(*fake_args), inference
    )
    # no dead-code elimination: torch keeps the unused getitems too
    gm.recompile()
    return gm

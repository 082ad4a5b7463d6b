"""Mutations that a traced backward makes to the joint graph's inputs.

# Note [Metadata mutations in the backward]
# A custom autograd.Function's backward can mutate what it saved, e.g. ``b.transpose_(1, 0)``
# on a saved input. Eager then leaves the caller's ``b`` transposed after ``backward()``.
# The joint graph cannot express that: the backward graph runs later, on its own inputs,
# and nothing replays a metadata change onto the caller's tensor. torch refuses such
# programs while tracing the joint graph, and so does aotkit, with torch's messages:
#   * a forward input (primal) whose size, stride or storage offset changed during the
#     backward, unless the forward itself mutated its metadata (that mutation is
#     handled by the epilogue): BACKWARD_INPUT_METADATA_MUTATION;
#   * a tangent (an input of the backward) whose metadata changed:
#     BACKWARD_TANGENT_METADATA_MUTATION.
# ``check_backward_mutations`` runs inside the joint function, after the backward, on the
# functional wrappers of the primals and tangents (Python FunctionalTensors or, See Note
# [Native functionalization], C++ FunctionalTensorWrappers, whose own sizes and strides
# show the change).

# Note [Data mutations in the backward]
# A custom backward may write to a forward input under no_grad (a buffer it keeps, like
# Float8's amax history; ``ctx.x1.zero_()``). Eager leaves the caller's tensor written after
# ``backward()``. As in torch, the joint records that write as ``copy_(primal, new_value)``
# after the backward, tagged ``must_be_in_backward`` so the partitioner puts it in the
# backward graph (the primal is saved for it), and the caller's tensor is written when
# the compiled backward runs, not before. An input the forward wrote too, with the write
# kept in the forward graph (Note [Input mutations kept in the training graph]), gets
# both writes, in order; the backward's carries the value after both passes. Any other
# forward change of that input (its size, stride or storage, or a write the epilogue
# replays, which would also bump the version of the primal saved for the backward's
# write) raises BACKWARD_AND_FORWARD_DATA_MUTATION rather than losing a change. An input that requires grad keeps working for a plain
# backward; a backward that records a graph (``create_graph=True``) raises torch's
# BACKWARD_MUTATION_CREATE_GRAPH at run time, since the write would need a grad_fn.
# ``mutation_count`` readings taken after the forward and after the backward tell the
# writes apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from aotkit_functional import has_metadata_mutation, mutation_count
from aotkit_schemas import MutationType, ViewAndMutationMeta

BACKWARD_INPUT_METADATA_MUTATION = (
    "Found a graph input that had its metadata mutated in the backward. This is not supported"
)
BACKWARD_AND_FORWARD_DATA_MUTATION = (
    "aotkit: graph input {idx} is written by the backward (a custom autograd.Function's "
    "backward mutates it, or a torch.utils.checkpoint region that the backward recomputes "
    "updates it, as BatchNorm's running stats) and also changed by the forward in a way the forward graph does "
    "not keep (its size, stride or storage, or a data write replayed after the graph). "
    "That is not supported: the two changes cannot both reach the caller's tensor in "
    "order. Fix: pass keep_inference_input_mutations=True and make the forward's write "
    "under torch.no_grad() (or to an input that does not require grad), or write a "
    "separate buffer in the backward."
)
# gm.meta key: the inputs that require grad and are written by the backward
BACKWARD_MUTATED_INPUTS_KEY = "aotkit_backward_mutated_inputs"
BACKWARD_TAG = "must_be_in_backward"
BACKWARD_TANGENT_METADATA_MUTATION = (
    "Found an input to the backward that had metadata mutated during the backward pass. "
    "This is not supported"
)


def check_backward_mutations(
    primals: Sequence[Any],
    f_primals: Sequence[Any],
    tangents: Sequence[Any],
    f_tangents: Sequence[Any],
    meta: ViewAndMutationMeta,
) -> None:
    """Raise AssertionError for a metadata mutation made by the backward. ``primals`` and
    ``tangents`` are the joint's inputs, ``f_primals``/``f_tangents`` their functional
    wrappers after the forward and backward ran. See Note [Metadata mutations in the
    backward]."""
    for before, after, info in zip(primals, f_primals, meta.input_info, strict=True):
        if not info.mutates_metadata and has_metadata_mutation(after, before):
            raise AssertionError(BACKWARD_INPUT_METADATA_MUTATION)
    for before, after in zip(tangents, f_tangents, strict=True):
        if has_metadata_mutation(after, before):
            raise AssertionError(BACKWARD_TANGENT_METADATA_MUTATION)


def mutation_counts(f_primals: Sequence[Any]) -> list[int]:
    """Data-mutation counters of the primals' functional wrappers (0 for non-tensors)."""
    return [mutation_count(p) if isinstance(p, torch.Tensor) else 0 for p in f_primals]


def backward_written_inputs(
    f_primals: Sequence[Any], after_forward: Sequence[int], meta: ViewAndMutationMeta
) -> list[int]:
    """Primals whose data the backward wrote. See Note [Data mutations in the backward]."""
    written = []
    for i, (p, before) in enumerate(zip(f_primals, after_forward, strict=True)):
        if not isinstance(p, torch.Tensor) or mutation_count(p) == before:
            continue
        info = meta.input_info[i]
        if (
            info.mutates_metadata
            or info.mutates_storage_metadata
            or info.mutation_type is MutationType.MUTATED_OUT_GRAPH
        ):
            raise AssertionError(BACKWARD_AND_FORWARD_DATA_MUTATION.format(idx=i))
        written.append(i)
    return written

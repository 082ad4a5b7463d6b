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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aotkit_functional import has_metadata_mutation
from aotkit_schemas import ViewAndMutationMeta

BACKWARD_INPUT_METADATA_MUTATION = (
    "Found a graph input that had its metadata mutated in the backward. This is not supported"
)
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

"""Mutation and aliasing: inputs that alias each other (dedupe and synthetic bases).

See Note [Duplicate and aliased inputs] in aotkit_analysis. Expected MutationTypes here are
per *compiled* input (after dedupe and synthetic bases), so they are only checked against
aotkit, not against torch's metadata pass on the user's inputs.
"""

from __future__ import annotations

from corpus import (
    NM,
    OF_INPUT,
    OUT_GRAPH,
    TorchDiffers,
    case_registrar,
    nonleaf,
    rand,
)

case = case_registrar("mutation")



def _base_and_flat_view():
    x = rand(3, 4)
    return x, x.view(-1)


def _grad_base_and_views():
    x = nonleaf(4, 4)
    return x, x[1], x.t()


def _two_overlapping_slices():
    x = rand(6)
    return x[0:4], x[2:6]


def _two_overlapping_slices_with_grad():
    x = nonleaf(6)
    return x[0:4], x[2:6]


def _two_disjoint_rows():
    x = rand(4, 3)
    return x[0], x[1], x[2:]


def _same_tensor_twice():
    x = rand(3, 4)
    return x, x


def _same_grad_tensor_twice():
    x = nonleaf(3, 4)
    return x, x, rand(3, 4, grad=True)


# ---- duplicates ------------------------------------------------------------------------


@case(inputs=_same_tensor_twice, expect_inputs=(NM,))
def duplicate_inputs_read_only(x, y):
    return x * y + x


@case(inputs=_same_tensor_twice, expect_inputs=(OUT_GRAPH,), boxed=True)
def duplicate_inputs_one_mutated(x, y):
    x.add_(1)
    return y * 2


@case(inputs=_same_grad_tensor_twice, expect_inputs=(OUT_GRAPH, NM))
def duplicate_grad_inputs_one_mutated(x, y, z):
    y.mul_(z)
    return x + 1


@case(inputs=lambda: (rand(3, grad=True),) * 2, expect_inputs=(NM,))
def duplicate_leaf_inputs_gradient_accumulates(x, y):
    return x * y


# ---- synthetic bases -------------------------------------------------------------------


@case(inputs=_base_and_flat_view, boxed=True)
def aliased_base_and_view_view_mutated(x, flat):
    flat.mul_(2)
    return x + 1


@case(inputs=_base_and_flat_view)
def aliased_base_and_view_base_mutated(x, flat):
    x[0].zero_()
    return flat * 1


@case(
    inputs=_base_and_flat_view,
    expect_outputs=(OF_INPUT, OF_INPUT),
    torch_differs=TorchDiffers(
        "torch fails view replay of an output of a synthetic-base input", raises=True
    ),
)
def aliased_inputs_mutated_and_returned_as_views(x, flat):
    flat[:4].add_(1)
    return x[0], flat[2:]


@case(inputs=_grad_base_and_views)
def aliased_grad_inputs_view_mutated(x, row, xt):
    row.mul_(2)
    return x.sum(0), xt * 1


@case(inputs=_grad_base_and_views)
def aliased_grad_inputs_base_mutated(x, row, xt):
    x.add_(1)
    return row * xt[0]


@case(inputs=_two_overlapping_slices)
def aliased_overlapping_slices_one_mutated(a, b):
    a.mul_(10)
    return b + 1


@case(inputs=_two_overlapping_slices_with_grad)
def aliased_overlapping_slices_with_grad(a, b):
    b.add_(1)
    return a * 2


@case(inputs=_two_disjoint_rows)
def aliased_storage_disjoint_rows_mutated(r0, r1, rest):
    r0.add_(r1)
    rest.mul_(2)
    return r0 * r1


@case(inputs=_base_and_flat_view)
def aliased_inputs_metadata_mutation_only(x, flat):
    flat.unsqueeze_(0)
    return x * 2


@case(inputs=_base_and_flat_view)
def aliased_inputs_read_only(x, flat):
    return x.sum() + flat.sum()


# Both inputs are regenerated from the synthetic base inside the graph (``x``, the base
# itself, with ``as_strided`` too, as torch does), so the metadata calls each an alias of
# its input, as torch's does; the runner still hands back the caller's ``x`` and ``flat``
# themselves, as eager returns them.
@case(
    inputs=_base_and_flat_view,
    expect_outputs=(OF_INPUT, OF_INPUT),
    torch_differs=TorchDiffers("inputs returned from a synthetic base come back as new views"),
)
def aliased_inputs_mutated_and_returned_themselves(x, flat):
    flat.add_(1)
    return x, flat


@case(inputs=_grad_base_and_views)
def aliased_grad_inputs_data_and_metadata_mutations(x, row, xt):
    row.mul_(2)
    xt.t_()
    return xt * 1, row.sum()


@case(inputs=_two_overlapping_slices)
def aliased_slices_metadata_mutation_of_the_other(a, b):
    a.add_(1)
    b.unsqueeze_(1)
    return b * 2


def _base_and_expanded_view():
    x = rand(4)
    return x, x.unsqueeze(0).expand(2, 4)


@case(
    inputs=_base_and_expanded_view,
    torch_differs=TorchDiffers("the write-back through the expanded member overlaps", raises=True),
    aotkit_bug=(
        "a mutation of an input that is an expanded view of another input: the synthetic "
        "base writes the member back with as_strided_scatter, which rejects overlapping "
        "memory (eager allows the write through a non-overlapping slice of it)"
    ),
)
def aliased_input_expanded_from_another(x, expanded):
    row = expanded[0:1]
    row.add_(1.5)
    return (row,)


def _two_views_of_a_buffer_and_a_grad_input():
    x = rand(2, 2)
    return x.view(-1), x.view(-1), rand(2, 2, grad=True)


@case(inputs=_two_views_of_a_buffer_and_a_grad_input)
def mutated_view_aliases_another_input_in_training(a, b, c):
    # torch's test_input_mutation_aliases_and_none_require_gradients: ``b`` must see the
    # mutation made through ``a`` (a training graph, since ``c`` requires grad)
    a.mul_(2)
    return b + 1, c + 1


@case(inputs=_two_views_of_a_buffer_and_a_grad_input, keep_inference_input_mutations=True)
def mutated_view_aliases_another_input_in_training_kept(a, b, c):
    a.mul_(2)
    return b + 1, c + 1

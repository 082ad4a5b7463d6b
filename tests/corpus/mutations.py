"""Mutation and aliasing: data, metadata and storage mutations of inputs.

See Note [Input mutation kinds] in aotkit_schemas. Each case names the MutationType aotkit
(and torch's metadata pass) must give every tensor input.
"""

from __future__ import annotations

import torch

from corpus import (
    IN_GRAPH,
    IS_INPUT,
    NA,
    NM,
    OF_INPUT,
    OUT_GRAPH,
    TorchDiffers,
    case_registrar,
    nonleaf,
    rand,
)

case = case_registrar("mutation")



# ---- global and closure tensors, lifted as inputs (Note [Global tensors lifted as inputs])
# The factories rebind the globals, so each run (and each call) reads a fresh tensor: a
# compiled function that kept the first one would be caught. The programs return the
# globals' values after their mutations, so the harness compares them with eager's.

_GLOBAL_STATE = torch.zeros(4)
_GLOBAL_WEIGHT = torch.ones(4)
_GLOBALS_FAIL_IN_TORCH = TorchDiffers(
    "torch's AOTAutograd fails on a tensor that is not an input", raises=True
)


def _with_fresh_globals(*args):
    global _GLOBAL_STATE, _GLOBAL_WEIGHT
    _GLOBAL_STATE = rand(4)
    _GLOBAL_WEIGHT = rand(4, grad=True)
    return args


@case(
    inputs=lambda: _with_fresh_globals(rand(4, grad=True)),
    expect_inputs=(NM, OUT_GRAPH, NM),
    torch_differs=_GLOBALS_FAIL_IN_TORCH,
)
def global_tensor_mutated_and_read(x):
    _GLOBAL_STATE.mul_(0.5).add_(x.detach())
    return (x * _GLOBAL_WEIGHT).sin(), _GLOBAL_STATE * 1


def _step_global(x):
    _GLOBAL_STATE.copy_(x.detach().cos())


@case(
    inputs=lambda: _with_fresh_globals(rand(4, grad=True)),
    expect_inputs=(NM, OUT_GRAPH),
    torch_differs=_GLOBALS_FAIL_IN_TORCH,
)
def global_tensor_mutated_by_a_helper(x):
    _step_global(x)
    return x.exp() + _GLOBAL_STATE


def _closure_counter():
    count = torch.zeros(())

    def bump(x):
        count.add_(1)
        return x * count, count * 1

    return bump


def _fresh_closure(*args):
    _CLOSURE_BUMP.__closure__[0].cell_contents = torch.zeros(())  # the cell rebound
    return args


@case(
    inputs=lambda: _fresh_closure(rand(3, grad=True)),
    expect_inputs=(NM, OUT_GRAPH),
    torch_differs=_GLOBALS_FAIL_IN_TORCH,
)
def closure_tensor_mutated(x):
    return _CLOSURE_BUMP(x)


_CLOSURE_BUMP = _closure_counter()


# ---- data mutations --------------------------------------------------------------------


@case(inputs=lambda: (rand(3, 4), rand(3, 4, grad=True)), expect_inputs=(OUT_GRAPH, NM), boxed=True)
def data_mutation_of_input_without_grad(x, y):
    x.add_(1)
    return x * y


@case(inputs=lambda: (nonleaf(3, 4), rand(3, 4, grad=True)), expect_inputs=(OUT_GRAPH, NM))
def data_mutation_of_input_with_grad(x, y):
    x.mul_(y)
    return x.sum(1)


@case(inputs=lambda: (rand(3, 4), rand(3, 4)), expect_inputs=(OUT_GRAPH, NM))
def data_mutation_inference(x, y):
    x.mul_(2).add_(y)
    return y + 1


@case(inputs=lambda: (rand(4, 4), rand(4)), expect_inputs=(OUT_GRAPH, NM))
def data_mutation_through_select(x, y):
    x[0].add_(1)
    x[:, 1].mul_(y)
    return x.sum()


@case(inputs=lambda: (nonleaf(4, 4), rand(4, grad=True)), expect_inputs=(OUT_GRAPH, NM), boxed=True)
def data_mutation_through_view_with_grad(x, y):
    x[0].add_(y)
    return (x * 2,)


@case(inputs=lambda: (rand(4, 6),), expect_inputs=(OUT_GRAPH,))
def data_mutation_through_view_of_view(x):
    x.t()[1:][:, ::2].unsqueeze(0).mul_(-1)
    return x.cos()


@case(inputs=lambda: (rand(3, 4), rand(3, 4)), expect_inputs=(OUT_GRAPH, NM))
def data_mutation_zero_fill_clamp(x, y):
    x[0].zero_()
    x[1].fill_(2.0)
    x.clamp_(min=-0.5)
    return x + y


@case(inputs=lambda: (rand(3, 4), rand(3, 4, grad=True)), expect_inputs=(OUT_GRAPH, NM))
def data_mutation_copy_from_grad_input(x, y):
    # x does not require grad before the call, but does afterwards
    x.copy_(y * 2)
    return x.exp()


@case(inputs=lambda: (rand(5), rand(5)), expect_inputs=(OUT_GRAPH, NM))
def data_mutation_setitem_and_index_put(x, y):
    x[1:3] = 7.0
    x[torch.tensor([0, 4])] = y[:2]
    return x * 1


@case(inputs=lambda: (rand(3), rand(3), rand(3)), expect_inputs=(OUT_GRAPH, NM, NM))
def data_mutation_out_variant(x, y, z):
    torch.add(y, z, out=x)
    return x * y


@case(inputs=lambda: (rand(3, 4),), expect_inputs=(OUT_GRAPH,))
def data_mutation_repeated(x):
    for _ in range(3):
        x.mul_(2)
        x.sub_(1)
    return x.sum(0)


@case(inputs=lambda: (rand(4), rand(4, grad=True)), expect_outputs=(IS_INPUT,), expect_inputs=(OUT_GRAPH, NM))
def mutated_input_also_returned(x, y):
    x.add_(y)
    return x


@case(inputs=lambda: (nonleaf(4), rand(4)), expect_outputs=(IS_INPUT, NA), expect_inputs=(OUT_GRAPH, NM))
def mutated_grad_input_also_returned(x, y):
    x.mul_(y)
    return x, x * 2


@case(inputs=lambda: (rand(3, 4),), expect_outputs=(OF_INPUT,), expect_inputs=(OUT_GRAPH,))
def view_of_input_taken_before_mutation(x):
    v = x.view(-1)
    x.add_(1)
    return v


@case(inputs=lambda: (nonleaf(3, 4),), expect_outputs=(OF_INPUT, OF_INPUT), expect_inputs=(OUT_GRAPH,))
def views_of_grad_input_around_mutation(x):
    a = x[0]
    x.mul_(3)
    b = x.t()
    return a, b


@case(inputs=lambda: (rand(4), rand(4)), expect_outputs=(NA,), expect_inputs=(OUT_GRAPH, OUT_GRAPH))
def mutates_two_inputs_returns_none(x, y):
    x.add_(1)
    y.mul_(x)
    return y.sum(), None


@case(
    inputs=lambda: (rand(4, grad=True), nonleaf(4)),
    expect_inputs=(NM, OUT_GRAPH),
    torch_differs=TorchDiffers("the leaf behind y gets a zero .grad instead of None"),
)
def grad_input_mutated_but_feeding_no_output(x, y):
    y.add_(1.5)
    return x.sin()


@case(inputs=lambda: (rand(3, 4),), expect_outputs=(NA,), expect_inputs=(NM,))
def mutation_of_intermediate_only(x):
    y = x.clone()
    y[0].zero_()
    y.t_()
    return y * 2


@case(inputs=lambda: (rand(3, 3, grad=True),), expect_inputs=(NM,))
def mutation_of_intermediate_view_with_grad(x):
    y = x * 2
    y.diagonal().mul_(0)
    return y


# ---- under no_grad, hidden from autograd -----------------------------------------------


@case(inputs=lambda: (rand(3, grad=True), rand(3, grad=True)), expect_inputs=(OUT_GRAPH, NM))
def leaf_mutated_under_no_grad(w, x):
    with torch.no_grad():
        w.add_(1)
    return w * x


@case(inputs=lambda: (nonleaf(3, 4), rand(3, 4, grad=True)), expect_inputs=(OUT_GRAPH, NM))
def view_mutated_under_no_grad(x, y):
    with torch.no_grad():
        x[0].mul_(2)
    return x * y


@case(inputs=lambda: (rand(3, grad=True),), expect_inputs=(OUT_GRAPH,))
def leaf_mutated_through_detach(w):
    w.detach().mul_(2)
    return w.sin()


@case(inputs=lambda: (rand(3, grad=True),), expect_inputs=(OUT_GRAPH,))
def leaf_mutated_through_data(w):
    w.data.add_(1)
    return w * 2


@case(
    inputs=lambda: (rand(4, 4),),
    torch_differs=TorchDiffers("functionalization bans it (pytorch issue 104505)", raises=True),
    aotkit_bug=(
        "a mutation through a view chain with as_strided after its first link is rejected "
        "by torch's functionalization, which aotkit uses"
    ),
)
def mutation_through_view_of_an_as_strided_view(x):
    v = x[1:].as_strided((2, 2), (4, 1), 5)
    v.mul_(2)
    return x.sum()


@case(
    inputs=lambda: (rand(4),),
    torch_differs=TorchDiffers("silently sums the fill over the expanded dimension"),
    aotkit_bug=(
        "a fill (zero_, fill_, masked_fill_) through an expanded view: eager allows it, "
        "functionalization would sum the write-back, so aotkit raises a clear error"
    ),
)
def fill_through_expanded_view(x):
    x.unsqueeze(0).expand(3, 4).fill_(2.0)
    return x * 1


@case(
    inputs=lambda: (rand(1).expand(4),),
    torch_differs=TorchDiffers(
        "raises at run time: copy_ into the caller's overlapping tensor", raises=True
    ),
    aotkit_bug=(
        "a write through a non-overlapping view of an input whose elements share memory "
        "(an expanded input): eager shows it in every element, a functional graph cannot "
        "express that, so aotkit raises a clear error at trace time (See Note [Writes "
        "into an input whose elements share memory])"
    ),
)
def write_into_expanded_input_through_a_slice(x):
    x[:1].add_(1.5)
    return x * 2


# ---- metadata mutations ----------------------------------------------------------------


@case(inputs=lambda: (rand(3, 4),), expect_inputs=(OUT_GRAPH,))
def metadata_t_(x):
    x.t_()
    return x + 1


@case(inputs=lambda: (nonleaf(2, 3, 4),), expect_inputs=(OUT_GRAPH,))
def metadata_transpose_of_grad_input(x):
    x.transpose_(0, 2)
    return x * 2


@case(inputs=lambda: (rand(3, 4),), expect_outputs=(IS_INPUT,), expect_inputs=(OUT_GRAPH,))
def metadata_unsqueeze_returned(x):
    x.unsqueeze_(0)
    return x


@case(inputs=lambda: (rand(1, 3, 1),), expect_inputs=(OUT_GRAPH,))
def metadata_squeeze_(x):
    x.squeeze_()
    return x.sum(), x.shape[0]


@case(inputs=lambda: (rand(4, 4),), expect_inputs=(OUT_GRAPH,))
def metadata_as_strided_(x):
    x.as_strided_((2, 3), (4, 1), 2)
    return x * 1


@case(inputs=lambda: (rand(3, 4),), expect_inputs=(NM,))
def metadata_mutation_undone(x):
    x.t_()
    x.t_()
    return x * 2


@case(inputs=lambda: (rand(3, 4),), expect_inputs=(OUT_GRAPH,))
def metadata_then_data_mutation(x):
    x.t_()
    x[0].add_(1)
    return x.sum(1)


@case(inputs=lambda: (nonleaf(3, 4),), expect_inputs=(OUT_GRAPH,))
def data_then_metadata_mutation_with_grad(x):
    x.mul_(2)
    x.unsqueeze_(1)
    return x.exp()


@case(
    inputs=lambda: (rand(6), rand(3)),
    expect_inputs=(OUT_GRAPH, NM),
)
def metadata_resize_(x, y):
    x.resize_(3)
    return x + y


_SET_OUT_OF_GRAPH = TorchDiffers(
    "torch supports set_ on an input only when the mutation stays in the graph", raises=True
)


@case(
    inputs=lambda: (rand(3), rand(3)),
    expect_outputs=(NA,),
    expect_inputs=(OUT_GRAPH, NM),
    torch_differs=_SET_OUT_OF_GRAPH,
)
def storage_mutation_set_(x, y):
    x.set_(y)
    return x * 2


@case(inputs=lambda: (rand(3), rand(5)), expect_inputs=(OUT_GRAPH, NM), torch_differs=_SET_OUT_OF_GRAPH)
def storage_mutation_set_to_intermediate(x, y):
    x.set_(y[:3] * 2)
    return x + 1


# ---- keep_inference_input_mutations ----------------------------------------------------
# Like torch, aotkit keeps an eligible input mutation in the graph (a trailing copy_ into
# the input) in inference and in training graphs (Note [Input mutations kept in the
# training graph]).


@case(
    inputs=lambda: (rand(3, 4), rand(3, 4)),
    keep_inference_input_mutations=True,
    expect_inputs=(IN_GRAPH, NM),
    boxed=True,
)
def keep_mutations_inference(x, y):
    x.add_(y)
    return y * 2


@case(
    inputs=lambda: (rand(3, 4), rand(3, 4, grad=True)),
    keep_inference_input_mutations=True,
    expect_inputs=(IN_GRAPH, NM),
)
def keep_mutations_training_input_without_grad(x, y):
    x.mul_(2)
    return x * y


@case(
    inputs=lambda: (nonleaf(3, 4), rand(3, 4)),
    keep_inference_input_mutations=True,
    expect_inputs=(OUT_GRAPH, IN_GRAPH),
)
def keep_mutations_training_input_with_grad(x, y):
    x.mul_(2)
    y.add_(1)
    return x + y


@case(
    inputs=lambda: (rand(3, 4),),
    keep_inference_input_mutations=True,
    expect_inputs=(OUT_GRAPH,),
)
def keep_mutations_metadata_stays_out_of_graph(x):
    x.t_()
    return x * 2


@case(
    inputs=lambda: (rand(3, 4),),
    keep_inference_input_mutations=True,
    expect_inputs=(IN_GRAPH,),
)
def keep_mutations_through_view(x):
    x[1].mul_(3)
    return x.sum()


@case(
    inputs=lambda: (rand(3, grad=True), rand(3, grad=True)),
    keep_inference_input_mutations=True,
    expect_inputs=(IN_GRAPH, NM),
)
def keep_mutations_leaf_under_no_grad(w, x):
    with torch.no_grad():
        w.mul_(0.5)
    return w * x


@case(
    inputs=lambda: (rand(3, 4), rand(3, 4, grad=True)),
    keep_inference_input_mutations=True,
    grad_enabled=False,
    expect_inputs=(IN_GRAPH, NM),
)
def keep_mutations_grad_input_under_no_grad(x, y):
    x.add_(y)
    return y.sin()


@case(
    inputs=lambda: (rand(3), rand(3)),
    keep_inference_input_mutations=True,
    expect_inputs=(IN_GRAPH, NM),
)
def keep_mutations_set_(x, y):
    x.set_(y * 2)
    return x + 1


# ---- programs eager rejects: the compiled versions must raise too ----------------------


@case(
    inputs=lambda: (rand(3, grad=True),),
    eager_raises=True,
    torch_differs=TorchDiffers("torch silently mutates a leaf that requires grad"),
)
def rejects_inplace_on_leaf_requiring_grad(x):
    x.add_(1)
    return x


@case(
    inputs=lambda: (rand(1, 4),),
    eager_raises=True,
    torch_differs=TorchDiffers("torch silently writes through an expanded (overlapping) view"),
)
def rejects_inplace_on_expanded_view(x):
    x.expand(3, 4).add_(1)
    return x


@case(
    inputs=lambda: (rand(4, grad=True),),
    eager_raises=True,
    torch_differs=TorchDiffers("torch silently mutates a view of a leaf that requires grad"),
)
def rejects_inplace_on_view_of_leaf_requiring_grad(x):
    x[0].mul_(2)
    return x


@case(inputs=lambda: (rand(3, 4), rand(4, 3)), eager_raises=True)
def rejects_mismatched_inplace_shapes(x, y):
    x.add_(y)
    return x


# Eager raises at backward: x was saved by the multiplication, then modified. torch raises
# already while tracing the joint; aotkit raises at backward, like eager (See Note
# [Backward paths through stale saved values] in aotkit_frontends).
@case(inputs=lambda: (rand(3), rand(3, grad=True)), eager_raises=True)
def rejects_backward_through_input_mutated_after_use(x, y):
    out = x * y
    x.add_(1)
    return out


@case(inputs=lambda: (rand(3), rand(3, grad=True)), eager_raises=True, keep_inference_input_mutations=True)
def rejects_backward_through_input_mutated_after_use_keep_mutations(x, y):
    out = x * y
    x.add_(1)
    return out

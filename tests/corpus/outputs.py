"""Mutation and aliasing: outputs that alias inputs, intermediates and each other.

See Note [Output aliasing kinds] in aotkit_schemas. Each case names the OutputType aotkit
(and torch's metadata pass) must give every tensor output.
"""

from __future__ import annotations

import torch

from corpus import (
    CUSTOM,
    IS_INPUT,
    NA,
    NM,
    OF_INPUT,
    OF_INTER,
    OF_INTER_SAVE,
    OF_INTER_USER,
    UNSAFE,
    TorchDiffers,
    case_registrar,
    nonleaf,
    rand,
)

case = case_registrar("mutation")



# ---- non_alias and is_input ------------------------------------------------------------


@case(inputs=lambda: (rand(3, 4, grad=True),), expect_outputs=(NA,), expect_inputs=(NM,))
def out_non_alias(x):
    return x * 2


@case(inputs=lambda: (rand(3, 4, grad=True),), expect_outputs=(IS_INPUT, NA), boxed=True)
def out_is_input_requires_grad(x):
    return x, x.sin()


@case(inputs=lambda: (rand(3, 4),), expect_outputs=(IS_INPUT,))
def out_is_input_without_grad(x):
    return x


@case(inputs=lambda: (rand(3, 4), rand(3, 4, grad=True)), expect_outputs=(IS_INPUT, IS_INPUT, NA))
def out_same_input_twice(x, y):
    return x, x, x + y


@case(
    inputs=lambda: (rand(3, 4, grad=True),),
    expect_outputs=(OF_INPUT, OF_INPUT, NA, NA),
    torch_differs=TorchDiffers("an alias returned twice comes back as two different views"),
)
def out_same_view_returned_twice(x):
    v = x.t()
    y = x * 2
    return v, v, y, y


# ---- alias_of_input --------------------------------------------------------------------


@case(inputs=lambda: (rand(3, 4, grad=True),), expect_outputs=(OF_INPUT,))
def out_view_of_input(x):
    return x.view(-1)


@case(inputs=lambda: (rand(3, 4, grad=True),), expect_outputs=(OF_INPUT, NA), grad_enabled=False)
def out_view_of_grad_input_under_no_grad(x):
    return x[0], x * 2


@case(inputs=lambda: (rand(3, 4),), expect_outputs=(OF_INPUT, OF_INPUT, OF_INPUT))
def out_transpose_slice_diagonal_of_input(x):
    return x.t(), x[1:, ::2], x.diagonal()


@case(inputs=lambda: (rand(2, 3, 4, grad=True),), expect_outputs=(OF_INPUT,))
def out_view_of_view_of_view(x):
    return x.transpose(0, 2)[1].unsqueeze(0).narrow(1, 1, 2)


@case(inputs=lambda: (nonleaf(4, 4),), expect_outputs=(OF_INPUT, NA), boxed=True)
def out_view_of_nonleaf_input(x):
    return x[1], x.sum()


@case(inputs=lambda: (rand(4, 4, grad=True),), expect_outputs=(OF_INPUT, OF_INPUT))
def out_two_views_of_one_input(x):
    return x[0], x.view(2, 8)


@case(inputs=lambda: (rand(4, 3),), expect_outputs=(OF_INPUT, OF_INPUT, OF_INPUT))
def out_unbind_and_split_of_input(x):
    a, b = x.split(2)
    return a, b, x.unbind(1)[2]


# Multi-output views (split, unbind) of an input that requires grad can't be regenerated
# by view replay, so they are plain outputs.
@case(inputs=lambda: (rand(4, 3, grad=True),), expect_outputs=(NA, NA, NA))
def out_unbind_and_split_of_grad_input(x):
    a, b = x.split(2)
    return a, b, x.unbind(1)[2]


@case(inputs=lambda: (rand(3, 4, dtype=torch.float32),), expect_outputs=(OF_INPUT,))
def out_dtype_view_of_input(x):
    return x.view(torch.int32)


@case(inputs=lambda: (rand(2, 3),), expect_outputs=(OF_INPUT, OF_INPUT))
def out_expand_and_as_strided_of_input(x):
    return x.expand(4, 2, 3), x.as_strided((2, 2), (1, 2), 1)


# ---- aliases of intermediates ----------------------------------------------------------


@case(inputs=lambda: (rand(3, 4, grad=True),), expect_outputs=(UNSAFE,))
def out_single_view_of_intermediate(x):
    return (x * 2).view(-1)


@case(
    inputs=lambda: (rand(2, 3, grad=True),),
    expect_outputs=(UNSAFE,),
    torch_differs=TorchDiffers("aten._unsafe_view recomputes the stride of the size-1 dim"),
)
def out_strided_single_view_of_intermediate(x):
    return (x.reshape(3, 2).sin()[0:1:2],)


@case(inputs=lambda: (rand(3, 4, grad=True),), expect_outputs=(OF_INTER_SAVE, OF_INTER), boxed=True)
def out_two_views_of_intermediate(x):
    y = x * 2
    return y.view(-1), y.t()


@case(inputs=lambda: (rand(3, 4, grad=True),), expect_outputs=(NA, OF_INTER_USER))
def out_intermediate_and_its_view(x):
    y = x.exp()
    return y, y[0]


@case(inputs=lambda: (rand(3, 4, grad=True),), expect_outputs=(OF_INTER_USER, NA))
def out_view_listed_before_its_base(x):
    y = x.exp()
    return y.view(4, 3), y


@case(inputs=lambda: (rand(3, 4, grad=True),), expect_outputs=(OF_INTER_SAVE, OF_INTER, OF_INTER))
def out_three_views_of_intermediate(x):
    y = x + 1
    return y[0], y[1], y[2]


@case(inputs=lambda: (rand(3, 4, grad=True),), expect_outputs=(NA, OF_INTER_USER))
def out_intermediate_and_its_detach(x):
    y = x * 3
    return y, y.detach()


@case(inputs=lambda: (rand(3, 4),), expect_outputs=(NA, NA))
def out_views_of_intermediate_without_grad(x):
    y = x * 2
    return y[0], y[1]


@case(inputs=lambda: (rand(6, grad=True),), expect_outputs=(UNSAFE, UNSAFE))
def out_multi_output_views_of_intermediate(x):
    a, b = (x * 2).split(3)
    return a, b


def _mutate_first_output(out, args):
    out[0].mul_(10)


@case(
    inputs=lambda: (rand(3, 4, grad=True),),
    expect_outputs=(OF_INTER_SAVE, OF_INTER),
    after=_mutate_first_output,
)
def out_views_of_intermediate_mutated_by_user(x):
    y = x * 2
    return y[0], y.view(-1)


@case(inputs=lambda: (rand(3, 4, grad=True),), expect_outputs=(NA, OF_INTER_USER), after=_mutate_first_output)
def out_intermediate_mutated_by_user_updates_its_view(x):
    y = x * 2
    return y, y.t()


def _add_to_first_output(out, args):
    out[0].add_(1)


@case(inputs=lambda: (rand(3, 4),), expect_outputs=(OF_INPUT, OF_INPUT), after=_add_to_first_output)
def out_view_of_input_mutated_by_user(x):
    return x[0], x.view(-1)


@case(inputs=lambda: (nonleaf(3, 4),), expect_outputs=(OF_INPUT,), after=_add_to_first_output, boxed=True)
def out_view_of_grad_input_mutated_by_user(x):
    return (x.t(),)


@case(
    inputs=lambda: (rand(3, 4, grad=True),),
    expect_outputs=(UNSAFE,),
    after=_add_to_first_output,
    torch_differs=TorchDiffers(
        "eager raises at backward (exp's saved result was modified in place); torch "
        "silently differentiates with the modified value"
    ),
)
def out_unsafe_view_mutated_by_user(x):
    return ((x.exp()).view(-1),)


def _mul_first_output(out, args):
    out[0].mul_(2)


@case(
    inputs=lambda: (rand(4, grad=True),),
    expect_outputs=(NA,),
    after=_mul_first_output,
    torch_differs=TorchDiffers(
        "the output comes back as a view of a graph intermediate; mutating it raises"
    ),
)
def out_intermediate_mutated_through_its_view_then_mutated_by_user(x):
    y = x.sin()
    y.view(-1).add_(1.5)
    return (y,)


@case(inputs=lambda: (rand(4),), expect_outputs=(NA, OF_INTER_USER))
def out_intermediate_mutated_through_its_view_inference(x):
    y = x.sin()
    v = y.view(-1)
    v.add_(1.5)
    return y, v


# ---- custom autograd.Function views ----------------------------------------------------


class ViewFn(torch.autograd.Function):
    """Returns a view of its input; backward deliberately scales by 2."""

    @staticmethod
    def forward(ctx, x):
        return x.view(-1)

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad.view(3, 4)


@case(inputs=lambda: (rand(3, 4, grad=True),), expect_outputs=(CUSTOM,))
def out_custom_function_view_of_input(x):
    return ViewFn.apply(x)


@case(inputs=lambda: (nonleaf(3, 4),), expect_outputs=(CUSTOM, NA))
def out_custom_function_view_of_nonleaf_input(x):
    v = ViewFn.apply(x)
    return v, v * 2

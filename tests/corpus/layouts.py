"""Inputs that are non-contiguous views of a larger base, mutated and then viewed again.

The runtime rebuilds an output that views a mutated input on the caller's tensor (Note
[View replay] in aotkit_functional); these programs once came back with the graph's
strides and offset instead of eager's, and wrong values. The harness compares strides,
storage offsets and the inputs after the call (Note [What the differential harness
compares]).
"""

from __future__ import annotations

import torch

from corpus import OF_INPUT, OUT_GRAPH, TorchDiffers, case_registrar

case = case_registrar("mutation")


def _t_sliced(grad: bool = False) -> torch.Tensor:
    """``base.t()[1:]`` of a (5, 6) base: stride (1, 6), storage offset 1."""
    base = torch.randn(5, 6, requires_grad=grad)
    return (base.clone() if grad else base).t()[1:]


def _sliced(grad: bool = False) -> torch.Tensor:
    base = torch.randn(6, 7, requires_grad=grad)
    return (base.clone() if grad else base)[1:, 2:]


def _stepped(grad: bool = False) -> torch.Tensor:
    base = torch.randn(4, 10, requires_grad=grad)
    return (base.clone() if grad else base)[:, ::2]


@case(inputs=lambda: (_t_sliced(),), expect_outputs=(OF_INPUT,), expect_inputs=(OUT_GRAPH,))
def mutated_transposed_slice_viewed_again(x):
    x.mul_(2)
    return x[1:].t()


@case(inputs=lambda: (_t_sliced(grad=True),), expect_outputs=(OF_INPUT,), expect_inputs=(OUT_GRAPH,))
def mutated_transposed_slice_viewed_again_training(x):
    x.mul_(2)
    return x[1:].t()


@case(inputs=lambda: (_sliced(grad=True),), expect_outputs=(OF_INPUT, OF_INPUT),
      expect_inputs=(OUT_GRAPH,))
def mutated_offset_input_views_of_views(x):
    x.add_(1)
    y = x.t()[1:]
    return y, y[:, 1:].diagonal()


@case(inputs=lambda: (_stepped(),), expect_outputs=(OF_INPUT,), expect_inputs=(OUT_GRAPH,))
def mutated_stepped_input_unsqueezed(x):
    x[1:].mul_(3)
    return x.unsqueeze(0)[:, 1:]


@case(
    inputs=lambda: (_sliced(),),
    expect_outputs=(OF_INPUT,),
    expect_inputs=(OUT_GRAPH,),
    torch_differs=TorchDiffers(
        "torch sets the graph's contiguous layout on the caller's offset input after t_ "
        "(stride and offset differ from eager, and copy_ writes outside the input)"
    ),
)
def data_then_metadata_mutation_of_offset_input(x):
    x.mul_(2)
    x.t_()
    return x[1:]


@case(
    inputs=lambda: (_t_sliced(grad=True),),
    expect_outputs=(OF_INPUT,),
    expect_inputs=(OUT_GRAPH,),
    torch_differs=TorchDiffers(
        "torch sets the graph's contiguous layout on the caller's transposed input after "
        "transpose_"
    ),
)
def transpose_then_data_mutation_of_transposed_input(x):
    x.transpose_(0, 1)
    x.mul_(2)
    return x[:, 1:]


@case(inputs=lambda: (_t_sliced(),), expect_outputs=(OF_INPUT,), expect_inputs=(OUT_GRAPH,))
def metadata_mutation_only_of_offset_input(x):
    x.t_()
    return x[1:]


# ---- outputs viewing one copy of a transposed input, after a mutation ------------------
# ``reshape`` of the transposed input copies; every later reshape is a view of that copy.
# After the in-place op, functionalization replays those reshapes as ``_unsafe_view``,
# whose schema hides that it aliases: both outputs came back as plain tensors where
# eager returns two views of one base (fuzzer seed 51; See Note [Ops that alias despite
# their schema] in aotkit_schemas).


def _transposed(grad: bool = False) -> torch.Tensor:
    base = torch.randn(3, 2, requires_grad=grad)
    return (base.clone() if grad else base).t()


@case(inputs=lambda: (_transposed(),))
def reshaped_copy_of_transposed_input_viewed_twice_after_mutation(x):
    y = x.reshape(3, 2)
    a = y.reshape(2, 3)
    b = a.reshape(3, 2)
    b.add_(1.5)
    return b, a


@case(inputs=lambda: (_transposed(),))
def reshaped_copy_forked_deep_then_mutated(x):
    y = x.reshape(3, 2)
    for _ in range(3):
        y = y.reshape(2, 3).reshape(3, 2)
    z = y.reshape(2, 3)
    w = z.reshape(3, 2)
    w.add_(1.5)
    return w, z


@case(inputs=lambda: (_transposed(grad=True),))
def reshaped_copy_of_transposed_input_viewed_twice_after_mutation_training(x):
    y = x.reshape(3, 2)
    a = y.reshape(2, 3)
    b = a.reshape(3, 2)
    b.mul_(2)
    return b, a

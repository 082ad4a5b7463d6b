"""How a value of the user's program maps onto the plain tensors the compiled graphs see.

# Note [Tensor subclasses are desugared]
# Compilers only ever see plain tensors. A traceable wrapper subclass (one that defines
# ``__tensor_flatten__`` / ``__tensor_unflatten__``: TwoTensor, DTensor, FSDP2's and
# torchao's weight subclasses) among a program's inputs, outputs, tangents or gradients is
# replaced, in the graphs, by its inner tensors, recursively for nested subclasses, in the
# order its ``__tensor_flatten__`` lists them:
#
# Non-tensor inner values (DTensor's device mesh) are constants of the program
# (``OpaqueMeta``), not graph values.
#
#     user values   (x: TwoTensor(a, b), y: Tensor)      ->  x * y: TwoTensor
#     graph values  (primals_1 = x.a, primals_2 = x.b, primals_3 = y)
#                                                        ->  (mul = a * y, mul_1 = b * y)
#
# The graphs are traced from a *desugared* function: it rebuilds the subclasses from the
# traced inner tensors (``__tensor_unflatten__``), runs the user's code, whose subclass
# ``__torch_dispatch__`` then records ops on the inner tensors, and flattens every
# subclass it returns. Each value keeps one entry in a ``subclass_*_meta`` list: a
# ``PlainTensorMeta`` (the value is passed as it is: a plain tensor, a SymInt, None) or a
# ``SubclassCreationMeta`` (how many plain values it takes and how to rebuild it). At run
# time, per compiled program, the inputs are flattened with the input metas before the
# compiled forward and its outputs rebuilt with the output metas; the backward flattens
# the tangents and rebuilds the gradients the same way. The autograd.Function and the
# epilogue work on the user's values (subclasses), as torch's do; only the compiled calls
# see plain tensors. A program without subclasses has no such lists and no wrapper.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PlainTensorMeta:
    """A value passed to and from the graph as it is (plain tensor, SymInt, None)."""

    # position of the value among the flattened (graph) values
    unwrapped_idx: int

    @property
    def arg_count(self) -> int:
        return 1


@dataclass(frozen=True, eq=False)
class OpaqueMeta:
    """A non-tensor inner value of a subclass (DTensor's ``device_mesh``): kept in the meta
    as a constant of the program, never passed to or returned from a graph (a graph
    traced for one mesh has that mesh's process groups baked into its collectives)."""

    value: Any

    @property
    def arg_count(self) -> int:
        return 0


@dataclass(frozen=True, eq=False)
class SubclassCreationMeta:
    """How to rebuild one traceable wrapper subclass from the plain graph values.

    Field meanings follow torch's ``SubclassCreationMeta``. See Note [Tensor subclasses
    are desugared].
    """

    # position of the subclass's first inner (plain) tensor among the graph values
    flat_tensor_start_idx: int
    # number of graph values the subclass takes, nested subclasses' inner tensors included
    # (a TwoTensor of two TwoTensors takes 4)
    arg_count: int
    # one entry per attribute named by ``__tensor_flatten__``, in its order
    attrs: Mapping[str, SubclassOrPlainMeta | OpaqueMeta]
    # the outer size and stride passed to ``__tensor_unflatten__``
    outer_size: tuple[int, ...]
    outer_stride: tuple[int, ...]
    # the context ``__tensor_flatten__`` returned
    meta: Any
    original_subclass_type: type
    # whether the traced value required grad (rebuilt trace-time values mirror it)
    requires_grad: bool = False

    def __post_init__(self) -> None:
        assert self.arg_count == sum(m.arg_count for m in self.attrs.values()), (
            "arg_count counts every inner tensor of the (nested) subclass"
        )
        assert self.arg_count > 0, "a subclass with no inner tensor can't be desugared"


SubclassOrPlainMeta = PlainTensorMeta | SubclassCreationMeta


def num_unwrapped(metas: Sequence[SubclassOrPlainMeta]) -> int:
    """How many graph values a list of values flattens to."""
    return sum(m.arg_count for m in metas)


def has_subclass(metas: Sequence[SubclassOrPlainMeta]) -> bool:
    return any(isinstance(m, SubclassCreationMeta) for m in metas)

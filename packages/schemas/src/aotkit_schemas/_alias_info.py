"""Per-input and per-output aliasing/mutation facts collected by the metadata pass.

# Note [Input mutation kinds]
# An input can be mutated in three ways during a traced call:
#   * data mutation (``x.add_(1)``, ``x[0].mul_(2)``): the values change;
#   * metadata mutation (``x.t_()``, ``x.unsqueeze_(0)``, ``x.as_strided_(...)``): size,
#     stride or storage offset change, the storage does not;
#   * storage mutation (``x.set_(y)``): the tensor now points at another storage.
#     A storage mutation always counts as a metadata mutation too, and suppresses the
#     data-mutation flag (the runtime ``set_`` already carries the new values).
# Graphs handed to a compiler are functional, so mutations are either replayed by the
# runtime epilogue after the compiled graph ran (``MUTATED_OUT_GRAPH``) or, only when
# ``keep_inference_input_mutations`` allows it, kept in the graph as a trailing ``copy_``
# (``MUTATED_IN_GRAPH``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class OutputType(enum.Enum):
    """How one user output relates to the inputs and to other outputs.

    See Note [Output aliasing kinds].
    """

    non_alias = enum.auto()
    alias_of_input = enum.auto()
    is_input = enum.auto()
    alias_of_intermediate_save_as_output = enum.auto()
    alias_of_intermediate = enum.auto()
    alias_of_intermediate_base_is_user_output = enum.auto()
    unsafe_view_alias = enum.auto()
    custom_function_view = enum.auto()


# Note [Output aliasing kinds]
# * non_alias: a fresh tensor (or a non-tensor value). It is a graph output and, when it
#   requires grad, receives a tangent.
# * is_input: the output *is* one of the inputs; base_idx names it. The runtime returns the
#   caller's tensor itself.
# * alias_of_input: a view of input ``base_idx``. The graph still computes it, but the runtime
#   regenerates it from the caller's input by view replay, so it is a real view with the
#   right autograd history. It gets no tangent.
# * alias_of_intermediate_save_as_output: a view of an intermediate ``b`` that is not itself
#   a user output. ``b`` is appended to the forward outputs as intermediate base ``base_idx``
#   and the runtime regenerates the view from it.
# * alias_of_intermediate: as above, but another output already asked for the same base;
#   ``base_idx`` indexes the intermediate bases.
# * alias_of_intermediate_base_is_user_output: the base is user output ``base_idx``.
# * unsafe_view_alias: a view of an intermediate that is the only alias of its storage;
#   it is treated as a non-alias (returned from the graph, receives a tangent).
# * custom_function_view: a view produced by a custom autograd.Function; treated as a
#   non-alias so the custom backward is traced into the graph.


class MutationType(enum.Enum):
    """Where an input mutation is applied. See Note [Input mutation kinds]."""

    NOT_MUTATED = 1
    MUTATED_IN_GRAPH = 2
    MUTATED_OUT_GRAPH = 3


def mutation_can_stay_in_graph(
    *,
    keep_input_mutations: bool,
    mutates_data: bool,
    mutates_metadata: bool,
    mutations_hidden_from_autograd: bool,
    mutations_under_no_grad_or_inference_mode: bool,
    mutates_storage_metadata: bool,
    requires_grad: bool,
) -> bool:
    """Whether an input mutation may be kept in the graph as ``copy_``/``set_``.

    Only data (or storage) mutations can stay, only when the caller asked for it, and only
    when autograd does not need to see them: the input does not require grad, or every
    mutation happened under ``no_grad`` or was hidden from autograd.
    """
    if not keep_input_mutations:
        return False
    if not (mutates_data or mutates_storage_metadata):
        return False
    return (
        (not mutates_metadata and not requires_grad)
        or mutations_hidden_from_autograd
        or mutations_under_no_grad_or_inference_mode
    )


@dataclass(frozen=True)
class InputAliasInfo:
    """Facts about one flat input after the traced call. See Note [Input mutation kinds]."""

    is_leaf: bool
    mutates_data: bool
    mutates_metadata: bool
    mutations_hidden_from_autograd: bool
    mutations_under_no_grad_or_inference_mode: bool
    mutates_storage_metadata: bool
    requires_grad: bool
    keep_input_mutations: bool
    mutation_type: MutationType = field(init=False)
    # metadata-mutated inputs only (not set_): functionalization's recorded chain of
    # in-place views (t_, transpose_, ...) from the input as passed to its final metadata,
    # replayed on the caller's tensor by the epilogue. See Note [View replay] in
    # aotkit_functional.
    view_meta_sequence: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.mutates_storage_metadata and not self.mutates_metadata:
            raise ValueError("a storage mutation (set_) is always a metadata mutation too")
        if self.mutations_under_no_grad_or_inference_mode and not (
            self.mutates_data or self.mutates_storage_metadata
        ):
            raise ValueError(
                "mutations_under_no_grad_or_inference_mode needs a data or storage mutation"
            )
        if not (self.mutates_data or self.mutates_metadata):
            kind = MutationType.NOT_MUTATED
        elif mutation_can_stay_in_graph(
            keep_input_mutations=self.keep_input_mutations,
            mutates_data=self.mutates_data,
            mutates_metadata=self.mutates_metadata,
            mutations_hidden_from_autograd=self.mutations_hidden_from_autograd,
            mutations_under_no_grad_or_inference_mode=self.mutations_under_no_grad_or_inference_mode,
            mutates_storage_metadata=self.mutates_storage_metadata,
            requires_grad=self.requires_grad,
        ):
            kind = MutationType.MUTATED_IN_GRAPH
        else:
            kind = MutationType.MUTATED_OUT_GRAPH
        object.__setattr__(self, "mutation_type", kind)

    @property
    def mutates_anything(self) -> bool:
        return self.mutation_type is not MutationType.NOT_MUTATED


@dataclass(frozen=True)
class OutputAliasInfo:
    """Facts about one flat user output. See Note [Output aliasing kinds]."""

    output_type: OutputType
    # type(output): torch.Tensor, int, torch.SymInt, NoneType, ...
    raw_type: type
    # None for non_alias / unsafe_view_alias / custom_function_view; otherwise an index into
    # the inputs (is_input, alias_of_input), the intermediate bases
    # (alias_of_intermediate*), or the user outputs (..._base_is_user_output).
    base_idx: int | None
    # Dimensions with symbolic sizes; None for non-tensors.
    dynamic_dims: frozenset[int] | None
    requires_grad: bool
    # requires_grad and the output's backward is traced (not a detached view).
    requires_grad_for_backward: bool = False
    # A view taken with grad mode on from a view made under no_grad (autograd's
    # CreationMeta NO_GRAD_MODE, propagated): it has a grad_fn whose graph ends at the
    # no_grad view, so no gradient reaches its base, and an in-place op on it raises.
    # See Note [Views of inputs made under no_grad] in aotkit_runtime.
    grad_view_of_no_grad_view: bool = False
    # non_alias only: a leaf that requires grad made inside the function; the caller gets
    # a fresh leaf (See Note [Leaves made inside the function] in aotkit_analysis).
    fresh_leaf: bool = False
    # alias_of_input only: functionalization's recorded view chain from the input as passed
    # (before any in-place view of it) to this output (torch._C._functionalization ViewMeta
    # list), replayed on the runtime input; None when unavailable (symbolic view arguments).
    # See Note [View replay] in aotkit_functional.
    view_meta_sequence: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        needs_base = self.output_type not in (
            OutputType.non_alias,
            OutputType.unsafe_view_alias,
            OutputType.custom_function_view,
        )
        if needs_base and self.base_idx is None:
            raise ValueError(f"{self.output_type.name} outputs need a base_idx")
        if not needs_base and self.base_idx is not None:
            raise ValueError(f"{self.output_type.name} outputs carry no base_idx")
        if self.requires_grad_for_backward and not self.requires_grad:
            raise ValueError("requires_grad_for_backward implies requires_grad")
        if self.grad_view_of_no_grad_view and not self.requires_grad_for_backward:
            raise ValueError("grad_view_of_no_grad_view implies requires_grad_for_backward")

    @property
    def is_regenerated_alias(self) -> bool:
        """True when the runtime rebuilds this output by view replay instead of returning
        the graph's value. See Note [Output aliasing kinds]."""
        return self.output_type in (
            OutputType.alias_of_input,
            OutputType.is_input,
            OutputType.alias_of_intermediate,
            OutputType.alias_of_intermediate_save_as_output,
            OutputType.alias_of_intermediate_base_is_user_output,
        )

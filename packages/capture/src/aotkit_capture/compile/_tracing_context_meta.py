"""What torch's AOTAutograd leaves in the TracingContext for Inductor's freezing.

# Note [Metadata in the TracingContext for Inductor's freezing]
# With ``torch._inductor.config.freezing``, Inductor's inference compiler (the one
# ``compile_fx`` hands the AOTAutograd it calls: aotkit's ``aot_autograd`` when
# torch.compile's backends are routed to aotkit's) turns parameters into constants. It
# reads from the TracingContext: ``params_flat`` (the parameters and buffers, as the
# graph's leading inputs), ``params_flat_unwrap_subclasses`` (the same with every tensor
# subclass replaced by its inner tensors, recursively: the graph's placeholders) and
# ``params_unwrapped_to_flat_index``, set by ``aot_module_simplified``. Freezing sets the
# entries of the parameters it folds to None, and torch's runtime then passes one None in
# place of a folded subclass parameter's inner tensors: the compiled graph's wrapper finds
# its inputs by subtracting, per such parameter, the slots it no longer takes, reading
# ``params_unwrapped_to_flat_index`` (torch: the parameter each inner tensor comes from).
# aotkit keeps passing every parameter (Inductor gets copies of the lists, so its Nones do
# not reach aotkit's call) and every inner tensor of each, so each inner tensor is its
# own runtime slot: ``params_unwrapped_to_flat_index`` numbers them 0, 1, 2, ..., which
# makes the wrapper subtract nothing (with torch's parent indices it would read the wrong
# inputs, silently). And ``fw_metadata``, set here while an inference graph
# compiles: per graph input its ``mutation_type`` and, per output aliasing an input, its
# ``base_idx`` and ``output_type`` (a parameter that is mutated or aliased by an output
# stays an input), and ``static_input_indices``, all in the graph's flat, desugared index
# space. aotkit's metadata classes are its own, so the view compares its enums by name
# (``_ByName``), which is how Inductor's ``in (MutationType.X, ...)`` tests match them.
# Nothing is set when someone else already set ``fw_metadata``, when there is no
# TracingContext, or when the graph leads with effect tokens (its placeholders are not the
# parameters first).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from aotkit_schemas import SubclassOrPlainMeta, ViewAndMutationMeta
from torch._guards import TracingContext


class _ByName:
    """An enum value that equals any enum member of the same name (torch's or aotkit's)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return getattr(other, "name", None) == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"<{self.name}>"


@dataclass
class _InputInfo:
    mutation_type: _ByName
    mutates_data: bool
    mutates_metadata: bool
    requires_grad: bool


@dataclass
class _OutputInfo:
    output_type: _ByName
    base_idx: int | None


@dataclass
class TorchFacingMeta:
    """The fields of torch's ViewAndMutationMeta that Inductor reads for an inference
    graph. See Note [Metadata in the TracingContext for Inductor's freezing]."""

    input_info: list[_InputInfo]
    output_info: list[_OutputInfo]
    static_input_indices: list[int]
    num_mutated_inp_runtime_indices: int
    bw_donated_idxs: list[int] | None = None
    tokens: dict[Any, Any] = field(default_factory=dict)


def torch_facing_meta(
    meta: ViewAndMutationMeta, inp_metas: Sequence[SubclassOrPlainMeta] | None = None
) -> TorchFacingMeta:
    """``meta`` in the graph's flat index space (``inp_metas``: the subclass layer's input
    metas, each input spread over its inner tensors). See Note [Metadata in the
    TracingContext for Inductor's freezing]."""
    counts = [m.arg_count for m in inp_metas] if inp_metas is not None else [1] * len(
        meta.input_info
    )
    starts = [sum(counts[:i]) for i in range(len(counts))]
    inputs: list[_InputInfo] = []
    for info, n in zip(meta.input_info, counts, strict=True):
        inputs += [
            _InputInfo(
                _ByName(info.mutation_type.name), info.mutates_data, info.mutates_metadata,
                info.requires_grad,
            )
        ] * n
    outputs: list[_OutputInfo] = []
    for out in meta.output_info:
        kind = _ByName(out.output_type.name)
        if out.base_idx is None or out.output_type.name not in ("alias_of_input", "is_input"):
            outputs.append(_OutputInfo(kind, out.base_idx))
            continue
        # every inner tensor of an aliased input stays an input
        start = starts[out.base_idx]
        outputs += [_OutputInfo(kind, start + k) for k in range(counts[out.base_idx])]
    static = [starts[i] + k for i in meta.static_input_indices for k in range(counts[i])]
    return TorchFacingMeta(
        input_info=inputs, output_info=outputs, static_input_indices=static,
        num_mutated_inp_runtime_indices=meta.num_mutated_inp_runtime_indices,
    )


@contextlib.contextmanager
def inference_meta_in_tracing_context(
    meta: ViewAndMutationMeta, inp_metas: Sequence[SubclassOrPlainMeta] | None = None
) -> Iterator[None]:
    """``TracingContext.fw_metadata`` set while an inference graph compiles. See Note
    [Metadata in the TracingContext for Inductor's freezing]."""
    context = TracingContext.try_get()
    if context is None or context.fw_metadata is not None or meta.tokens:
        yield
        return
    context.fw_metadata = torch_facing_meta(meta, inp_metas)  # type: ignore[assignment]
    try:
        yield
    finally:
        context.fw_metadata = None

"""Descriptors: what each placeholder and output of an aotkit graph stands for.

See Note [Graph descriptors].
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

# Note [Graph descriptors]
# Every placeholder of a joint, forward, backward or inference graph aotkit builds carries
# ``node.meta["desc"]``, an ``AOTInput`` naming what the caller passes there (a parameter
# by FQN, the user's i-th flat input, the tangent of an output, an effect token, ...); the
# output node carries ``meta["desc"]``, a list with one ``AOTOutput`` (or None) per
# returned value (a user output, the new value of a mutated input, the gradient of an
# input, a value saved for the backward, ...). The classes, fields and reprs are torch
# 2.15's (torch/_functorch/_aot_autograd/descriptors.py), so code written against torch's
# ``aot_export_joint_with_descriptors`` reads aotkit's graphs unchanged: a descriptor is a
# frozen dataclass compared by value, and ``repr`` is the dataclass repr, e.g.
# ``GradAOTOutput(grad_of=ParamAOTInput(target='lin.weight'))``. A gradient output whose
# input does not require grad, and a backward placeholder holding a saved value, carry
# None, as in torch. ``expr()`` renders the descriptor as a Python-ish expression.
# aotkit_capture.compile._descriptors attaches them (See Note [Where descriptors are
# attached]).


@dataclass(frozen=True)
class AOTInput:
    """Where an input of an aotkit graph comes from."""

    def expr(self) -> str:
        raise NotImplementedError("Subclasses must implement expr()")

    def is_param(self) -> bool:
        return False

    def is_buffer(self) -> bool:
        return False

    def is_tangent(self) -> bool:
        return False


@dataclass(frozen=True)
class DifferentiableAOTInput(AOTInput):
    """An input that a GradAOTOutput can be the gradient of."""


@dataclass(frozen=True)
class AOTOutput:
    """Where an output of an aotkit graph goes."""

    def expr(self) -> str:
        raise NotImplementedError("Subclasses must implement expr()")

    def is_grad(self) -> bool:
        return False


@dataclass(frozen=True)
class DifferentiableAOTOutput(AOTOutput):
    """An output that a TangentAOTInput can be the tangent of."""


# ---- inputs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamAOTInput(DifferentiableAOTInput):
    """The parameter whose FQN is ``target``."""

    target: str

    def expr(self) -> str:
        return f"self.get_parameter({self.target!r})"

    def is_param(self) -> bool:
        return True


@dataclass(frozen=True)
class BufferAOTInput(DifferentiableAOTInput):
    """The buffer whose FQN is ``target``."""

    target: str

    def expr(self) -> str:
        return f"self.get_buffer({self.target!r})"

    def is_buffer(self) -> bool:
        return True


@dataclass(frozen=True)
class DummyAOTInput(AOTInput):
    """A placeholder descriptor where none is meaningful."""

    idx: int

    def expr(self) -> str:
        return f"__dummy{self.idx}"


@dataclass(frozen=True)
class PlainAOTInput(DifferentiableAOTInput):
    """The user's flat input at position ``idx`` (after parameters and buffers)."""

    idx: int

    def expr(self) -> str:
        return f"args[{self.idx}]"


@dataclass(frozen=True)
class SubclassGetAttrAOTInput(AOTInput):
    """The inner tensor ``attr`` of the tensor subclass input ``base``."""

    base: AOTInput
    attr: str

    def expr(self) -> str:
        return f"{self.base.expr()}.{self.attr}"

    def is_param(self) -> bool:
        return self.base.is_param()

    def is_buffer(self) -> bool:
        return self.base.is_buffer()

    def is_tangent(self) -> bool:
        return self.base.is_tangent()


@dataclass(frozen=True)
class SubclassSizeAOTInput(AOTInput):
    """The outer size at dim ``idx`` of the subclass input ``base``."""

    base: AOTInput
    idx: int

    def expr(self) -> str:
        return f"{self.base.expr()}.size({self.idx})"


@dataclass(frozen=True)
class SubclassStrideAOTInput(AOTInput):
    """The outer stride at dim ``idx`` of the subclass input ``base``."""

    base: AOTInput
    idx: int

    def expr(self) -> str:
        return f"{self.base.expr()}.stride({self.idx})"


@dataclass(frozen=True)
class ViewBaseAOTInput(DifferentiableAOTInput):
    """The common ``_base`` passed instead of several differentiable views of it."""

    base_of: AOTInput

    def expr(self) -> str:
        return f"{self.base_of.expr()}._base"


@dataclass(frozen=True)
class SyntheticBaseAOTInput(DifferentiableAOTInput):
    """A synthetic base built for aliased inputs (See Note [Duplicate and aliased inputs])."""

    base_of: AOTInput

    def expr(self) -> str:
        return f"__make_synthetic_base({self.base_of.expr()})"


@dataclass(frozen=True)
class PhiloxForwardSeedAOTInput(AOTInput):
    """The seed of the forward's functionalized RNG."""

    def expr(self) -> str:
        return "__philox_forward_seed"


@dataclass(frozen=True)
class PhiloxForwardBaseOffsetAOTInput(AOTInput):
    """The base offset of the forward's functionalized RNG."""

    def expr(self) -> str:
        return "__philox_forward_base_offset"


@dataclass(frozen=True)
class PhiloxBackwardSeedAOTInput(AOTInput):
    """The seed of the backward's functionalized RNG."""

    def expr(self) -> str:
        return "__philox_backward_seed"


@dataclass(frozen=True)
class PhiloxBackwardBaseOffsetAOTInput(AOTInput):
    """The base offset of the backward's functionalized RNG."""

    def expr(self) -> str:
        return "__philox_backward_base_offset"


@dataclass(frozen=True)
class ForwardTokenAOTInput(AOTInput):
    """The ``idx``-th effect token of the forward (See Note [Effect tokens])."""

    idx: int

    def expr(self) -> str:
        return f"__forward_token{self.idx}"


@dataclass(frozen=True)
class BackwardTokenAOTInput(AOTInput):
    """The ``idx``-th effect token of the backward."""

    idx: int

    def expr(self) -> str:
        return f"__backward_token{self.idx}"


@dataclass(frozen=True)
class TangentAOTInput(DifferentiableAOTInput):
    """The tangent (incoming gradient) of the forward output ``output``."""

    output: DifferentiableAOTOutput

    def __post_init__(self) -> None:
        if not isinstance(self.output, DifferentiableAOTOutput):
            raise TypeError(f"a tangent is of a DifferentiableAOTOutput, not {self.output!r}")

    def expr(self) -> str:
        return f"__output_tangent({self.output.expr()})"

    def is_tangent(self) -> bool:
        return True


# ---- outputs --------------------------------------------------------------------------


@dataclass(frozen=True)
class PlainAOTOutput(DifferentiableAOTOutput):
    """The user's flat output at position ``idx``."""

    idx: int

    def expr(self) -> str:
        return f"output[{self.idx}]"


@dataclass(frozen=True)
class InputMutationAOTOutput(DifferentiableAOTOutput):
    """The new value of the mutated input ``mutated_input``, applied after the call."""

    mutated_input: AOTInput

    def expr(self) -> str:
        return f"__input_mutation({self.mutated_input.expr()})"


@dataclass(frozen=True)
class IntermediateBaseAOTOutput(DifferentiableAOTOutput):
    """The intermediate base of aliased outputs; ``base_of`` is one of them."""

    base_of: AOTOutput

    def expr(self) -> str:
        return f"__intermediate_base({self.base_of.expr()})"


@dataclass(frozen=True)
class MetadataMutationAOTOutput(DifferentiableAOTOutput):
    """An aliased input with a metadata mutation, returned to replay it."""

    idx: int

    def expr(self) -> str:
        return f"__aliased_arg_with_metadata_mutation{self.idx}"


@dataclass(frozen=True)
class GradAOTOutput(DifferentiableAOTOutput):
    """The gradient of the differentiable input ``grad_of``."""

    grad_of: DifferentiableAOTInput

    def __post_init__(self) -> None:
        if not isinstance(self.grad_of, DifferentiableAOTInput):
            raise TypeError(f"a gradient is of a DifferentiableAOTInput, not {self.grad_of!r}")

    def expr(self) -> str:
        return f"__grad({self.grad_of.expr()})"

    def is_grad(self) -> bool:
        return True


@dataclass(frozen=True)
class PhiloxUpdatedForwardOffsetAOTOutput(AOTOutput):
    """The forward RNG offset after the call."""

    def expr(self) -> str:
        return "__philox_updated_forward_offset"


@dataclass(frozen=True)
class PhiloxUpdatedBackwardOffsetAOTOutput(AOTOutput):
    """The backward RNG offset after the call."""

    def expr(self) -> str:
        return "__philox_updated_backward_offset"


@dataclass(frozen=True)
class ForwardTokenAOTOutput(AOTOutput):
    """The ``idx``-th effect token the forward returns."""

    idx: int

    def expr(self) -> str:
        return f"__forward_token{self.idx}"


@dataclass(frozen=True)
class BackwardTokenAOTOutput(AOTOutput):
    """The ``idx``-th effect token the backward returns."""

    idx: int

    def expr(self) -> str:
        return f"__backward_token{self.idx}"


@dataclass(frozen=True)
class SubclassGetAttrAOTOutput(AOTOutput):
    """The inner tensor ``attr`` of the subclass output ``base``."""

    base: AOTOutput
    attr: str

    def expr(self) -> str:
        return f"{self.base.expr()}.{self.attr}"

    def is_grad(self) -> bool:
        return self.base.is_grad()


@dataclass(frozen=True)
class SubclassSizeAOTOutput(AOTOutput):
    """The outer size at dim ``idx`` of the subclass output ``base``."""

    base: AOTOutput
    idx: int

    def expr(self) -> str:
        return f"{self.base.expr()}.size({self.idx})"


@dataclass(frozen=True)
class SubclassStrideAOTOutput(AOTOutput):
    """The outer stride at dim ``idx`` of the subclass output ``base``."""

    base: AOTOutput
    idx: int

    def expr(self) -> str:
        return f"{self.base.expr()}.stride({self.idx})"


@dataclass(frozen=True)
class DummyAOTOutput(AOTOutput):
    """An output descriptor where none is meaningful."""

    idx: int

    def expr(self) -> str:
        return f"__dummy{self.idx}"


@dataclass(frozen=True)
class SavedForBackwardsAOTOutput(AOTOutput):
    """The ``idx``-th value the forward saves for the backward."""

    idx: int

    def expr(self) -> str:
        return f"__saved_for_backwards_{self.idx}"


@dataclass(frozen=True)
class SavedForBackwardsNoVcCheckAOTOutput(AOTOutput):
    """A saved value whose version counter the backward does not check."""

    idx: int

    def expr(self) -> str:
        return f"__saved_for_backwards_no_vc_check_{self.idx}"


DESCRIPTOR_CLASSES: tuple[type, ...] = tuple(
    c for c in list(globals().values())
    if isinstance(c, type) and c.__module__ == __name__ and c.__name__.endswith(("Input", "Output"))
)
_BY_NAME = {c.__name__: c for c in DESCRIPTOR_CLASSES}


def descriptor_to_json(d: AOTInput | AOTOutput | None) -> Any:
    """``d`` as ``[class name, {field: value}]`` (the on-disk cache's form), None as None."""
    if d is None:
        return None
    return [type(d).__name__, {
        f.name: descriptor_to_json(v) if isinstance(v := getattr(d, f.name), (AOTInput, AOTOutput))
        else v
        for f in fields(d)
    }]


def descriptor_from_json(j: Any) -> Any:
    """The descriptor ``descriptor_to_json`` wrote; ValueError for anything else."""
    if j is None:
        return None
    if type(j) is not list or len(j) != 2 or j[0] not in _BY_NAME or type(j[1]) is not dict:
        raise ValueError(f"not a descriptor: {j!r}")
    kw: dict[str, Any] = {}
    for k, v in j[1].items():
        if type(v) is list:
            kw[k] = descriptor_from_json(v)
        elif type(v) in (int, str):
            kw[k] = v
        else:
            raise ValueError(f"bad field {k!r} of a descriptor: {v!r}")
    try:
        return _BY_NAME[j[0]](**kw)
    except TypeError as e:
        raise ValueError(f"bad descriptor {j!r}: {e}") from e

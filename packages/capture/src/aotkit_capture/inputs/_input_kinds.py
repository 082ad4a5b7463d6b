"""Which non-tensor values may be flat inputs of a compiled function.

# Note [Non-tensor inputs]
# A traced graph sees a non-tensor input in one of two ways:
#   * as a constant: the trace runs the user's code on the real value and bakes whatever it
#     read into the graph (an int used as a size, a float factor, a dtype given to .to());
#   * as a graph input: the value is passed to the graph on every call (a SymInt with
#     dynamic shapes, a ScriptObject or registered opaque object that ops take as an
#     argument, a BackwardState).
# A constant is only correct if the compile key (Note [Compile cache keys] in
# aotkit_frontends) holds its value, so the graph is traced again when the value changes.
# That is possible for immutable values compared by value: VALUE_KINDS below. An arbitrary
# object is neither: the trace reads its attributes (``cfg.scale``) and the key cannot
# tell when they change, so reusing the graph would return wrong values in silence.
# torch's AOTAutograd refuses such inputs ("all flat_args must be KNOWN_TYPES or opaque
# types"); aotkit refuses them too, with the same words, the argument's position and
# type, and the fix. It accepts a superset of torch's KNOWN_TYPES: torch.dtype, device,
# layout, memory_format and complex are immutable values, keyed by value, so they are
# safe constants.
# torch registers every ``enum.Enum`` as an opaque *constant* type, and a user may register
# other classes so (with ``__eq__``, ``__hash__`` and ``__fx_repr__``): the trace bakes such
# a value into the graph like an int, and dynamo guards on its equality. The key holds it
# by value too (``is_opaque_constant``). Keyed by type only, like the opaque objects the
# graph takes as inputs, ``fn(x, Mode.B)`` silently reused the graph traced for
# ``Mode.A``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

# immutable values the compile key holds by value (they become constants of the graph)
VALUE_KINDS: tuple[type, ...] = (
    int, float, bool, str, complex, type(None),
    torch.dtype, torch.device, torch.layout, torch.memory_format,
)
# values the graph takes as inputs on every call (keyed by type only)
_GRAPH_INPUT_KINDS: tuple[type, ...] = (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)


class UnsupportedInputError(TypeError, AssertionError):
    """A flat input of a kind a compiled graph cannot be specialized to safely.

    A ``TypeError``, and an ``AssertionError`` as torch's check raises.
    """


def _graph_input_kinds() -> tuple[type, ...]:
    kinds = list(_GRAPH_INPUT_KINDS)
    kinds.append(torch.ScriptObject)
    try:
        from torch._library.fake_class_registry import FakeScriptObject

        kinds.append(FakeScriptObject)
    except ImportError:  # pragma: no cover - older torch
        pass
    try:
        from torch.fx.experimental._backward_state import BackwardState

        kinds.append(BackwardState)
    except ImportError:  # pragma: no cover - older torch
        pass
    return tuple(kinds)


_ACCEPTED: tuple[type, ...] | None = None


def _is_opaque(value: Any) -> bool:
    try:
        from torch._library.opaque_object import is_custom_class_obj
    except ImportError:  # pragma: no cover - older torch
        return False
    return bool(is_custom_class_obj(value))


def is_opaque_constant(value: Any) -> bool:
    """Whether ``value`` is of a registered opaque *constant* type (every ``enum.Enum``
    is one in torch; others must define ``__eq__`` and ``__hash__``). The trace bakes it
    into the graph, so the compile key must hold it by value: See Note [Non-tensor
    inputs]."""
    if not _is_opaque(value):
        return False
    try:
        from torch._library.opaque_object import is_opaque_constant_type
    except ImportError:  # pragma: no cover - older torch
        return False
    return bool(is_opaque_constant_type(type(value)))


def is_supported_input(value: Any) -> bool:
    global _ACCEPTED
    if _ACCEPTED is None:
        _ACCEPTED = VALUE_KINDS + _graph_input_kinds()
    return isinstance(value, _ACCEPTED) or _is_opaque(value)


def check_input_kinds(
    flat_args: Sequence[Any], describe: Callable[[int], str] | None = None
) -> None:
    """Raise UnsupportedInputError for the first flat input of an unsupported kind.

    ``describe(i)`` names flat input ``i`` for the user (default: "flat input i").
    See Note [Non-tensor inputs].
    """
    for i, a in enumerate(flat_args):
        if is_supported_input(a):
            continue
        where = describe(i) if describe is not None else f"flat input {i}"
        cls = type(a)
        raise UnsupportedInputError(
            "all flat_args must be KNOWN_TYPES or opaque types: "
            f"{where} is a {cls.__module__}.{cls.__qualname__}. aotkit traces a graph once "
            "and reuses it, so whatever the function reads from this object would be baked "
            "into the graph as a constant and silently reused for a different object. "
            "Pass the values the function needs as tensors or as int/float/bool/str "
            "arguments, or, if its values never change, make the object part of the "
            "function instead of an argument (close over it, or bind it with "
            "functools.partial): it is then a constant of the function. Accepted non-tensor inputs: int, float, bool, str, complex, None, "
            "torch.dtype, torch.device, torch.layout, torch.memory_format, SymInt/SymFloat/"
            "SymBool, ScriptObject and registered opaque objects; lists, tuples and dicts "
            "of these are flattened."
        )

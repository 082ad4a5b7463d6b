"""Red-team programs: non-tensor arguments and module attributes that are constants of the
graph. See Note [Non-tensor inputs] (Enum members are opaque constants in torch) and Note
[Plain module attributes in aot_module's key].
"""

from __future__ import annotations

import enum

import pytest
import torch
from aotkit_backends import nop
from aotkit_frontends import aot_function, aot_module


class Mode(enum.Enum):
    DOUBLE = 1
    TRIPLE = 2


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


def _scaled(x: torch.Tensor, mode: Mode) -> torch.Tensor:
    return x * (2 if mode is Mode.DOUBLE else 3)


@pytest.mark.parametrize("dynamic", [False, True])
def test_an_enum_argument_selects_its_own_graph(dynamic: bool) -> None:
    """Before, the key held an Enum member by type only: Mode.TRIPLE reused the graph traced
    for Mode.DOUBLE (2x where eager gives 3x); with dynamic=True the shape guards failed
    on it."""
    fn = aot_function(_scaled, nop, dynamic=dynamic)
    x = torch.randn(3)
    for mode in (Mode.DOUBLE, Mode.TRIPLE, Mode.DOUBLE):
        torch.testing.assert_close(fn(x, mode), _scaled(x, mode))
    assert len(fn._aotkit_cache.entries) == 2  # type: ignore[attr-defined]


def test_an_int_enum_argument_is_keyed_by_value() -> None:
    def f(x: torch.Tensor, level: Level) -> torch.Tensor:
        return x * int(level)

    fn = aot_function(f, nop)
    x = torch.randn(3)
    for level in (Level.LOW, Level.HIGH):
        torch.testing.assert_close(fn(x, level), f(x, level))


@pytest.mark.parametrize("dynamic", [False, True])
def test_str_and_none_arguments_with_dynamic_shapes(dynamic: bool) -> None:
    """With dynamic=True, a str or None argument reached ShapeEnv.produce_guards, which
    raised "Expected SymInt, int, SymFloat, or float, got <class 'str'>"."""

    def f(x: torch.Tensor, how: str, bias: torch.Tensor | None) -> torch.Tensor:
        y = x.sum() if how == "sum" else x.mean()
        return y if bias is None else y + bias

    fn = aot_function(f, nop, dynamic=dynamic)
    for n, how, bias in [(3, "sum", None), (4, "mean", None), (5, "sum", torch.ones(())), (6, "sum", None)]:
        x = torch.randn(n)
        torch.testing.assert_close(fn(x, how, bias), f(x, how, bias))


class WithMode(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))
        self.mode = Mode.DOUBLE

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _scaled(x * self.w, self.mode)


def test_an_enum_module_attribute_is_checked() -> None:
    """Before, an attribute holding an Enum member was not a slot of the key: changing it
    silently ran the graph traced with the old member."""
    model = WithMode()
    compiled = aot_module(model, nop)
    x = torch.randn(3)
    for mode in (Mode.DOUBLE, Mode.TRIPLE, Mode.DOUBLE):
        model.mode = mode
        out = compiled(x)
        expected = model(x)
        torch.testing.assert_close(out, expected)
        out.sum().backward()

"""Red-team programs on input layouts: writes into memory that overlaps itself.

See Note [Writes into memory that overlaps itself in a way eager does not detect].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from aotkit_backends import nop
from aotkit_frontends import aot_function
from aotkit_functional import overlaps_itself
from functorch.compile import nop as torch_nop
from torch._functorch import aot_autograd as torch_aot


def _self_overlapping(base: torch.Tensor) -> torch.Tensor:
    return base.as_strided((3, 3), (1, 1))  # x[i, j] is base[i + j]


def test_torch_silently_differs_from_eager_on_a_self_overlapping_input() -> None:
    """eager's add_ increments a location once per element that shares it."""
    eager_base, torch_base = torch.arange(10.0), torch.arange(10.0)
    _self_overlapping(eager_base).add_(1)
    torch_aot.aot_function(lambda x: x.add_(1), torch_nop)(_self_overlapping(torch_base))
    assert eager_base[:5].tolist() == [1.0, 3.0, 5.0, 5.0, 5.0]
    assert not torch.equal(torch_base, eager_base)


PROGRAMS: list[tuple[str, Callable[[torch.Tensor], Any]]] = [
    ("add_", lambda x: x.add_(1)),
    ("fill_", lambda x: x.fill_(2.0)),
    ("mul_ through a column", lambda x: x[:, 0].mul_(2)),
    ("setitem", lambda x: x.__setitem__((slice(None), 1), 0.0)),
]


@pytest.mark.parametrize("fn", [p[1] for p in PROGRAMS], ids=[p[0] for p in PROGRAMS])
def test_write_into_a_self_overlapping_input_raises_before_touching_it(
    fn: Callable[[torch.Tensor], Any],
) -> None:
    base = torch.arange(10.0)
    with pytest.raises(RuntimeError, match="overlap"):
        aot_function(fn, nop)(_self_overlapping(base))
    assert torch.equal(base, torch.arange(10.0))


def test_write_into_a_self_overlapping_view_of_an_intermediate_raises() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y.as_strided((3, 3), (1, 1)).add_(1)
        return y

    with pytest.raises(RuntimeError, match="overlap in memory"):
        aot_function(fn, nop)(torch.randn(10, requires_grad=True))


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(3, 4).t(),
        lambda: torch.randn(6, 10)[::2, ::3],
        lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        lambda: torch.randn(20).as_strided((3, 2), (5, 2), 1),
    ],
    ids=["transposed", "stepped", "channels_last", "gappy_as_strided"],
)
def test_non_overlapping_layouts_are_still_written_as_eager(make: Callable[[], torch.Tensor]) -> None:
    x = make()
    assert not overlaps_itself(x)
    y = x.clone()
    expected = x.mul(2).add(1)
    out = aot_function(lambda t: t.mul_(2).add_(1), nop)(y)
    torch.testing.assert_close(y, expected)
    assert out is y


def test_overlaps_itself_is_exact() -> None:
    base = torch.zeros(100)
    assert overlaps_itself(base.as_strided((3, 3), (1, 1)))
    assert not overlaps_itself(base.as_strided((3, 2), (2, 3)))  # 0,3 / 2,5 / 4,7
    assert not overlaps_itself(base.as_strided((2, 3), (1, 2)))  # 0,2,4 / 1,3,5
    assert overlaps_itself(base.as_strided((3, 2), (1, 2)))  # 0,2 / 1,3 / 2,4
    assert overlaps_itself(torch.zeros(1).expand(4))
    assert not overlaps_itself(torch.zeros(0, 3).expand(0, 3))
    assert not overlaps_itself(torch.zeros(5)[::2])


def test_view_of_an_input_made_under_no_grad_matches_eager() -> None:
    """Eager's view has requires_grad but no grad_fn: backward through it raises and the
    input gets no gradient from it (torch's AOTAutograd flows one).

    See Note [Views of inputs made under no_grad]."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            v = x.view(-1)
        return v, x * 2

    def intermediate(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2
        with torch.no_grad():
            v = y.view(-1)
        return v, y

    for program in (fn, intermediate):
        x_e = torch.randn(2, 3, requires_grad=True)
        x_c = x_e.detach().clone().requires_grad_()
        v_e, _ = program(x_e)
        v_c, w_c = aot_function(program, nop)(x_c)
        for v in (v_e, v_c):
            assert v.requires_grad and v.grad_fn is None and v._base is not None
        for v in (v_e, v_c):
            with pytest.raises(RuntimeError, match="does not require grad"):
                torch.autograd.backward([v], [torch.ones_like(v)])
        w_c.sum().backward()
        torch.testing.assert_close(x_c.grad, torch.full((2, 3), 2.0))
    x_t = torch.randn(2, 3, requires_grad=True)
    v_t, _ = torch_aot.aot_function(fn, torch_nop)(x_t)
    assert v_t.grad_fn is not None

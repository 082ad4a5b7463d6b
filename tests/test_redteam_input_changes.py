"""Red-team programs: a function that assigns ``.data`` of an input or flips its
``requires_grad``. See Note [Input changes no graph records].

torch's AOTAutograd runs all of these silently wrong (checked below, so a torch fix is
noticed). For ``.data``, aotkit raises ``InputRebindError`` before running anything,
leaving the caller's tensors as they were; a ``requires_grad`` change is followed as
eager does (See Note [Inputs whose requires_grad the function changes];
``test_requires_grad_flips.py`` has the hard cases).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from aotkit_backends import nop
from aotkit_capture import InputRebindError
from aotkit_frontends import aot_export_joint_simple, aot_function, aot_module
from functorch.compile import aot_function as torch_aot_function
from functorch.compile import nop as torch_nop


def _data_same_shape(x: torch.Tensor) -> torch.Tensor:
    x.data = x.data * 2
    return x * 3


def _data_new_shape(x: torch.Tensor) -> torch.Tensor:
    x.data = torch.zeros(5)
    return x * 3


def _data_other_input(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.data = y
    return x * 3


def _requires_grad_method(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    y.requires_grad_()
    return x * y


def _requires_grad_attribute(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    y.requires_grad = True
    return x * y


DATA_PROGRAMS: list[tuple[str, Callable[..., Any], Callable[[], tuple[torch.Tensor, ...]], str]] = [
    ("data, same shape", _data_same_shape, lambda: (torch.randn(3),), r"assigned `\.data`"),
    ("data, same shape, grad", _data_same_shape, lambda: (torch.randn(3, requires_grad=True),), r"assigned `\.data`"),
    ("data, new shape", _data_new_shape, lambda: (torch.randn(3, requires_grad=True),), r"shape \[3\] before, \[5\] after"),
    ("data, other input", _data_other_input, lambda: (torch.randn(3), torch.randn(3)), r"assigned `\.data` of its tensor input 0"),
]
FLAG_PROGRAMS: list[tuple[str, Callable[..., Any], Callable[[], tuple[torch.Tensor, ...]], str]] = [
    ("requires_grad_()", _requires_grad_method, lambda: (torch.randn(3), torch.randn(3)), ""),
    ("requires_grad_() with grad", _requires_grad_method, lambda: (torch.randn(3, requires_grad=True), torch.randn(3)), ""),
    ("requires_grad =", _requires_grad_attribute, lambda: (torch.randn(3), torch.randn(3)), ""),
]
PROGRAMS = DATA_PROGRAMS + FLAG_PROGRAMS


def _observe(fn: Callable[..., Any], args: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
    out = fn(*args)
    return (
        out.detach().clone(),
        out.requires_grad,
        [(a.detach().clone(), a.requires_grad) for a in args],
    )


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    out_a, rg_a, ins_a = a
    out_b, rg_b, ins_b = b
    return (
        out_a.shape == out_b.shape
        and torch.equal(out_a, out_b)
        and rg_a == rg_b
        and all(
            x.shape == y.shape and torch.equal(x, y) and ra == rb
            for (x, ra), (y, rb) in zip(ins_a, ins_b, strict=True)
        )
    )


@pytest.mark.parametrize(
    ("fn", "make", "match"), [p[1:] for p in DATA_PROGRAMS], ids=[p[0] for p in DATA_PROGRAMS]
)
def test_aotkit_raises_and_leaves_the_inputs_alone(
    fn: Callable[..., Any], make: Callable[[], tuple[torch.Tensor, ...]], match: str
) -> None:
    torch.manual_seed(0)
    args = make()
    before = [(a.detach().clone(), a.requires_grad) for a in args]
    with pytest.raises(InputRebindError, match=match):
        aot_function(fn, nop)(*args)
    for a, (value, requires_grad) in zip(args, before, strict=True):
        assert a.shape == value.shape and torch.equal(a.detach(), value)
        assert a.requires_grad == requires_grad


@pytest.mark.parametrize(
    ("fn", "make"), [p[1:3] for p in PROGRAMS], ids=[p[0] for p in PROGRAMS]
)
def test_torch_differs_from_eager_in_silence(
    fn: Callable[..., Any], make: Callable[[], tuple[torch.Tensor, ...]]
) -> None:
    torch.manual_seed(0)
    eager = _observe(fn, make())
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = _observe(torch_aot_function(fn, torch_nop), make())
    assert not _same(eager, theirs)


@pytest.mark.parametrize(
    ("fn", "make"), [p[1:3] for p in FLAG_PROGRAMS], ids=[p[0] for p in FLAG_PROGRAMS]
)
def test_aotkit_follows_a_flag_change_as_eager(
    fn: Callable[..., Any], make: Callable[[], tuple[torch.Tensor, ...]]
) -> None:
    """These raised ``InputRebindError`` before aotkit followed the change."""
    torch.manual_seed(0)
    eager = _observe(fn, make())
    torch.manual_seed(0)
    assert _same(eager, _observe(aot_function(fn, nop), make()))


def test_aot_module_forward_that_flips_an_argument() -> None:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x.requires_grad_()
            return x * self.w

    x = torch.randn(3)
    out = aot_module(M(), nop)(x)
    assert x.requires_grad and x.is_leaf and out.grad_fn is not None
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(3))


def test_export_raises_too() -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        x.data = y.detach()
        return (x * y,)

    with pytest.raises(InputRebindError, match=r"assigned `\.data`"):
        aot_export_joint_simple(fn, [torch.randn(3), torch.randn(3, requires_grad=True)], trace_joint=True)


def test_changes_the_graph_records_still_work() -> None:
    """``set_``, ``copy_`` and a ``.data`` write through an in-place op are recorded."""

    def fn(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        x.set_(y)
        z.data.mul_(2)
        return x * z

    args = [torch.randn(3), torch.randn(3), torch.randn(3)]
    ours = [a.clone() for a in args]
    expected = fn(*args)
    got = aot_function(fn, nop)(*ours)
    torch.testing.assert_close(got, expected)
    for a, b in zip(args, ours, strict=True):
        torch.testing.assert_close(a, b)
    assert ours[0].untyped_storage().data_ptr() == ours[1].untyped_storage().data_ptr()


def test_the_remedy_gives_eager_gradients() -> None:
    """Setting requires_grad before the call, as the error says."""

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y

    x, y = torch.randn(3), torch.randn(3).requires_grad_()
    aot_function(fn, nop)(x, y).sum().backward()
    assert y.grad is not None
    torch.testing.assert_close(y.grad, x)


def test_requires_grad_false_on_an_input_as_eager() -> None:
    """Eager allows it on a leaf input (the trace's inputs are not leaves: aotkit traces
    the input without grad instead); on a non-leaf, eager's own error."""

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        y.requires_grad_(False)
        return x * y

    x, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    out = aot_function(fn, nop)(x, y)
    assert not y.requires_grad and out.requires_grad
    out.sum().backward()
    assert y.grad is None
    torch.testing.assert_close(x.grad, y.detach())
    y2 = torch.randn(3, requires_grad=True) * 1
    with pytest.raises(RuntimeError, match="you can only change requires_grad flags of leaf"):
        aot_function(fn, nop)(x, y2)
    assert y2.requires_grad

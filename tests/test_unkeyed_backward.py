"""The single pass runs the backward without the RNG keying mode when the forward drew no
random numbers, and gives the graph up to the two-pass flow if that backward draws any
(Note [An unkeyed backward])."""

from __future__ import annotations

from typing import Any

import aotkit
import torch
from aotkit_capture import record_compilations


class _ReseedingBackward(torch.autograd.Function):
    """A backward that draws twice from one generator state: eager gets equal draws."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(3)
        a = torch.rand_like(g)
        torch.manual_seed(3)
        b = torch.rand_like(g)
        return g * (a - b + 1)


def _f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _ReseedingBackward.apply(x * w).sin().sum()


def test_a_backward_that_replays_its_own_draw_leaves_the_single_pass() -> None:
    x = torch.randn(4)
    w = torch.randn(4, requires_grad=True)
    _f(x, w).backward()
    expected = w.grad
    w.grad = None
    with record_compilations() as records:
        out = aotkit.aot_function(_f, aotkit.nop)(x, w)
        out.backward()
    assert [r.path for r in records] != ["single pass"]
    assert "random op in the backward" in (records[0].single_pass_skipped or "")
    assert expected is not None and w.grad is not None
    assert torch.equal(w.grad, expected)


def test_a_forward_without_random_ops_keeps_the_single_pass() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x * w).sin().sum()

    x = torch.randn(4)
    w = torch.randn(4, requires_grad=True)
    with record_compilations() as records:
        aotkit.aot_function(f, aotkit.nop)(x, w).backward()
    assert [r.path for r in records] == ["single pass"]
    assert w.grad is not None and torch.allclose(w.grad, x * torch.cos(x * w.detach()))


def test_dropout_in_the_forward_keeps_keying_the_backward() -> None:
    # the forward drew: the backward stays keyed and the single pass is kept
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(x * w, 0.5).sum()

    x = torch.randn(8)
    w = torch.randn(8, requires_grad=True)
    torch.manual_seed(0)
    f(x, w).backward()
    expected = w.grad
    w.grad = None
    compiled = aotkit.aot_function(f, aotkit.nop)
    with record_compilations() as records:
        torch.manual_seed(0)
        compiled(x, w).backward()
    assert [r.path for r in records] == ["single pass"]
    assert expected is not None and w.grad is not None
    assert torch.equal(w.grad, expected)

"""Programs eager runs where aotkit (and torch's AOTAutograd) used to raise (issue 35), each
compared with eager and, where it runs, with torch's AOTAutograd."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from aotkit import aot_function, nop
from torch._functorch.aot_autograd import aot_function as torch_aot_function

# ---- an autograd.Function whose backward raises (Note [Errors raised by a custom backward])


class NoBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        raise ValueError("NoBackward has no backward")


def _through_no_backward(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return NoBackward.apply(x).sum() + y.sum(), (y * 3).sum()


def _backward_raises_run(fn: Any) -> tuple[torch.Tensor | None, str]:
    """Call ``fn``, backpropagate the output that avoids the raising node (fine in eager),
    then the one that reaches it; the gradient of the first and the second's error."""
    x = torch.randn(3, requires_grad=True)
    y = torch.randn(3, requires_grad=True)
    reaches, avoids = fn(x, y)
    avoids.backward()
    grad = None if y.grad is None else y.grad.clone()
    with pytest.raises(ValueError) as info:
        reaches.backward()
    return grad, str(info.value)


def test_custom_backward_that_raises_only_when_reached() -> None:
    eager = _backward_raises_run(_through_no_backward)
    assert eager[0] is not None and eager[1] == "NoBackward has no backward"
    torch.testing.assert_close(eager[0], torch.full((3,), 3.0))
    got = _backward_raises_run(aot_function(_through_no_backward, nop))
    assert got[1] == eager[1] and got[0] is not None
    torch.testing.assert_close(got[0], eager[0])
    # torch's AOTAutograd raises at the call, where eager runs
    with pytest.raises(ValueError, match="NoBackward has no backward"):
        torch_aot_function(_through_no_backward, nop)(
            torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
        )


def test_custom_backward_error_keeps_a_local_class() -> None:
    class Unsupported(Exception):
        pass

    class Local(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x.sin()

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            raise Unsupported(f"no gradient for shape {tuple(grad.shape)}")

    def f(x: torch.Tensor) -> torch.Tensor:
        return Local.apply(x).sum()

    for fn in (f, aot_function(f, nop)):
        out = fn(torch.randn(2, 3, requires_grad=True))
        with pytest.raises(Unsupported, match=r"no gradient for shape \(2, 3\)"):
            out.backward()


def test_torch_errors_in_a_custom_backward_still_raise_at_compile_time() -> None:
    """A custom backward that cannot be traced, as opposed to one that raises itself, is
    not deferred: the error torch raises while tracing comes at the call (Note [Errors
    raised by a custom backward])."""

    class Branches(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            if grad.sum() > 0:  # data-dependent: fine in eager, not on fake tensors
                return grad * 2
            return grad

    def f(x: torch.Tensor) -> torch.Tensor:
        return Branches.apply(x).sum()

    x = torch.randn(3, requires_grad=True)
    f(x).backward()  # eager runs
    with pytest.raises(Exception) as info:
        aot_function(f, nop)(x)
    assert not isinstance(info.value, ValueError)


def test_custom_backward_error_from_the_disk_cache(disk_cache_on: Path) -> None:
    from aotkit_capture import cache_counters

    got = _backward_raises_run(aot_function(_through_no_backward, nop))
    assert cache_counters["trace"] == 1
    again = _backward_raises_run(aot_function(_through_no_backward, nop))
    assert cache_counters["hit"] == 1 and cache_counters["trace"] == 1
    assert again[1] == got[1] == "NoBackward has no backward"
    assert again[0] is not None and got[0] is not None
    torch.testing.assert_close(again[0], got[0])

"""Higher-order gradients through compiled code (issue 37): a backward run with
``create_graph=True`` through a compiled graph returns gradients that are differentiable as
in eager, or raises before anything silently wrong comes out. Eager is the oracle: torch's
own AOTAutograd refuses double backward altogether. See Note [Gradients made with
create_graph=True] in aotkit_runtime."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from aotkit import aot_function, aot_module, nop
from torch.testing._internal.two_tensor import TwoTensor

_CLEAR = "create_graph=True"


def _penalised(f: Callable[..., torch.Tensor], w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """out + |d out / d w|^2, then backward: w.grad needs the gradient's own gradient."""
    out = f(w, x)
    (g,) = torch.autograd.grad(out, w, create_graph=True)
    total = out + (g**2).sum()
    total.backward()
    assert w.grad is not None
    return w.grad


def _tanh_sq(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (torch.tanh(x @ w) ** 2).sum()


def _match_or_raise(run: Callable[[], Any], expected: Any) -> bool:
    """Eager's result, or a clear error: never a silently different value. True when it
    matched."""
    try:
        got = run()
    except RuntimeError as e:
        assert _CLEAR in str(e) or "differentiable twice" in str(e), str(e)
        return False
    torch.testing.assert_close(got, expected)
    return True


def _w_x() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(5, 3, requires_grad=True), torch.randn(4, 5)


def _fresh(w: torch.Tensor) -> torch.Tensor:
    return w.detach().clone().requires_grad_(True)


# ---- never silently wrong, on every entry point -------------------------------------


def test_issue_example_aot_function() -> None:
    w, x = _w_x()
    expected = _penalised(_tanh_sq, _fresh(w), x)
    _match_or_raise(lambda: _penalised(aot_function(_tanh_sq, nop), _fresh(w), x), expected)


class _Critic(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]


def _gradient_penalty_step(critic: Callable[[torch.Tensor], torch.Tensor], params: list[torch.Tensor],
                           real: torch.Tensor, fake: torch.Tensor, eps: torch.Tensor) -> list[Any]:
    """One WGAN-GP critic loss, backward: the parameters' gradients."""
    for p in params:
        p.grad = None
    interp = (eps * real + (1 - eps) * fake).requires_grad_(True)
    score = critic(interp)
    (g,) = torch.autograd.grad(score.sum(), interp, create_graph=True)
    penalty = ((g.flatten(1).norm(2, dim=1) - 1) ** 2).mean()
    loss = critic(fake).mean() - critic(real).mean() + 10 * penalty
    loss.backward()
    return [loss.detach(), *[p.grad for p in params]]


def _gp_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(8, 6), torch.randn(8, 6), torch.rand(8, 1)


@pytest.mark.parametrize("entry", ["aot_module", "aotkit_eager", "aotkit_inductor"])
def test_wgan_gp_matches_eager(entry: str) -> None:
    torch.manual_seed(0)
    model = _Critic()
    real, fake, eps = _gp_data()
    expected = _gradient_penalty_step(model, list(model.parameters()), real, fake, eps)
    if entry == "aot_module":
        compiled: Callable[[torch.Tensor], torch.Tensor] = aot_module(model, nop)
    else:
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=entry)
    _match_or_raise(
        lambda: _gradient_penalty_step(compiled, list(model.parameters()), real, fake, eps),
        expected,
    )


def test_subclass_never_silently_wrong() -> None:
    def f(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return (torch.tanh(x @ w) ** 2).sum()

    torch.manual_seed(0)
    a, b = torch.randn(5, 3), torch.randn(5, 3)
    x = torch.randn(4, 5)

    def two() -> torch.Tensor:
        return TwoTensor(a.clone(), b.clone()).requires_grad_(True)

    expected = _penalised(f, two(), x)
    _match_or_raise(lambda: _penalised(aot_function(f, nop), two(), x), expected)


def test_effects_never_silently_wrong() -> None:
    from _effect_ops import LOG

    def f(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aotkit_effects_test.log(torch.tanh(x @ w), "fw")
        return (y**2).sum()

    w, x = _w_x()
    LOG.clear()
    expected = _penalised(f, _fresh(w), x)
    eager_log = list(LOG)
    LOG.clear()
    if _match_or_raise(lambda: _penalised(aot_function(f, nop), _fresh(w), x), expected):
        assert LOG == eager_log


def test_restored_disk_cache_entry(disk_cache_on: Any) -> None:
    from aotkit_capture import cache_counters

    w, x = _w_x()
    expected = _penalised(_tanh_sq, _fresh(w), x)
    _match_or_raise(lambda: _penalised(aot_function(_tanh_sq, nop), _fresh(w), x), expected)
    assert cache_counters.get("store") == 1
    cache_counters.clear()
    restored = aot_function(_tanh_sq, nop)
    _match_or_raise(lambda: _penalised(restored, _fresh(w), x), expected)
    assert cache_counters.get("hit") == 1

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
    assert _match_or_raise(lambda: _penalised(aot_function(_tanh_sq, nop), _fresh(w), x), expected)


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
    got = _gradient_penalty_step(compiled, list(model.parameters()), real, fake, eps)
    if entry == "aotkit_inductor":
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    else:
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


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
    from aotkit_cache import cache_counters

    w, x = _w_x()
    expected = _penalised(_tanh_sq, _fresh(w), x)
    _penalised(aot_function(_tanh_sq, nop), _fresh(w), x)
    assert cache_counters.get("store") == 1
    cache_counters.clear()
    restored = aot_function(_tanh_sq, nop)
    assert _match_or_raise(lambda: _penalised(restored, _fresh(w), x), expected)
    assert cache_counters.get("hit") == 1


def test_gradient_without_history_needs_no_error() -> None:
    # eager's gradient does not require grad here: f is linear in w
    f = aot_function(lambda w, x: (x @ w).sum(), nop)
    w, x = _w_x()
    (g,) = torch.autograd.grad(f(w, x), w, create_graph=True)
    (ge,) = torch.autograd.grad((x @ w).sum(), w, create_graph=True)
    torch.testing.assert_close(g, ge)
    assert g.requires_grad == ge.requires_grad


# ---- higher-order gradients that work -----------------------------------------------


def _exact(got: Any, expected: Any) -> None:
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_hessian_vector_product_and_third_derivative() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (torch.sin(x * w) * x.exp()).sum()

    torch.manual_seed(0)
    x0, w0, v = torch.randn(6), torch.randn(6), torch.randn(6)

    def derivatives(fn: Callable[..., torch.Tensor]) -> list[torch.Tensor]:
        x = x0.clone().requires_grad_(True)
        w = w0.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(fn(x, w), x, create_graph=True)
        (hv,) = torch.autograd.grad(g, x, v, create_graph=True)  # Hessian-vector product
        (third,) = torch.autograd.grad(hv.sum(), x, create_graph=True)
        (fourth_w,) = torch.autograd.grad(third.sum(), w)  # mixed, w: a parameter
        return [g, hv, third, fourth_w]

    compiled = aot_function(f, nop)
    got = derivatives(compiled)
    _exact(got, derivatives(f))
    assert all(t.requires_grad for t in got[:3])
    assert len(compiled._aotkit_cache.entries) == 1  # type: ignore[attr-defined]


def test_backward_with_create_graph_on_parameters_and_inputs() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Softplus(), torch.nn.Linear(8, 1))
    x0 = torch.randn(5, 4)

    def run(m: Callable[[torch.Tensor], torch.Tensor]) -> list[Any]:
        model.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(True)
        m(x).sum().backward(create_graph=True)
        grads = [p.grad for p in model.parameters()] + [x.grad]
        # differentiate the .grad fields: a penalty on all of them, back to the parameters
        penalty = sum((g**2).sum() for g in grads if g is not None)
        assert isinstance(penalty, torch.Tensor)
        again = torch.autograd.grad(penalty, [*model.parameters(), x], allow_unused=True)
        return [g.detach() for g in grads if g is not None] + list(again)

    expected = run(model)
    _exact(run(aot_module(model, nop)), expected)


def test_pinn_residual_with_second_derivative() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
        torch.nn.Linear(16, 1),
    )
    pts = torch.rand(12, 2)

    def loss_and_grads(u_fn: Callable[[torch.Tensor], torch.Tensor]) -> list[Any]:
        net.zero_grad(set_to_none=True)
        xt = pts.clone().requires_grad_(True)
        u = u_fn(xt)
        (du,) = torch.autograd.grad(u.sum(), xt, create_graph=True)
        u_x, u_t = du[:, 0], du[:, 1]
        (du_x,) = torch.autograd.grad(u_x.sum(), xt, create_graph=True)
        u_xx = du_x[:, 0]
        residual = u_t - 0.1 * u_xx  # the heat equation
        loss = (residual**2).mean() + (u**2).mean()
        loss.backward()
        return [loss.detach(), *[p.grad for p in net.parameters()]]

    expected = loss_and_grads(net)
    # the loss reaches the parameters through u and through u_t, u_xx: see
    # test_first_order_use_after_a_higher_order_one for why the last bits may differ
    torch.testing.assert_close(loss_and_grads(aot_module(net, nop)), expected)
    torch._dynamo.reset()
    torch.testing.assert_close(
        loss_and_grads(torch.compile(net, backend="aotkit_eager")), expected
    )


def test_first_order_use_after_a_higher_order_one() -> None:
    w, x = _w_x()
    compiled = aot_function(_tanh_sq, nop)
    expected = _penalised(_tanh_sq, _fresh(w), x)
    # two paths reach w (the loss's, through the compiled backward, and the penalty's):
    # autograd adds them in another order than eager, so the last bits may differ
    torch.testing.assert_close(_penalised(compiled, _fresh(w), x), expected)
    w1 = _fresh(w)
    compiled(w1, x).backward()
    we = _fresh(w)
    _tanh_sq(we, x).backward()
    _exact(w1.grad, we.grad)
    # and again higher order, on the same entry
    torch.testing.assert_close(_penalised(compiled, _fresh(w), x), expected)
    assert len(compiled._aotkit_cache.entries) == 1  # type: ignore[attr-defined]


def test_dropout_inside_a_gradient_penalty_replays_the_forward_draw() -> None:
    def f(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return (torch.nn.functional.dropout(torch.tanh(x @ w), 0.5, training=True) ** 2).sum()

    w, x = _w_x()

    def run(fn: Callable[..., torch.Tensor]) -> list[Any]:
        torch.manual_seed(3)
        g = _penalised(fn, _fresh(w), x)
        return [g, torch.rand(3)]  # the generator after the step is eager's too

    expected = run(f)
    torch.testing.assert_close(run(aot_function(f, nop)), expected)  # the mask: exactly


def test_batch_norm_in_training_mode() -> None:
    torch.manual_seed(0)
    # float64: the Linear's bias gradient is zero in exact arithmetic (BatchNorm removes the
    # mean), so in float32 both sides are rounding noise of 1e-5 that no tolerance separates
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 6), torch.nn.BatchNorm1d(6), torch.nn.Tanh()
    ).double()
    x0 = torch.randn(8, 3, dtype=torch.float64)

    def run(m: Callable[[torch.Tensor], torch.Tensor]) -> list[Any]:
        model.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(True)
        out = (m(x) ** 2).sum()
        (g,) = torch.autograd.grad(out, x, create_graph=True)
        (out + (g**2).sum()).backward()
        return [x.grad, *[p.grad for p in model.parameters()], *model.buffers()]

    import copy

    state = copy.deepcopy(model.state_dict())
    expected = run(model)
    model.load_state_dict(state)
    torch.testing.assert_close(run(aot_module(model, nop)), expected)


# ---- what can't recompute raises clearly ---------------------------------------------


class _StraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return torch.round(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g


def _first_order_right_second_refused(f: Callable[..., torch.Tensor], reason: str) -> None:
    """The compiled gradient equals eager's; differentiating it again raises naming ``reason``."""
    w, x = _w_x()
    wc = _fresh(w)
    (g,) = torch.autograd.grad(aot_function(f, nop)(wc, x), wc, create_graph=True)
    we = _fresh(w)
    (ge,) = torch.autograd.grad(f(we, x), we, create_graph=True)
    _exact(g.detach(), ge.detach())  # first order still right
    with pytest.raises(RuntimeError, match=reason):
        (g**2).sum().backward()


def test_custom_autograd_function_raises_at_second_differentiation() -> None:
    def f(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return (_StraightThrough.apply(x @ w) * torch.tanh(w).sum()).sum()

    _first_order_right_second_refused(f, "custom autograd.Function _StraightThrough")


def test_tensor_hook_raises_at_second_differentiation() -> None:
    def f(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(x @ w)
        y.register_hook(lambda g: g * 2)
        return (y**2).sum()

    _first_order_right_second_refused(f, "hook on a tensor")


def test_input_changed_in_place_before_the_backward_raises() -> None:
    w, x = _w_x()
    wc = _fresh(w)
    out = aot_function(lambda w, x: (torch.tanh(x @ w + w.sum()) ** 2).sum(), nop)(wc, x)
    with torch.no_grad():
        wc.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation|modified in place"):
        torch.autograd.grad(out, wc, create_graph=True)


def test_mutated_input_raises_at_second_differentiation() -> None:
    def f(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return (torch.tanh(x @ w) ** 2).sum()

    w, x = _w_x()
    wc = _fresh(w)
    (g,) = torch.autograd.grad(aot_function(f, nop)(wc, x.clone()), wc, create_graph=True)
    with pytest.raises(RuntimeError, match="mutates its input 1 in place"):
        (g**2).sum().backward()


def test_dynamic_shapes() -> None:
    compiled = aot_function(_tanh_sq, nop, dynamic=True)
    for rows in (4, 7):
        torch.manual_seed(rows)
        w, x = torch.randn(5, 3), torch.randn(rows, 5)
        torch.testing.assert_close(_penalised(compiled, _fresh(w), x), _penalised(_tanh_sq, _fresh(w), x))


def test_checkpointed_region_with_dropout() -> None:
    from torch.utils.checkpoint import checkpoint

    def block(h: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(torch.tanh(h), 0.3, training=True) * h

    def f(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        h = checkpoint(block, x @ w, use_reentrant=False)
        assert isinstance(h, torch.Tensor)
        return (h**2).sum()

    w, x = _w_x()

    def run(fn: Callable[..., torch.Tensor]) -> list[Any]:
        torch.manual_seed(5)
        return [_penalised(fn, _fresh(w), x), torch.rand(2)]

    torch.testing.assert_close(run(aot_function(f, nop)), run(f))


@torch.library.custom_op("aotkit_higher_order_test::cube", mutates_args=())
def _cube(x: torch.Tensor) -> torch.Tensor:
    return x**3


@_cube.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _cube_setup(ctx: Any, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
    ctx.save_for_backward(inputs[0])


def _cube_backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
    (x,) = ctx.saved_tensors
    return g * 3 * x**2


_cube.register_autograd(_cube_backward, setup_context=_cube_setup)


def test_custom_op_with_a_registered_backward() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aotkit_higher_order_test.cube(x.sin()).sum()

    torch.manual_seed(0)
    x0 = torch.randn(5)

    def run(fn: Callable[..., torch.Tensor]) -> list[Any]:
        x = x0.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(fn(x), x, create_graph=True)
        (h,) = torch.autograd.grad(g.sum(), x)
        return [g.detach(), h]

    _exact(run(aot_function(f, nop)), run(f))


def test_gradient_through_the_tangent() -> None:
    # double backward with respect to grad_outputs (v requires grad): d/dv (J^T v)
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin() * x

    torch.manual_seed(0)
    x0, v0 = torch.randn(4), torch.randn(4)

    def run(fn: Callable[..., torch.Tensor]) -> list[Any]:
        x, v = x0.clone().requires_grad_(True), v0.clone().requires_grad_(True)
        (jv,) = torch.autograd.grad(fn(x), x, v, create_graph=True)
        return list(torch.autograd.grad((jv**2).sum(), [x, v]))

    _exact(run(aot_function(f, nop)), run(f))


def test_whole_critic_step_under_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    # dynamo skips a frame calling torch.autograd.grad unless trace_autograd_ops is on;
    # with it the whole step (penalty and backward) is one aotkit graph, no graph break
    import torch._dynamo.utils

    monkeypatch.setattr(torch._dynamo.config, "trace_autograd_ops", True)
    torch.manual_seed(0)
    model = _Critic()
    real, fake, eps = _gp_data()
    params = list(model.parameters())
    expected = _gradient_penalty_step(model, params, real, fake, eps)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    step = torch.compile(_gradient_penalty_step, backend="aotkit_eager")
    got = step(model, params, real, fake, eps)
    torch.testing.assert_close(got, expected)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not torch._dynamo.utils.counters["graph_break"]


def test_dropout_under_inductor_is_never_silently_wrong() -> None:
    # Inductor's kernels draw their own random numbers: the recompute can't replay them
    class Noisy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(6, 6)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.dropout(torch.tanh(self.lin(x)), 0.5, training=True)

    torch.manual_seed(0)
    model = Noisy()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aotkit_inductor")
    x = torch.randn(4, 6, requires_grad=True)
    (g,) = torch.autograd.grad(compiled(x).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="draws random numbers"):
        (g**2).sum().backward()


def test_backward_inside_autocast() -> None:
    def f(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return (torch.tanh(x @ w) ** 2).sum()

    w, x = _w_x()

    def run(fn: Callable[..., torch.Tensor]) -> torch.Tensor:
        wc = _fresh(w)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fn(wc, x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            (g,) = torch.autograd.grad(out, wc, create_graph=True)
        (out + (g.float() ** 2).sum()).backward()
        assert wc.grad is not None
        return wc.grad

    torch.testing.assert_close(run(aot_function(f, nop)), run(f), rtol=2e-2, atol=2e-2)


def test_maml_inner_step_with_functional_call_under_torch_compile() -> None:
    from torch.func import functional_call

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    xs, ys, xq, yq = torch.randn(6, 3), torch.randn(6, 1), torch.randn(5, 3), torch.randn(5, 1)

    def forward_with(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, params, (x,))
        assert isinstance(out, torch.Tensor)
        return out

    def meta_grads(fwd: Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor]) -> list[Any]:
        params = dict(model.named_parameters())
        loss = torch.nn.functional.mse_loss(fwd(params, xs), ys)
        grads = torch.autograd.grad(loss, list(params.values()), create_graph=True)
        adapted = {k: p - 0.1 * g for (k, p), g in zip(params.items(), grads, strict=True)}
        query = torch.nn.functional.mse_loss(fwd(adapted, xq), yq)
        return list(torch.autograd.grad(query, list(params.values())))

    from torch._dynamo.utils import counters

    expected = meta_grads(forward_with)
    torch._dynamo.reset()
    counters.clear()
    torch.testing.assert_close(
        meta_grads(torch.compile(forward_with, backend="aotkit_eager")), expected
    )
    assert counters["stats"]["unique_graphs"] >= 1


def test_custom_autograd_function_under_torch_compile_is_never_silently_wrong() -> None:
    def f(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return (_StraightThrough.apply(x @ w) * torch.tanh(w).sum()).sum()

    w, x = _w_x()
    expected = _penalised(f, _fresh(w), x)
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="aotkit_eager")
    _match_or_raise(lambda: _penalised(compiled, _fresh(w), x), expected)

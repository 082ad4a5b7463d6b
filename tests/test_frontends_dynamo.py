"""torch.compile with aotkit's dynamo backends matches eager, forward and backward."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import torch
import torch._dynamo
import torch.nn as nn
from aotkit_backends import inductor_available, inductor_unavailable_reason, nop
from aotkit_frontends import aot_autograd, register_dynamo_backends


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    register_dynamo_backends()
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@dataclass(frozen=True)
class Case:
    name: str
    make_model: Callable[[], nn.Module]
    make_input: Callable[[], torch.Tensor]


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def _convnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(4 * 4 * 4, 5),
    )


def _transformer() -> nn.Module:
    # dropout=0 so compiled and eager runs draw no random numbers
    return nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0, batch_first=True)


CASES = [
    Case("mlp", _mlp, lambda: torch.randn(4, 8)),
    Case("convnet", _convnet, lambda: torch.randn(2, 3, 8, 8)),
    Case("transformer", _transformer, lambda: torch.randn(2, 5, 8)),
]


def _check_matches_eager(case: Case, backend: str) -> None:
    torch.manual_seed(0)
    model = case.make_model()
    x = case.make_input()
    eager_model = case.make_model()
    eager_model.load_state_dict(model.state_dict())

    compiled = torch.compile(model, backend=backend)
    out = compiled(x)
    out.square().sum().backward()
    ref = eager_model(x)
    ref.square().sum().backward()

    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), eager_model.parameters(), strict=True):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    for (name, b), c in zip(model.named_buffers(), eager_model.buffers(), strict=True):
        torch.testing.assert_close(b, c, msg=name)  # BatchNorm running stats


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_aotkit_eager_matches_eager(case: Case) -> None:
    _check_matches_eager(case, "aotkit_eager")


@pytest.mark.slow
@pytest.mark.skipif(not inductor_available(), reason=str(inductor_unavailable_reason()))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_aotkit_inductor_matches_eager(case: Case) -> None:
    _check_matches_eager(case, "aotkit_inductor")


def test_graph_break_compiles_every_region() -> None:
    compiled_graphs: list[str] = []

    def counting_nop(gm: torch.fx.GraphModule, example_inputs: list[object]) -> object:
        compiled_graphs.append(gm.code)
        return nop(gm, example_inputs)

    backend = aot_autograd(fw_compiler=counting_nop)
    calls = 0

    def counted(gm: torch.fx.GraphModule, example_inputs: list[object]) -> object:
        nonlocal calls
        calls += 1
        return backend(gm, example_inputs)

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = (x @ w).relu()
        torch._dynamo.graph_break()
        z = y.sin() * w.sum()
        torch._dynamo.graph_break()
        return (z + x).sum(0)

    x = torch.randn(3, 3)
    w = torch.randn(3, 3, requires_grad=True)
    out = torch.compile(f, backend=counted)(x, w)
    out.sum().backward()
    assert w.grad is not None
    grad = w.grad.clone()
    w.grad = None
    ref = f(x, w)
    ref.sum().backward()
    assert calls == 3
    # every region is differentiable: a forward and a backward graph each
    assert len(compiled_graphs) == 6
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(grad, w.grad)


def test_print_graph_break_and_input_mutation() -> None:
    def f(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        buf.add_(1)
        print("graph break")
        return x * buf

    x = torch.randn(4, requires_grad=True)
    buf, ref_buf = torch.zeros(4), torch.zeros(4)
    out = torch.compile(f, backend="aotkit_eager")(x, buf)
    ref = f(x, ref_buf)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(buf, ref_buf)


def test_dynamic_shapes_recompile_symbolically() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sum(0)

    compiled = torch.compile(f, backend="aotkit_eager", dynamic=True)
    for n in (3, 5, 7):
        x = torch.randn(n, 2)
        torch.testing.assert_close(compiled(x), f(x))


@pytest.mark.slow
@pytest.mark.skipif(not inductor_available(), reason=str(inductor_unavailable_reason()))
def test_aotkit_inductor_inference_with_input_mutation() -> None:
    # Inductor's boxed graphs clear their argument list; the runtime epilogue that applies
    # the mutation to `buf` must still see the inputs.
    def f(x: torch.Tensor, buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        buf.add_(1)
        return x * buf, x.view(-1)

    x, buf, ref_buf = torch.randn(2, 2), torch.zeros(2, 2), torch.zeros(2, 2)
    with torch.no_grad():
        out = torch.compile(f, backend="aotkit_inductor")(x, buf)
    ref = f(x, ref_buf)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(buf, ref_buf)
    assert out[1]._base is x, "an output aliasing an input is a real view of it"


def test_mem_efficient_fusion_kwargs_backend_matches_eager() -> None:
    from aotkit_frontends import mem_efficient_fusion_kwargs

    torch.manual_seed(0)
    model = _mlp()
    x = torch.randn(4, 8)
    out = torch.compile(model, backend=aot_autograd(**mem_efficient_fusion_kwargs(use_decomps=True)))(x)
    out.sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    model(x).sum().backward()
    torch.testing.assert_close(grads, [p.grad for p in model.parameters()])

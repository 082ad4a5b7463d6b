"""Behaviours torch's own AOTAutograd test suite relies on, beyond values and gradients.

Each test pins one convention that a drop-in must share with torch: exception types,
when compilers run, graph output containers, and error texts.
"""

from __future__ import annotations

from typing import Any

import aotkit
import functorch.compile as torch_compile
import pytest
import torch
from aotkit_frontends import default_decompositions
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.testing._internal.two_tensor import TwoTensor, TwoTensorMode


def test_tracing_errors_keep_torchs_exception_types() -> None:
    with pytest.raises(DynamicOutputShapeException) as shape_err:
        aotkit.aot_function(lambda x: x[x > 0], aotkit.nop)(torch.randn(4))
    assert isinstance(shape_err.value, aotkit.AOTCompileError)
    assert shape_err.value.func is torch.ops.aten.nonzero.default
    with pytest.raises(DataDependentOutputException) as value_err:
        aotkit.aot_function(lambda x: x * 2 if x.sum() > 0 else x, aotkit.nop)(torch.randn(4))
    assert "torch.where" in str(value_err.value)


def test_backward_is_compiled_at_the_first_backward_like_torch() -> None:
    calls: list[str] = []

    def bw_compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        calls.append("bw")
        return aotkit.nop(gm, example_inputs)

    f = aotkit.aot_function(lambda x: x.sin() * 2, aotkit.nop, bw_compiler)
    x = torch.randn(3, requires_grad=True)
    out = f(x)
    assert calls == []
    torch.autograd.backward([out.sum()])
    torch.autograd.backward([f(x).sum()])
    assert calls == ["bw"]
    torch.testing.assert_close(x.grad, 2 * 2 * x.detach().cos())


def test_inference_graphs_return_tuples() -> None:
    codes: list[str] = []

    def show(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        codes.append(gm.code)
        return aotkit.nop(gm, example_inputs)

    aotkit.aot_function(lambda a: a.view(-1), show)(torch.ones(2, 2))
    assert "return (view,)" in codes[0]


def test_autograd_grad_inside_the_compiled_function() -> None:
    x = torch.randn((), requires_grad=True)
    (grad,) = aotkit.aot_function(lambda t: torch.autograd.grad(torch.exp(t), t), aotkit.nop)(x)
    torch.testing.assert_close(grad, torch.exp(x.detach()))


def test_default_decompositions_is_torchs_table() -> None:
    assert isinstance(default_decompositions, dict)
    assert set(default_decompositions) == set(torch_compile.default_decompositions)
    f = aotkit.aot_function(lambda x: x.cos(), aotkit.nop, decompositions=default_decompositions)
    x = torch.randn(3, requires_grad=True)
    torch.testing.assert_close(f(x), x.cos())


def test_output_aliasing_a_subclass_input_is_a_view() -> None:
    b = TwoTensor(torch.ones(3, 3, requires_grad=True), torch.ones(3, 3, requires_grad=True))
    a = torch.ones(3, 3, requires_grad=True)
    view, prod = aotkit.aot_function(lambda a, b: (b.view(b.shape), a * b), aotkit.nop)(a, b)
    assert isinstance(view, TwoTensor) and view._is_view()
    torch.testing.assert_close(prod.a, a * b.a)


def test_mutated_aliased_subclass_inputs_raise_torchs_error() -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a.mul_(2)
        b.t_()
        return a.mul(b)

    with TwoTensorMode():
        x = torch.ones(2, 2).add(1)
        a, b = x[0], x[0]
    with pytest.raises(RuntimeError, match="Encountered aliased inputs that are mutated in the graph"):
        aotkit.aot_function(f, aotkit.nop)(a, b)


class _MutatesInput(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        x.mul_(2)
        return (x + y,)


@pytest.mark.parametrize(
    ("make_args", "message"),
    [
        (lambda x: [x, x], "Encountered duplicated inputs that are mutated in the graph you are trying to export"),
        (lambda x: [x, x.view(2)], "Encountered aliased inputs that are mutated in the graph you are trying to export"),
    ],
)
def test_export_errors_lead_with_torchs_text(make_args: Any, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        aotkit.aot_export_module(_MutatesInput(), make_args(torch.ones(2)), trace_joint=False)


def test_backward_through_a_stale_saved_value_raises_only_when_used() -> None:
    # See Note [Backward paths through stale saved values]
    def f(v0: torch.Tensor, v1: torch.Tensor) -> tuple[torch.Tensor]:
        v2 = v0.sin()
        v0.add_(1.5)
        v1.add_(v2.mean())
        return (v0,)

    results = []
    for fn in (f, aotkit.aot_function(f, aotkit.nop)):
        torch.manual_seed(0)
        leaf = torch.randn(4, requires_grad=True)
        v0, v1 = leaf.clone(), torch.randn(4)
        (out,) = fn(v0, v1)
        torch.autograd.backward([out.sum()])
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.backward([v1.sum()])
        assert leaf.grad is not None
        results.append((out.detach(), v1.detach(), leaf.grad.clone()))
    for eager_value, aot_value in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(aot_value, eager_value)

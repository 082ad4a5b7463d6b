"""The default partitioner saves what torch's ``default_partition`` saves.

Linear layers and transposed weights read by ``matmul``/``mm``/``addmm``, under
``aot_function`` and under ``torch.compile`` (``aot_module_simplified``), with static and
dynamic shapes: aotkit's forward and backward graphs must read as torch's (the forward
saves the weights' ``t`` values it computed, never a backward-only ``t(t)``), and values
and gradients must match eager. See Note [Forward and backward tags] in aotkit_tracing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aotkit
import functorch.compile as torch_compile
import pytest
import torch
import torch.nn.functional as F
from _autograd_functions import SaveInput
from torch._dynamo.backends.common import aot_autograd as torch_aot_autograd


class _TwoLinear(torch.nn.Module):
    """torch suite's ``test_saved_tensors_hooks_params`` model (on CPU)."""

    def __init__(self, *, custom: bool, bias: bool) -> None:
        super().__init__()
        self.custom = custom
        self.fc1 = torch.nn.Linear(2, 2, bias=bias)
        self.relu = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(2, 2, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.custom:
            x = SaveInput.apply(x)
        x = x.to(dtype=torch.float32)
        return self.fc2(self.relu(self.fc1(x)))


class _TransposedWeights(torch.nn.Module):
    def __init__(self, op: str, *, bias: bool) -> None:
        super().__init__()
        self.op = op
        self.w1 = torch.nn.Parameter(torch.randn(4, 3))
        self.w2 = torch.nn.Parameter(torch.randn(5, 4))
        self.b1 = torch.nn.Parameter(torch.randn(4)) if bias else None
        self.b2 = torch.nn.Parameter(torch.randn(5)) if bias else None

    def _layer(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if self.op == "linear":
            return F.linear(x, w, b)
        if self.op == "addmm" and b is not None:
            return torch.addmm(b, x, w.t())
        y = torch.matmul(x, w.t()) if self.op == "matmul" else torch.mm(x, w.t())
        return y if b is None else y + b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # linear and matmul take the batched input: under dynamic shapes their forward ends
        # in size arithmetic that make_fx's dead-code elimination drops (Note [Forward and
        # backward tags]); mm and addmm take it flattened, and the result is viewed back
        flat = x if self.op in ("linear", "matmul") else x.flatten(0, 1)
        y = self._layer(self._layer(flat, self.w1, self.b1).tanh(), self.w2, self.b2)
        return y if y.dim() == 3 else y.view(x.shape[0], x.shape[1], -1)


def _recorder(codes: list[str]) -> Callable[[torch.fx.GraphModule, Any], Any]:
    def record(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        codes.append(gm.code.strip())
        return torch_compile.make_boxed_func(gm.forward)

    return record


def _grads(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor | None]:
    return [x.grad, *(p.grad for p in model.parameters())]


def _check_against_eager(
    make: Callable[[], torch.nn.Module], make_x: Callable[[], torch.Tensor], run: Any
) -> list[list[str]]:
    """Runs the model eagerly and through each of ``run``'s compilers; returns the graph
    texts of each compiled run after checking outputs and gradients against eager."""
    torch.manual_seed(0)
    model = make()
    x = make_x()
    expected = model(x)
    expected.sum().backward()
    want = _grads(model, x)
    texts = []
    for compile_model in run:
        torch.manual_seed(0)
        model = make()
        x = make_x()
        codes: list[str] = []
        out = compile_model(model, _recorder(codes), x)
        torch.testing.assert_close(out, expected)
        assert out.stride() == expected.stride() and out.requires_grad
        out.sum().backward()
        for got, ref in zip(_grads(model, x), want, strict=True):
            torch.testing.assert_close(got, ref)
        texts.append(codes)
    return texts


def _through_compile(factory: Any, *, dynamic: bool, partition_fn: Any = None) -> Any:
    def run(model: torch.nn.Module, record: Any, x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.reset()
        if dynamic:
            for dim in range(x.dim() - 1):  # the features stay static, as a Linear needs
                torch._dynamo.mark_dynamic(x, dim)
        kwargs = {} if partition_fn is None else {"partition_fn": partition_fn}
        backend = factory(fw_compiler=record, bw_compiler=record, **kwargs)
        out: torch.Tensor = torch.compile(model, backend=backend)(x)
        return out

    return run


def _through_aot_module(api: Any, **kwargs: Any) -> Any:
    def run(model: torch.nn.Module, record: Any, x: torch.Tensor) -> torch.Tensor:
        compiled = api.aot_module(model, fw_compiler=record, bw_compiler=record, **kwargs)
        out: torch.Tensor = compiled(x)
        return out

    return run


def _suite_input() -> torch.Tensor:
    return torch.ones(2, 2, 2, dtype=torch.float64, requires_grad=True)


def _batched_input() -> torch.Tensor:
    return torch.randn(2, 6, 3, requires_grad=True)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("custom", [False, True])
def test_suite_model_under_torch_compile_saves_torchs_values(
    custom: bool, bias: bool, dynamic: bool
) -> None:
    ours, theirs = _check_against_eager(
        lambda: _TwoLinear(custom=custom, bias=bias),
        _suite_input,
        [
            _through_compile(aotkit.aot_autograd, dynamic=dynamic),
            _through_compile(torch_aot_autograd, dynamic=dynamic),
        ],
    )
    assert len(ours) == 2
    assert ours == theirs


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("op", ["linear", "matmul", "mm", "addmm"])
def test_transposed_weights_under_torch_compile(op: str, bias: bool, dynamic: bool) -> None:
    ours, theirs = _check_against_eager(
        lambda: _TransposedWeights(op, bias=bias),
        _batched_input,
        [
            _through_compile(aotkit.aot_autograd, dynamic=dynamic),
            _through_compile(torch_aot_autograd, dynamic=dynamic),
        ],
    )
    assert len(ours) == 2
    assert ours == theirs
    # the forward hands the backward the weights' transposes it computed itself: it never
    # computes the backward's transpose of one
    assert "aten.t.default(t" not in ours[0]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("op", ["linear", "matmul", "mm", "addmm"])
def test_transposed_weights_under_aot_module(op: str, bias: bool) -> None:
    ours, theirs = _check_against_eager(
        lambda: _TransposedWeights(op, bias=bias),
        _batched_input,
        [_through_aot_module(aotkit), _through_aot_module(torch_compile)],
    )
    assert len(ours) == 2
    assert ours == theirs


@pytest.mark.parametrize("bias", [False, True])
def test_suite_model_under_aot_module(bias: bool) -> None:
    ours, theirs = _check_against_eager(
        lambda: _TwoLinear(custom=True, bias=bias),
        _suite_input,
        [_through_aot_module(aotkit), _through_aot_module(torch_compile)],
    )
    assert len(ours) == 2
    assert ours == theirs


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize(
    "make",
    [
        lambda: _TwoLinear(custom=True, bias=True),
        lambda: _TwoLinear(custom=False, bias=False),
        lambda: _TransposedWeights("linear", bias=False),
        lambda: _TransposedWeights("addmm", bias=True),
    ],
)
def test_min_cut_under_torch_compile_saves_the_weights(make: Any, dynamic: bool) -> None:
    """torch.compile hands the partitioner the parameters' positions (static-lifetime
    inputs, free to save): min-cut saves the weights and recomputes their transposes. See
    Note [Static-lifetime inputs reach the partitioner] in aotkit_capture."""
    make_x = _suite_input if isinstance(make(), _TwoLinear) else _batched_input
    ours, theirs = _check_against_eager(
        make,
        make_x,
        [
            _through_compile(
                aotkit.aot_autograd,
                dynamic=dynamic,
                partition_fn=aotkit.min_cut_rematerialization_partition,
            ),
            _through_compile(
                torch_aot_autograd,
                dynamic=dynamic,
                partition_fn=torch_compile.min_cut_rematerialization_partition,
            ),
        ],
    )
    assert len(ours) == 2
    assert ours == theirs
    assert "aten.t.default(t" not in ours[0]

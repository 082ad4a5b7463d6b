"""The aot_autograd backend factory and its helpers, called directly (no torch.compile)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.fx
from aotkit_backends import nop
from aotkit_frontends import (
    aot_autograd,
    device_from_inputs,
    dtype_from_inputs,
    fake_tensor_unsupported,
    mem_efficient_fusion_kwargs,
)
from aotkit_partitioners import min_cut_rematerialization_partition
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode


def _graph() -> torch.fx.GraphModule:
    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
        return ((x @ w).relu(),)

    return torch.fx.symbolic_trace(f)


def test_fw_compiler_is_required() -> None:
    with pytest.raises(TypeError, match="fw_compiler"):
        aot_autograd(bw_compiler=nop)


def test_backend_compiles_forward_and_disabled_backward() -> None:
    seen: list[str] = []

    def fw(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        seen.append("fw")
        return nop(gm, example_inputs)

    def bw(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        seen.append("bw")
        return nop(gm, example_inputs)

    backend = aot_autograd(fw_compiler=fw, bw_compiler=bw)
    x, w = torch.randn(2, 3), torch.randn(3, 3, requires_grad=True)
    compiled = backend(_graph(), [x, w])
    (out,) = compiled(x, w)  # dynamo's unboxed calling convention
    out.sum().backward()
    assert seen == ["fw", "bw"]
    torch.testing.assert_close(out, (x @ w).relu())
    assert w.grad is not None
    # the compiled callable and the backward compiler are hidden from dynamo
    assert getattr(compiled, "_torchdynamo_disable", False)
    assert getattr(backend.kwargs["bw_compiler"], "_aotkit_disabled_bw", False)


def test_decompositions_thunk_is_resolved_at_first_compile() -> None:
    calls = 0

    def table() -> dict[Any, Any]:
        nonlocal calls
        calls += 1
        return {}

    backend = aot_autograd(fw_compiler=nop, decompositions=table)
    assert calls == 0
    x, w = torch.randn(2, 3), torch.randn(3, 3)
    backend(_graph(), [x, w])
    backend(_graph(), [x, w])
    assert calls == 1 and backend.kwargs["decompositions"] == {}


def test_list_inputs_are_flattened_and_called_boxed() -> None:
    def f(xs: list[torch.Tensor], w: torch.Tensor) -> tuple[torch.Tensor]:
        return (xs[0] @ w + xs[1],)

    gm = torch.fx.symbolic_trace(f)
    xs, w = [torch.randn(2, 3), torch.randn(2, 3)], torch.randn(3, 3)
    compiled = aot_autograd(fw_compiler=nop)(gm, [xs, w])
    (out,) = compiled([list(xs), w])
    torch.testing.assert_close(out, xs[0] @ w + xs[1])


def test_mem_efficient_fusion_kwargs_use_min_cut() -> None:
    kwargs = mem_efficient_fusion_kwargs(use_decomps=False)
    assert kwargs["partition_fn"] is min_cut_rematerialization_partition
    assert "decompositions" not in kwargs
    decomps = mem_efficient_fusion_kwargs(use_decomps=True)["decompositions"]
    assert torch.ops.aten.gelu_backward.default in decomps


def test_fake_tensor_unsupported_gives_the_backend_real_zeros() -> None:
    received: list[Any] = []

    @fake_tensor_unsupported
    def backend(gm: torch.fx.GraphModule, inputs: list[Any]) -> str:
        received.extend(inputs)
        return "compiled"

    mode = FakeTensorMode()
    fake = mode.from_tensor(torch.randn(2, 3))
    assert backend(_graph(), [fake, 3]) == "compiled"
    assert not isinstance(received[0], FakeTensor)
    assert received[0].shape == (2, 3) and received[0].eq(0).all()
    assert received[1] == 3


def test_device_and_dtype_from_inputs() -> None:
    inputs = [3, torch.zeros(2, dtype=torch.float64)]
    assert device_from_inputs(inputs) == torch.device("cpu")
    assert dtype_from_inputs(inputs) == torch.float64
    assert device_from_inputs([1]) == torch.device("cpu")
    assert dtype_from_inputs([]) == torch.float32

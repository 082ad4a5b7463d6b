"""Export with tensor subclasses, checked against torch 2.15: every export entry point
(aot_export_module with or without the joint, pre-dispatch, aot_export_joint_simple)
raises torch's "not currently supported with traceable tensor subclass" for a subclass
parameter or input, and aotkit raises the same text (followed by its remedy)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aotkit
import pytest
import torch
import torch._functorch.aot_autograd as torch_aot
from torch.testing._internal.two_tensor import TwoTensor


def _two(*shape: int) -> TwoTensor:
    return TwoTensor(torch.randn(*shape), torch.randn(*shape))


class _SubclassParam(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(_two(3, 3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return ((x @ self.w).sin().sum(),)


class _PlainParam(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, 3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return ((x @ self.w).sin().sum(),)


def _f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
    return ((x @ w).sin().sum(),)


Export = Callable[[Any], Any]
_JOINT = {"trace_joint": True, "output_loss_index": 0}
CASES: dict[str, Callable[[], tuple[torch.nn.Module | None, Export]]] = {
    "module, subclass parameter": lambda: _module_case(_SubclassParam(), torch.randn(2, 3), {}),
    "module joint, subclass parameter": lambda: _module_case(
        _SubclassParam(), torch.randn(2, 3), _JOINT
    ),
    "module pre-dispatch, subclass parameter": lambda: _module_case(
        _SubclassParam(), torch.randn(2, 3), {"pre_dispatch": True}
    ),
    "module, subclass input": lambda: _module_case(_PlainParam(), _two(2, 3), {}),
    "module joint, subclass input": lambda: _module_case(_PlainParam(), _two(2, 3), _JOINT),
    "joint_simple, subclass input": lambda: (
        None,
        lambda api: api.aot_export_joint_simple(
            _f, [torch.randn(2, 3), _two(3, 3)], trace_joint=False
        ),
    ),
    "joint_simple joint, subclass input": lambda: (
        None,
        lambda api: api.aot_export_joint_simple(
            _f, [torch.randn(2, 3), _two(3, 3).requires_grad_()], trace_joint=True
        ),
    ),
}


def _module_case(
    mod: torch.nn.Module, x: torch.Tensor, kwargs: dict[str, Any]
) -> tuple[torch.nn.Module, Export]:
    kwargs = {"trace_joint": False, **kwargs}
    return mod, lambda api: api.aot_export_module(mod, [x], **kwargs)


@pytest.mark.parametrize("name", list(CASES))
def test_export_with_a_subclass_raises_torchs_error(name: str) -> None:
    _, export = CASES[name]()
    with pytest.raises(RuntimeError) as oracle:
        export(torch_aot)
    assert "not currently supported with traceable tensor subclass" in str(oracle.value)
    mod, export = CASES[name]()
    before = {
        k: (type(v), v.a.clone(), v.b.clone())
        for k, v in (mod.state_dict() if mod else {}).items()
        if isinstance(v, TwoTensor)
    }
    with pytest.raises(RuntimeError) as got:
        export(aotkit)
    assert str(got.value).startswith(str(oracle.value))
    # nothing of the module was touched
    if mod is not None:
        for k, (cls, a, b) in before.items():
            v = mod.state_dict()[k]
            assert type(v) is cls
            torch.testing.assert_close(v.a, a)
            torch.testing.assert_close(v.b, b)

"""Tensors held in plain module attributes (neither parameters nor buffers), read by a
forward: eager vs aotkit's aot_module (which passes them as graph inputs), torch's
aot_module (which fails on them) and torch.compile's aot_eager. See Note [Tensor
attributes of aot_module's modules]."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn
from aotkit_backends import nop
from aotkit_capture import CapturedTensorError
from aotkit_frontends import aot_function, aot_module
from functorch.compile import aot_module as torch_aot_module
from functorch.compile import nop as torch_nop


class RemembersPrevious(nn.Module):
    """State a previous call left: ``self.last = y.detach()``, read by the next call."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.last: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.last is not None:
            y = y + self.last * 2
        self.last = y.detach()
        return y


class InitTensor(nn.Module):
    """A tensor assigned in ``__init__`` as a plain attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.t = torch.arange(3.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.t


class Outer(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.sub = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sub(x).relu()


def _run(mod: nn.Module, xs: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Outputs and the linear weight's gradient after each call."""
    results = []
    for x in xs:
        out = mod(x)
        out.square().sum().backward()
        lin = next(m for m in mod.modules() if isinstance(m, nn.Linear))
        assert lin.weight.grad is not None
        results.append((out.detach().clone(), lin.weight.grad.clone()))
    return results


def _same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for (oa, ga), (ob, gb) in zip(a, b, strict=True):
        torch.testing.assert_close(oa, ob)
        torch.testing.assert_close(ga, gb)


def _entries(compiled: nn.Module) -> int:
    return len(compiled._compiled._aotkit_cache.entries)  # type: ignore[union-attr]


@pytest.mark.parametrize("nested", [False, True])
def test_state_left_by_the_previous_call_is_read_as_eager(nested: bool) -> None:
    torch.manual_seed(0)
    eager: nn.Module = RemembersPrevious()
    if nested:
        eager = Outer(eager)
    mod = copy.deepcopy(eager)
    dyn = copy.deepcopy(eager)
    xs = [torch.randn(2, 3) for _ in range(4)]
    compiled = aot_module(mod, nop)
    ref = _run(eager, xs)
    _same(_run(compiled, xs), ref)
    inner = mod.sub if nested else mod
    inner_eager = eager.sub if nested else eager
    assert type(inner.last) is torch.Tensor
    torch.testing.assert_close(inner.last, inner_eager.last)
    # last=None, then last a tensor: two graphs, the tensor read as an input each call
    assert _entries(compiled) == 2
    # torch.compile's aot_eager agrees with eager
    _same(_run(torch.compile(dyn, backend="aot_eager"), xs), ref)
    # back to None: the graph of the first call is found again
    inner.last = None
    inner_eager.last = None
    x = torch.randn(2, 3)
    torch.testing.assert_close(compiled(x), eager(x))
    assert _entries(compiled) == 2


def test_torch_aot_module_fails_on_both_programs() -> None:
    """What aotkit improves on: torch's aot_module cannot run either program."""
    x = torch.randn(2, 3)
    with pytest.raises(AssertionError, match="fake buffer|FakeTensor"):
        torch_aot_module(InitTensor(), torch_nop)(x)
    prev = torch_aot_module(RemembersPrevious(), torch_nop)
    with pytest.raises(AssertionError, match="fake buffer|FakeTensor"):
        for _ in range(2):
            prev(x)


def test_tensor_assigned_in_init_is_an_input() -> None:
    torch.manual_seed(0)
    eager = InitTensor()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    xs = [torch.randn(2, 3) for _ in range(2)]
    _same(_run(compiled, xs), _run(eager, xs))
    assert _entries(compiled) == 1
    # rebound to another tensor of the same kind: read, no recompilation
    mod.t = torch.full((3,), -1.5)
    eager.t = torch.full((3,), -1.5)
    _same(_run(compiled, xs), _run(eager, xs))
    assert _entries(compiled) == 1
    # updated in place: read
    mod.t.mul_(3)
    eager.t.mul_(3)
    _same(_run(compiled, xs), _run(eager, xs))
    # another shape: recompiled for it
    mod.t = torch.tensor([2.0])
    eager.t = torch.tensor([2.0])
    _same(_run(compiled, xs), _run(eager, xs))
    assert _entries(compiled) == 2


def test_tensor_attribute_gets_its_gradient_and_mutation() -> None:
    class Scales(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.s = torch.ones(3, requires_grad=True)  # a leaf, not a Parameter
            self.count = torch.zeros(())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.count.add_(1)
            return self.lin(x) * self.s

    torch.manual_seed(0)
    eager = Scales()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    xs = [torch.randn(2, 3) for _ in range(3)]
    _same(_run(compiled, xs), _run(eager, xs))
    assert mod.s.grad is not None and eager.s.grad is not None
    torch.testing.assert_close(mod.s.grad, eager.s.grad)
    assert mod.count.item() == eager.count.item() == 3
    assert _entries(compiled) == 1


def test_tensor_attribute_read_only_for_its_shape() -> None:
    """A trace that reads only the shape succeeds on the real tensor; the attribute is
    still made an input, so a new shape recompiles instead of running a baked one."""

    class ShapeOnly(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.mask = torch.ones(2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * self.mask.shape[0]

    torch.manual_seed(0)
    eager = ShapeOnly()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    xs = [torch.randn(2, 3)]
    _same(_run(compiled, xs), _run(eager, xs))
    mod.mask = torch.ones(5)
    eager.mask = torch.ones(5)
    _same(_run(compiled, xs), _run(eager, xs))


def test_tensor_attribute_set_to_none_takes_the_other_branch() -> None:
    class Optional(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.bias_t: torch.Tensor | None = torch.ones(3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.lin(x)
            return y if self.bias_t is None else y + self.bias_t

    torch.manual_seed(0)
    eager = Optional()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    x = torch.randn(2, 3)
    for value in (torch.ones(3), None, torch.full((3,), 4.0), None):
        mod.bias_t = value
        eager.bias_t = value
        torch.testing.assert_close(compiled(x), eager(x))
    assert _entries(compiled) == 2


def test_tensor_in_a_list_attribute_raises_naming_it() -> None:
    class InList(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.cache = [torch.ones(3)]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * self.cache[0]

    with pytest.raises(CapturedTensorError, match=r"self\.cache\[0\].*register_buffer"):
        aot_module(InList(), nop)(torch.randn(2, 3))


@pytest.mark.parametrize("make", [InitTensor, lambda: Outer(InitTensor())])
def test_aot_function_of_a_module_names_the_attribute(make: Callable[[], nn.Module]) -> None:
    """aot_function does not lift a module's tensors; its error names the attribute."""
    mod = make()
    path = r"self\.sub\.t" if isinstance(mod, Outer) else r"self\.t"
    with pytest.raises(CapturedTensorError, match=path + r".*neither a parameter nor a buffer"):
        aot_function(mod, nop)(torch.randn(2, 3))


def test_modules_with_tensor_attributes_are_not_stored_on_disk() -> None:
    """A restored entry runs no trace, so it could not find a tensor attribute read."""
    from aotkit_frontends.module_state._module_attrs import ModuleAttrs

    for mod, stored in ((InitTensor(), False), (nn.Linear(3, 3), True)):
        attrs = ModuleAttrs(mod)
        attrs.begin_compile()
        assert (attrs.disk_identity("program") is not None) == stored

"""aot_module and module attributes outside the key built at aot_module time: added later,
read while missing, lists/dicts mutated in place, enum members, plain tensor attributes.
Each program runs eagerly and through aot_module after every change: the same values, or a
clear error, never the stale graph. See Note [Module attributes added or mutated later]."""

from __future__ import annotations

import copy
import enum
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn
from aotkit_backends import nop
from aotkit_frontends import aot_module
from functorch.compile import nop as torch_nop
from torch._functorch import aot_autograd as torch_aot


class Mode(enum.Enum):
    DOUBLE = 1
    TRIPLE = 2


class Base(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)


class ReadsMissing(Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * getattr(self, "scale", 1.0)


class ClassDefault(Base):
    scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


class ReadsList(Base):
    def __init__(self) -> None:
        super().__init__()
        self.scales = [1.0, 2.0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scales[1]


class ReadsDict(Base):
    def __init__(self) -> None:
        super().__init__()
        self.cfg = {"k": 2.0, "relu": True}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x) * self.cfg["k"]
        return torch.relu(y) if self.cfg["relu"] else torch.tanh(y)


class ReadsEnum(Base):
    def __init__(self) -> None:
        super().__init__()
        self.mode = Mode.DOUBLE

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * (2 if self.mode is Mode.DOUBLE else 3)


class ReadsNested(Base):
    def __init__(self) -> None:
        super().__init__()
        self.inner = ReadsList()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.lin(x))


Change = Callable[[nn.Module], None]


def _set(attr: str, value: Any) -> Change:
    return lambda m: setattr(m, attr, value)


def _item(attr: str, key: Any, value: Any) -> Change:
    return lambda m: getattr(m, attr).__setitem__(key, value)


CASES: list[tuple[str, type[nn.Module], list[Change], int]] = [
    # (name, module, changes in order, compilations expected in all)
    ("added_after_first_compile", ReadsMissing, [_set("scale", 3.0), _set("scale", 4.0)], 3),
    # the instance's 1.0 is the class default's value: the first graph again
    ("class_default_shadowed_later", ClassDefault, [_set("scale", 3.0), _set("scale", 1.0)], 2),
    # the key is the whole list: an item the graph did not read recompiles too
    ("list_item_set", ReadsList, [_item("scales", 1, 5.0), _item("scales", 0, 9.0)], 3),
    ("list_appended_unread", ReadsList, [lambda m: m.scales.append(7.0)], 2),
    ("list_rebound", ReadsList, [_set("scales", [1.0, 7.0]), _set("scales", [1.0, 2.0])], 2),
    ("dict_item_set", ReadsDict, [_item("cfg", "k", 5.0), _item("cfg", "relu", False)], 3),
    ("enum_member", ReadsEnum, [_set("mode", Mode.TRIPLE), _set("mode", Mode.DOUBLE)], 2),
    ("nested_list", ReadsNested, [lambda m: m.inner.scales.__setitem__(1, -1.0)], 2),
]


def _check(eager: nn.Module, mod: nn.Module, compiled: Any) -> None:
    x = torch.randn(4, 3)
    expected = eager(x)
    got = compiled(x)
    torch.testing.assert_close(got, expected)
    expected.sum().backward()
    got.sum().backward()
    for (name, pe), pa in zip(eager.named_parameters(), mod.parameters(), strict=True):
        assert pe.grad is not None and pa.grad is not None, name
        torch.testing.assert_close(pa.grad, pe.grad)
        pe.grad = pa.grad = None


@pytest.mark.parametrize(("cls", "changes", "compiles"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_changes_give_eager_values(cls: type[nn.Module], changes: list[Change], compiles: int) -> None:
    torch.manual_seed(0)
    eager = cls()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    cache = compiled._compiled._aotkit_cache  # type: ignore[union-attr]
    _check(eager, mod, compiled)
    _check(eager, mod, compiled)  # unchanged: no new compilation
    assert len(cache.entries) == 1
    for change in changes:
        change(eager)
        change(mod)
        _check(eager, mod, compiled)
    # a restored value finds its graph again; anything else compiled once per value
    assert len(cache.entries) == compiles


def test_torch_runs_the_stale_graph() -> None:
    """Why the key is needed: torch's aot_module keeps its first graph after the change."""
    torch.manual_seed(0)
    mod = ReadsList()
    compiled = torch_aot.aot_module(mod, torch_nop)
    x = torch.randn(4, 3)
    compiled(x)
    mod.scales[1] = 5.0
    assert not torch.allclose(compiled(x), mod(x))


def test_added_after_aot_module_before_the_first_call() -> None:
    torch.manual_seed(0)
    eager = ReadsMissing()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    for m in (eager, mod):
        m.scale = 2.0  # type: ignore[assignment]
    _check(eager, mod, compiled)
    for m in (eager, mod):
        m.scale = 3.0  # type: ignore[assignment]
    _check(eager, mod, compiled)


class PlainTensorAttr(Base):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.full((3,), 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.w


def test_plain_tensor_attribute_is_read_as_an_input() -> None:
    """Before, a clear CapturedTensorError; now the tensor is a graph input read on every
    call, as eager reads it (See Note [Tensor attributes of aot_module's modules])."""
    torch.manual_seed(0)
    eager = PlainTensorAttr()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    x = torch.randn(4, 3)
    torch.testing.assert_close(compiled(x), eager(x))
    for m in (mod, eager):
        m.w = torch.full((3,), -3.0)
    torch.testing.assert_close(compiled(x), eager(x))


def test_plain_tensor_attribute_of_a_submodule_is_read_as_an_input() -> None:
    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = PlainTensorAttr()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.block(x)

    torch.manual_seed(0)
    eager = Outer()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    x = torch.randn(4, 3)
    torch.testing.assert_close(compiled(x), eager(x))
    for m in (mod, eager):
        m.block.w.mul_(5)
    torch.testing.assert_close(compiled(x), eager(x))


def test_unread_list_changes_never_recompile() -> None:
    class Logs(Base):
        def __init__(self) -> None:
            super().__init__()
            self.history: list[float] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x)

    mod = Logs()
    compiled = aot_module(mod, nop)
    cache = compiled._compiled._aotkit_cache  # type: ignore[union-attr]
    for i in range(3):
        compiled(torch.randn(4, 3))
        mod.history.append(float(i))
    assert len(cache.entries) == 1


# ---- class attributes and the module tree (See Note [Class attributes read by forward]
# and Note [Submodules, parameters and buffers added or removed later]) ------------------


def _fresh_pair(make: Callable[[], nn.Module]) -> tuple[nn.Module, nn.Module, Any]:
    torch.manual_seed(0)
    eager = make()
    mod = copy.deepcopy(eager)
    return eager, mod, aot_module(mod, nop)


def test_class_attribute_changed_after_compile() -> None:
    class Scaled(Base):
        scale = 2.0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * self.scale

    eager, mod, compiled = _fresh_pair(Scaled)
    _check(eager, mod, compiled)
    Scaled.scale = 3.0  # both instances share the class
    _check(eager, mod, compiled)
    mod.scale = eager.scale = 3.0  # type: ignore[misc]  # the same value: no new graph
    _check(eager, mod, compiled)
    Scaled.scale = 5.0  # shadowed by the instances now: no change
    _check(eager, mod, compiled)
    del mod.scale, eager.scale
    _check(eager, mod, compiled)  # 5.0 shows through
    assert len(compiled._compiled._aotkit_cache.entries) == 3  # type: ignore[union-attr]


def test_class_attribute_added_after_a_missing_read() -> None:
    class Late(ReadsMissing):
        pass

    eager, mod, compiled = _fresh_pair(Late)
    _check(eager, mod, compiled)
    Late.scale = 4.0  # type: ignore[attr-defined]
    _check(eager, mod, compiled)


def test_torch_runs_the_stale_graph_for_a_class_attribute() -> None:
    class Scaled(Base):
        scale = 2.0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * self.scale

    mod = Scaled()
    compiled = torch_aot.aot_module(mod, torch_nop)
    x = torch.randn(4, 3)
    compiled(x)
    Scaled.scale = 3.0
    assert not torch.allclose(compiled(x), mod(x))


class Optional(Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        extra = getattr(self, "extra", None)
        return extra(y) if extra is not None else y


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(3, 3), nn.Linear(3, 3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.k = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.k


def _both(eager: nn.Module, mod: nn.Module, change: Callable[[nn.Module], None]) -> None:
    torch.manual_seed(1)
    change(eager)
    torch.manual_seed(1)
    change(mod)


@pytest.mark.parametrize("first_call", [True, False], ids=["after_a_call", "before_any_call"])
def test_submodule_with_parameters_added_later(first_call: bool) -> None:
    eager, mod, compiled = _fresh_pair(Optional)
    if first_call:
        _check(eager, mod, compiled)
    _both(eager, mod, lambda m: setattr(m, "extra", nn.Linear(3, 3)))
    _check(eager, mod, compiled)  # the new Linear's weight and bias get gradients too
    _check(eager, mod, compiled)
    _both(eager, mod, lambda m: delattr(m, "extra"))
    _check(eager, mod, compiled)


def test_submodule_without_parameters_added_then_its_attribute_changed() -> None:
    eager, mod, compiled = _fresh_pair(Optional)
    _check(eager, mod, compiled)
    _both(eager, mod, lambda m: setattr(m, "extra", Scale()))
    _check(eager, mod, compiled)
    _both(eager, mod, lambda m: setattr(m.extra, "k", -3.0))
    _check(eager, mod, compiled)


def test_module_list_appended_and_shortened() -> None:
    eager, mod, compiled = _fresh_pair(Stack)
    _check(eager, mod, compiled)
    _both(eager, mod, lambda m: m.layers.append(nn.Linear(3, 3)))
    _check(eager, mod, compiled)
    _both(eager, mod, lambda m: m.layers.__delitem__(0))
    _check(eager, mod, compiled)
    _both(eager, mod, lambda m: m.layers.__setitem__(0, nn.Linear(3, 3)))
    _check(eager, mod, compiled)


def test_going_back_to_an_earlier_tree_reuses_its_graphs() -> None:
    eager, mod, compiled = _fresh_pair(Optional)
    _check(eager, mod, compiled)
    first = compiled._compiled  # type: ignore[union-attr]
    _both(eager, mod, lambda m: setattr(m, "extra", Scale()))
    _check(eager, mod, compiled)
    assert compiled._compiled is not first  # type: ignore[union-attr]
    _both(eager, mod, lambda m: delattr(m, "extra"))
    _check(eager, mod, compiled)
    assert compiled._compiled is first  # type: ignore[union-attr]
    assert len(first._aotkit_cache.entries) == 1


def test_buffer_registered_later() -> None:
    class Shifted(Base):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.lin(x)
            shift = getattr(self, "shift", None)
            return y + shift if shift is not None else y

    eager, mod, compiled = _fresh_pair(Shifted)
    _check(eager, mod, compiled)
    for m in (eager, mod):
        m.register_buffer("shift", torch.full((3,), 0.5))
    _check(eager, mod, compiled)


def test_unrelated_modules_built_between_calls_do_not_recompile() -> None:
    eager, mod, compiled = _fresh_pair(Stack)
    _check(eager, mod, compiled)
    nn.Linear(3, 3)  # bumps the registration counter: the tree is fingerprinted again
    _check(eager, mod, compiled)
    assert len(compiled._compiled._aotkit_cache.entries) == 1  # type: ignore[union-attr]


def test_torch_runs_the_stale_graph_after_a_submodule_is_added() -> None:
    torch.manual_seed(0)
    mod = Optional()
    compiled = torch_aot.aot_module(mod, torch_nop)
    x = torch.randn(4, 3)
    compiled(x)
    mod.extra = Scale()
    assert not torch.allclose(compiled(x), mod(x))

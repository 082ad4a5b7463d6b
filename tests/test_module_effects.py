"""aot_module replays the plain attribute changes its forward makes, as eager does.

See Note [Plain attributes a forward changes] (aotkit_frontends/_module_effects.py). Each
module runs eagerly and through aot_module on the same inputs, call after call: outputs,
gradients and the module's attributes after each call are compared; torch's aot_module
loses the side effects (pinned).
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
import torch.nn as nn
from aotkit_backends import nop
from aotkit_frontends import aot_module
from aotkit_frontends.module_state._module_effects import SELF_CHANGING_LIMIT
from functorch.compile import nop as torch_nop
from torch._functorch import aot_autograd as torch_aot


class Base(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)


class Appends(Base):
    """Appends to a list it never reads the contents of."""

    def __init__(self) -> None:
        super().__init__()
        self.history: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.history.append(x.shape[0])
        return self.lin(x)


class AppendsAndReads(Appends):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.history.append(x.shape[0])
        return self.lin(x) * len(self.history)


class Counts(Base):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.lin(x)


class WritesOnly(Base):
    """Writes attributes it never reads: one graph, the writes replayed."""

    def __init__(self) -> None:
        super().__init__()
        self.last_batch = -1
        self.stats: dict[str, Any] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last_batch = x.shape[0]
        return self.lin(x)


def _attrs(m: nn.Module) -> dict[str, Any]:
    return {k: copy.deepcopy(v) for k, v in vars(m).items() if not k.startswith("_")}


def _step(eager: nn.Module, mod: nn.Module, compiled: Any, x: torch.Tensor) -> None:
    expected, got = eager(x), compiled(x)
    torch.testing.assert_close(got, expected)
    expected.sum().backward()
    got.sum().backward()
    for pe, pa in zip(eager.parameters(), mod.parameters(), strict=True):
        torch.testing.assert_close(pa.grad, pe.grad)
        pe.grad = pa.grad = None
    assert _attrs(mod) == _attrs(eager)


def _pair(cls: type[nn.Module]) -> tuple[nn.Module, nn.Module, Any]:
    torch.manual_seed(0)
    eager = cls()
    mod = copy.deepcopy(eager)
    return eager, mod, aot_module(mod, nop)


@pytest.mark.parametrize("cls", [Appends, AppendsAndReads, Counts], ids=lambda c: c.__name__)
def test_side_effects_follow_eager(cls: type[nn.Module]) -> None:
    eager, mod, compiled = _pair(cls)
    held = vars(mod).get("history")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (4, 4, 2, 4, 4):
            _step(eager, mod, compiled, torch.randn(n, 3))
    if held is not None:
        assert mod.history is held  # changed in place, as eager's append does


def test_written_only_attributes_are_replayed_without_recompiling() -> None:
    eager, mod, compiled = _pair(WritesOnly)
    for n in (4, 4, 2, 2, 4):
        _step(eager, mod, compiled, torch.randn(n, 3))
    # one graph per batch size: the written attribute is not part of the key
    assert len(compiled._compiled._aotkit_cache.entries) == 2  # type: ignore[union-attr]


def test_a_forward_that_changes_what_it_reads_falls_back_to_eager() -> None:
    eager, mod, compiled = _pair(AppendsAndReads)
    x = torch.randn(4, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(SELF_CHANGING_LIMIT + 3):
            _step(eager, mod, compiled, x)
    assert len(compiled._compiled._aotkit_cache.entries) == SELF_CHANGING_LIMIT  # type: ignore[union-attr]
    messages = [str(w.message) for w in caught if "runs eagerly" in str(w.message)]
    assert len(messages) == 1 and "self.history" in messages[0]


def test_torch_loses_the_side_effect() -> None:
    torch.manual_seed(0)
    mod = AppendsAndReads()
    compiled = torch_aot.aot_module(mod, torch_nop)
    x = torch.randn(4, 3)
    for _ in range(3):
        compiled(x)
    assert mod.history != [4, 4, 4]  # eager's after three calls


# ---- tensors assigned to attributes: old-style weight_norm / spectral_norm (See Note
# [Tensors a forward assigns to module attributes]) -------------------------------------


def _normed(kind: str) -> nn.Module:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # both are deprecated in favour of parametrizations
        norm = getattr(nn.utils, kind)
        return nn.Sequential(norm(nn.Linear(3, 4)), nn.Tanh(), norm(nn.Linear(4, 2)))


def _normed_run(kind: str, compile_it: bool, train: bool, loss_on_weight: bool) -> list[Any]:
    model = _normed(kind).train(train)
    run = aot_module(model, nop) if compile_it else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    seen: list[Any] = []
    for _ in range(3):
        out = run(torch.randn(5, 3, generator=g))
        loss = out.sum()
        if loss_on_weight:  # backpropagate through the weight the call assigned
            loss = loss + (model[0].weight ** 2).sum()
        loss.backward()
        seen += [out.detach(), model[0].weight.detach().clone(), model[2].weight.detach().clone()]
        seen += [p.grad.clone() for p in model.parameters()]
        seen += [b.clone() for b in model.buffers()]
        assert type(model[0].weight) is torch.Tensor  # never a tracing tensor
        opt.step()
        opt.zero_grad()
    return seen


@pytest.mark.parametrize("loss_on_weight", [False, True], ids=["output_loss", "weight_loss"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("kind", ["weight_norm", "spectral_norm"])
def test_old_style_norms_follow_eager(kind: str, train: bool, loss_on_weight: bool) -> None:
    eager = _normed_run(kind, False, train, loss_on_weight)
    ours = _normed_run(kind, True, train, loss_on_weight)
    assert len(ours) == len(eager)
    for a, b in zip(ours, eager, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kind", ["weight_norm", "spectral_norm"])
def test_torch_leaves_a_tracing_tensor_in_the_weight(kind: str) -> None:
    model = _normed(kind)
    torch_aot.aot_module(model, torch_nop)(torch.randn(5, 3))
    assert type(model[0].weight) is not torch.Tensor  # a FunctionalTensor over a fake


def test_entries_that_replay_attribute_changes_are_not_stored_on_disk(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aotkit_cache import cache_counters
    from aotkit_schemas import disk_cache_config

    monkeypatch.setattr(disk_cache_config, "enabled", True)
    monkeypatch.setattr(disk_cache_config, "dir", str(tmp_path))
    stored = cache_counters["store"]
    torch.manual_seed(0)
    aot_module(Base().lin, nop)(torch.randn(4, 3))  # a plain module is stored
    assert cache_counters["store"] == stored + 1
    for make in (WritesOnly, lambda: _normed("weight_norm")):
        aot_module(make(), nop)(torch.randn(4, 3) if make is WritesOnly else torch.randn(5, 3))
    assert cache_counters["store"] == stored + 1

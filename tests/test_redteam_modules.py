"""Red-team programs on modules: state a forward changes, modules reachable twice, modes.

Each test is a program a PyTorch user would write, run eagerly and through aotkit (and,
where torch's AOTAutograd behaves differently, through torch to pin that difference).
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn as nn
from aotkit_backends import nop
from aotkit_frontends import TensorAttributeAssignedError, aot_export_module, aot_module
from functorch.compile import nop as torch_nop
from torch._functorch import aot_autograd as torch_aot
from torch._subclasses.functional_tensor import FunctionalTensor


class SharedTwice(nn.Module):
    """``self.l`` is also ``self.seq[0]`` and ``self.seq[2]``: one slot, three names."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(3, 3)
        self.seq = nn.Sequential(self.l, nn.ReLU(), self.l)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.seq(x) + self.l(x)


def test_submodule_registered_twice_trains_as_eager_and_leaves_the_module_intact() -> None:
    torch.manual_seed(0)
    eager = SharedTwice()
    mod = copy.deepcopy(eager)
    weight = mod.l.weight
    compiled = aot_module(mod, nop)
    for _ in range(3):  # before the fix the second call failed on a leaked FunctionalTensor
        x = torch.randn(2, 3)
        out_e, out_c = eager(x), compiled(x)
        torch.testing.assert_close(out_c, out_e)
        out_e.square().sum().backward()
        out_c.square().sum().backward()
    assert mod.l.weight is weight and mod.seq[0].weight is weight
    assert not isinstance(mod.l.weight, FunctionalTensor)
    torch.testing.assert_close(mod.l.weight.grad, eager.l.weight.grad)
    torch.testing.assert_close(mod.l.bias.grad, eager.l.bias.grad)
    # the module still runs eagerly
    torch.testing.assert_close(mod(torch.ones(1, 3)), eager(torch.ones(1, 3)))


def test_export_of_a_submodule_registered_twice() -> None:
    mod = SharedTwice()
    weight = mod.l.weight

    class TupleOut(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = mod

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
            return (self.inner(x).sum(),)

    wrapper = TupleOut()
    x = torch.randn(2, 3)
    gm, sig = aot_export_module(wrapper, (x,), trace_joint=False)
    assert mod.l.weight is weight  # torch's export leaves a FunctionalTensor here
    params = [p for _, p in wrapper.named_parameters(remove_duplicate=False)]
    torch.testing.assert_close(gm(*params, x)[0], wrapper(x)[0])
    # the graph reads the placeholder torch's own export reads (the last name's)
    t_gm, _ = torch_aot.aot_export_module(copy.deepcopy(wrapper), (x,), trace_joint=False)
    used = [n.name for n in gm.graph.find_nodes(op="placeholder") if n.users]
    t_used = [n.name for n in t_gm.graph.find_nodes(op="placeholder") if n.users]
    assert len(used) == len(t_used) == 3
    assert [n.name for n in gm.graph.find_nodes(op="placeholder")].index(used[0]) == [
        n.name for n in t_gm.graph.find_nodes(op="placeholder")
    ].index(t_used[0])
    assert sig.parameters[:2] == ["inner.l.weight", "inner.l.bias"]
    with pytest.raises(RuntimeError, match=re.escape("inner.l.weight = inner.seq.0.weight")):
        aot_export_module(wrapper, (x,), trace_joint=True, output_loss_index=0)
    assert mod.l.weight is weight


class GrowingCache(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(0, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache = torch.cat([self.cache, x])
        return self.cache.sum(0)


def test_buffer_rebound_in_forward_raises_and_torch_loses_it() -> None:
    """torch's aot_module silently keeps the old buffer; aotkit names the fix."""
    x = torch.randn(2, 3)
    torch_mod = GrowingCache()
    torch_compiled = torch_aot.aot_module(torch_mod, torch_nop)
    torch_compiled(x)
    assert torch_mod.cache.shape == (0, 3)  # eager's is (2, 3)

    mod = GrowingCache()
    cache = mod.cache
    compiled = aot_module(mod, nop)
    with pytest.raises(RuntimeError, match=r"registered buffer `cache`.*copy_"):
        compiled(x)
    assert mod.cache is cache


class KVCache(nn.Module):
    """The in-place way to keep the same state: captured as a buffer mutation."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(2, 8, 4))
        self.register_buffer("pos", torch.zeros((), dtype=torch.long))
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.lin(x)
        n = x.shape[1]
        self.k[:, 0:n] = k.detach()
        self.k.index_copy_(1, torch.tensor([7]), k[:, :1].detach())
        self.pos += n
        return (self.k[:, :n] * k).sum(-1), self.pos.clone()


def test_kv_cache_written_in_place_matches_eager_over_calls() -> None:
    torch.manual_seed(0)
    eager = KVCache()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    for step in range(3):
        x = torch.randn(2, 3, 4)
        grad_mode = torch.no_grad() if step == 1 else torch.enable_grad()
        with grad_mode:
            out_e, pos_e = eager(x)
            out_c, pos_c = compiled(x)
        torch.testing.assert_close(out_c, out_e)
        assert torch.equal(pos_c, pos_e)
        torch.testing.assert_close(mod.k, eager.k)
        if out_e.requires_grad:
            out_e.sum().backward()
            out_c.sum().backward()
            torch.testing.assert_close(mod.lin.weight.grad, eager.lin.weight.grad)


class RemembersLast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))
        self.last: torch.Tensor | None = None
        self.history: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.w
        self.last = y.detach()
        return y


def test_tensor_assigned_to_a_plain_attribute_follows_eager() -> None:
    """Before, ``mod.last`` held a FunctionalTensor over a fake after every call (then
    aot_module raised); now it holds each call's value, as in eager (See Note [Tensors a
    forward assigns to module attributes])."""
    torch.manual_seed(0)
    eager = RemembersLast()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x), eager(x))
        assert type(mod.last) is torch.Tensor and not mod.last.requires_grad
        torch.testing.assert_close(mod.last, eager.last)
    assert len(compiled._compiled._aotkit_cache.entries) == 1  # type: ignore[union-attr]


class AppendsTensors(RemembersLast):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.w
        self.history.append(y.detach())
        return y


def test_tensor_appended_to_a_list_attribute_raises_instead_of_leaking() -> None:
    mod = AppendsTensors()
    compiled = aot_module(mod, nop)
    with pytest.raises(TensorAttributeAssignedError, match=r"self\.history\[0\].*register_buffer"):
        compiled(torch.randn(3))
    assert mod.history == []


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_recurrent_modules_own_weight_caches_are_not_reported(kind: str) -> None:
    torch.manual_seed(0)
    layer = nn.LSTM(4, 5) if kind == "lstm" else nn.GRU(4, 5)
    compiled = aot_module(copy.deepcopy(layer), nop)
    x = torch.randn(6, 2, 4)
    torch.testing.assert_close(compiled(x)[0], layer(x)[0])


def _block() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5), nn.BatchNorm1d(3))


def test_eval_after_train_does_not_reuse_the_train_graph() -> None:
    """torch's aot_module keeps dropout on and running stats updating after eval()."""
    torch.manual_seed(0)
    eager = _block()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    torch_mod = copy.deepcopy(eager)
    torch_compiled = torch_aot.aot_module(torch_mod, torch_nop)
    for mode in ("train", "eval", "train", "sub_eval"):
        for m in (eager, mod, torch_mod):
            m.train(mode == "train")
            if mode == "sub_eval":
                m.train()
                m[2].eval()
        x = torch.randn(4, 3)
        torch.manual_seed(1)
        out_e = eager(x)
        torch.manual_seed(1)
        out_c = compiled(x)
        torch.manual_seed(1)
        out_t = torch_compiled(x)
        torch.testing.assert_close(out_c, out_e)
        torch.testing.assert_close(mod[2].running_mean, eager[2].running_mean)
        torch.testing.assert_close(mod[2].running_var, eager[2].running_var)
        if mode == "eval":
            assert not torch.allclose(out_t, out_e)  # torch's stale train graph
    assert len(compiled._compiled._aotkit_cache.entries) == 3

"""aot_module_simplified's ``pre_grad_passes`` with torch's timing: after the on-disk cache
lookup, on a miss only, unless Inductor's config asks for "early". See Note [Pre-grad
passes after the cache lookup]."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import torch
import torch.fx
import torch.nn as nn
from aotkit_backends import nop
from aotkit_cache import cache_counters
from aotkit_frontends import aot_module_simplified
from aotkit_schemas import disk_cache_config, mark_cache_key
from torch._functorch.aot_autograd import aot_module_simplified as torch_simplified


class TanhMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 6)
        self.b = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.b(self.a(x).tanh()),)


class SwapTanh:
    """A pre-grad pass: ``tanh`` becomes ``relu``; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, gm: torch.fx.GraphModule, args: Any) -> torch.fx.GraphModule:
        self.calls += 1
        for node in gm.graph.nodes:
            if node.op == "call_method" and node.target == "tanh":
                node.target = "relu"
        gm.recompile()
        return gm


def _keyed(key: str) -> SwapTanh:
    p = SwapTanh()
    mark_cache_key(p, key)
    return p


def _expected(mod: nn.Module, x: torch.Tensor) -> torch.Tensor:
    m = cast(TanhMLP, mod)
    out: torch.Tensor = m.b(m.a(x).relu())
    return out


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    saved = disk_cache_config.dir, disk_cache_config.enabled
    disk_cache_config.dir, disk_cache_config.enabled = str(tmp_path), True
    try:
        yield tmp_path
    finally:
        disk_cache_config.dir, disk_cache_config.enabled = saved


def _compile(passes: Any, x: torch.Tensor) -> tuple[torch.fx.GraphModule, Any]:
    torch.manual_seed(0)
    gm = torch.fx.symbolic_trace(TanhMLP())  # the same program each time
    cache_counters.clear()
    return gm, aot_module_simplified(gm, [x], nop, pre_grad_passes=passes)


def test_runs_once_per_compile_like_torch() -> None:
    # without a cache (torch: a compiler that is not serializable), each compile runs the
    # passes once, and the compiled graph is the rewritten one
    x = torch.randn(3, 4)
    ours, theirs = SwapTanh(), SwapTanh()
    torch.manual_seed(0)
    gm = torch.fx.symbolic_trace(TanhMLP())
    want = _expected(gm, x)
    out = aot_module_simplified(gm, [x], nop, pre_grad_passes=ours)(x)
    torch.manual_seed(0)
    gm2 = torch.fx.symbolic_trace(TanhMLP())
    ref = torch_simplified(gm2, [x], nop, pre_grad_passes=theirs)(x)
    assert ours.calls == theirs.calls == 1
    torch.testing.assert_close(out[0], want)
    torch.testing.assert_close(out[0], ref[0])


@pytest.mark.usefixtures("disk")
def test_a_disk_hit_runs_no_passes() -> None:
    x = torch.randn(3, 4)
    passes = _keyed("swap-tanh/1")
    gm, forward = _compile(passes, x)
    assert cache_counters["trace"] == 1 and cache_counters["store"] == 1 and passes.calls == 1
    torch.testing.assert_close(forward(x)[0], _expected(gm, x))
    gm, forward = _compile(passes, x)
    assert cache_counters["hit"] == 1 and "trace" not in cache_counters
    assert passes.calls == 1  # not again
    assert "tanh" in gm.code  # the module given was left as it was
    torch.testing.assert_close(forward(x)[0], _expected(gm, x))


@pytest.mark.usefixtures("disk")
def test_the_passes_key_is_part_of_the_entry_key() -> None:
    x = torch.randn(3, 4)
    _compile(_keyed("swap-tanh/1"), x)
    other = _keyed("swap-tanh/2")
    _compile(other, x)
    assert cache_counters["trace"] == 1 and "hit" not in cache_counters and other.calls == 1
    # and no passes at all is yet another entry: the tanh graph
    gm, forward = _compile(None, x)
    assert cache_counters["trace"] == 1 and "hit" not in cache_counters
    torch.testing.assert_close(forward(x)[0], gm(x)[0])


def test_passes_without_a_key_leave_the_disk_alone(disk: Path) -> None:
    x = torch.randn(3, 4)
    passes = SwapTanh()
    for _ in range(2):
        gm, forward = _compile(passes, x)
        assert cache_counters["trace"] == 1 and "store" not in cache_counters
        torch.testing.assert_close(forward(x)[0], _expected(gm, x))
    assert passes.calls == 2
    assert not list(disk.rglob("*.json"))


@pytest.mark.usefixtures("disk")
def test_early_timing_runs_them_before_the_lookup() -> None:
    # config.pre_grad_pass_timing = "early" (torch's rule, whoever the caller): every
    # compile runs them first, and the entry is keyed on the rewritten program
    from torch._inductor import config

    x = torch.randn(3, 4)
    passes = SwapTanh()  # no key needed: the program is fingerprinted after them
    with config.patch(pre_grad_pass_timing="early"):
        _compile(passes, x)
        assert cache_counters["store"] == 1
        gm, forward = _compile(passes, x)
        assert cache_counters["hit"] == 1 and "trace" not in cache_counters
    assert passes.calls == 2
    assert "relu" in gm.code
    torch.testing.assert_close(forward(x)[0], _expected(gm, x))


def test_passes_that_replace_a_parameter_raise() -> None:
    def new_weight(gm: torch.fx.GraphModule, args: Any) -> torch.fx.GraphModule:
        a = cast(nn.Linear, gm.a)
        a.weight = nn.Parameter(a.weight.detach() * 2)
        return gm

    gm = torch.fx.symbolic_trace(TanhMLP())
    x = torch.randn(3, 4)
    with pytest.raises(RuntimeError, match=r"changed the module's parameters .*replaced: a\.weight"):
        aot_module_simplified(gm, [x], nop, pre_grad_passes=new_weight)

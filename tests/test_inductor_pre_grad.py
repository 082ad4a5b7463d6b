"""aotkit_inductor runs Inductor's pre-grad passes on dynamo's graph as torch's ``inductor``
backend does: a user's ``config.pre_grad_custom_pass`` is called on the same graph, as often,
and its rewrite shows in the results; Inductor's own pre-grad rewrites apply; a warm compile
served from the cache (aotkit's on-disk cache, torch's AOTAutogradCache) runs none of them.
See Note [Inductor pre-grad passes] in aotkit_backends and Note [Pre-grad passes after the
cache lookup] in aotkit_frontends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo
import torch.nn as nn
from _small_models import fresh_dynamo  # noqa: F401  (autouse fixture)
from aotkit_backends import inductor_available, inductor_unavailable_reason
from aotkit_cache import cache_counters
from aotkit_schemas import disk_cache_config
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass

pytestmark = pytest.mark.skipif(not inductor_available(), reason=str(inductor_unavailable_reason()))

BACKENDS = ("inductor", "aotkit_inductor")


class TanhToSigmoid(CustomGraphPass):
    """Rewrites ``torch.tanh`` calls of dynamo's graph into ``torch.sigmoid``; records the
    graph of every call as it was given."""

    def __init__(self, version: str = "1") -> None:
        self.version = version
        self.seen: list[str] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.seen.append(str(graph))
        for node in graph.nodes:
            if node.op == "call_function" and node.target is torch.tanh:
                node.target = torch.sigmoid

    def uuid(self) -> Any:
        return f"tanh-to-sigmoid-{self.version}"


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def _rewritten_eager(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return m[2](torch.sigmoid(m[0](x)))


@pytest.fixture
def no_torch_aot_cache() -> Iterator[None]:
    # torch's AOTAutogradCache would skip the passes on a hit left by an earlier run
    with torch._functorch.config.patch(enable_autograd_cache=False):
        yield


def _train_and_infer(backend: str, m: nn.Module, x: torch.Tensor) -> dict[str, Any]:
    torch._dynamo.reset()
    compiled = torch.compile(m, backend=backend)
    xs = x.clone().requires_grad_(True)
    out = compiled(xs)
    out.sum().backward()
    grads = [p.grad.clone() for p in m.parameters() if p.grad is not None] + [xs.grad.clone()]
    m.zero_grad()
    with torch.no_grad():
        inference = compiled(x)
    return {"out": out.detach(), "grads": grads, "inference": inference}


@pytest.mark.usefixtures("no_torch_aot_cache")
def test_custom_pass_called_as_torch_inductor_calls_it() -> None:
    m, x = _model(), torch.randn(5, 4)
    results, seen = {}, {}
    for backend in BACKENDS:
        custom = TanhToSigmoid()
        with inductor_config.patch(pre_grad_custom_pass=custom):
            results[backend] = _train_and_infer(backend, m, x)
        seen[backend] = custom.seen
    # the same graphs (dynamo's, before any of aotkit's tracing), as often: the training
    # graph, then the no_grad recompile
    assert len(seen["inductor"]) == 2
    assert seen["aotkit_inductor"] == seen["inductor"]
    assert "torch.tanh" in seen["inductor"][0]
    # the rewrite shows: both compute sigmoid where the module says tanh
    xs = x.clone().requires_grad_(True)
    expected = _rewritten_eager(m, xs)
    expected.sum().backward()
    want_grads = [p.grad.clone() for p in m.parameters()] + [xs.grad.clone()]
    m.zero_grad()
    with torch.no_grad():
        want_inference = _rewritten_eager(m, x)
        assert not torch.allclose(want_inference, m(x))
    for backend, r in results.items():
        torch.testing.assert_close(r["out"], expected.detach(), msg=backend)
        torch.testing.assert_close(r["inference"], want_inference, msg=backend)
        for got, want in zip(r["grads"], want_grads, strict=True):
            torch.testing.assert_close(got, want, msg=backend)
    assert torch.equal(results["aotkit_inductor"]["out"], results["inductor"]["out"])


class ConvBn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x)).relu()


@pytest.mark.usefixtures("no_torch_aot_cache")
def test_eval_mode_conv_bn_rewrite_matches_torch() -> None:
    # Inductor's efficient conv-bn eval rewrite, a pre-grad pattern: an eval-mode batch
    # norm after a convolution, trained through (the conv's weight still gets gradients)
    torch.manual_seed(0)
    m = ConvBn()
    with torch.no_grad():  # running statistics that are not the defaults
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
        m.bn.weight.uniform_(0.5, 2)
    m.eval()
    x = torch.randn(2, 3, 6, 6)
    results, rewrites = {}, {}
    for backend in BACKENDS:
        counters.clear()
        with inductor_config.patch(efficient_conv_bn_eval_fx_passes=True):
            results[backend] = _train_and_infer(backend, m, x)
        rewrites[backend] = counters["inductor"]["efficient_conv_bn_eval"]
    assert rewrites["inductor"] > 0
    assert rewrites["aotkit_inductor"] == rewrites["inductor"]
    xs = x.clone().requires_grad_(True)
    expected = m(xs)
    expected.sum().backward()
    want_grads = [p.grad.clone() for p in m.parameters() if p.grad is not None] + [xs.grad.clone()]
    m.zero_grad()
    for backend, r in results.items():
        torch.testing.assert_close(r["out"], expected.detach(), msg=backend)
        assert len(r["grads"]) == len(want_grads), backend
        for got, want in zip(r["grads"], want_grads, strict=True):
            torch.testing.assert_close(got, want, msg=backend)
    for a, b in zip(results["aotkit_inductor"]["grads"], results["inductor"]["grads"], strict=True):
        torch.testing.assert_close(a, b)


def test_warm_compiles_run_no_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a second compile of the same graph after dynamo forgot it: served by aotkit's on-disk
    # cache and by torch's AOTAutogradCache, neither runs the pre-grad passes again, and
    # both give the rewritten graph's values
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    m, x = _model(), torch.randn(5, 4)
    calls: dict[str, list[int]] = {}
    saved = disk_cache_config.dir, disk_cache_config.enabled
    disk_cache_config.dir, disk_cache_config.enabled = str(tmp_path / "aotkit"), True
    try:
        with torch._functorch.config.patch(enable_autograd_cache=True):
            for backend in BACKENDS:
                custom = TanhToSigmoid()
                calls[backend] = []
                with inductor_config.patch(pre_grad_custom_pass=custom):
                    for _ in range(2):
                        cache_counters.clear()
                        counters.clear()
                        r = _train_and_infer(backend, m, x)
                        calls[backend].append(len(custom.seen))
                        custom.seen.clear()
                        with torch.no_grad():
                            torch.testing.assert_close(r["inference"], _rewritten_eager(m, x))
                        torch.testing.assert_close(r["out"], _rewritten_eager(m, x))
                if backend == "inductor":
                    assert counters["aot_autograd"]["autograd_cache_hit"] == 2
                else:
                    assert cache_counters["hit"] == 2 and "trace" not in cache_counters
    finally:
        disk_cache_config.dir, disk_cache_config.enabled = saved
    assert calls["inductor"] == [2, 0]
    assert calls["aotkit_inductor"] == calls["inductor"]


def test_a_changed_custom_pass_misses(tmp_path: Path) -> None:
    # the pass's uuid is part of aotkit's key: another version traces again and runs it
    m, x = _model(), torch.randn(5, 4)
    saved = disk_cache_config.dir, disk_cache_config.enabled
    disk_cache_config.dir, disk_cache_config.enabled = str(tmp_path), True
    try:
        for version, traced in (("1", 2), ("2", 2), ("1", 0)):
            custom = TanhToSigmoid(version)
            cache_counters.clear()
            with inductor_config.patch(pre_grad_custom_pass=custom):
                r = _train_and_infer("aotkit_inductor", m, x)
            assert cache_counters.get("trace", 0) == traced, version
            assert len(custom.seen) == traced, version
            torch.testing.assert_close(r["out"], _rewritten_eager(m, x))
    finally:
        disk_cache_config.dir, disk_cache_config.enabled = saved


def test_a_custom_pass_without_uuid_runs_early_and_is_not_cached(tmp_path: Path) -> None:
    # torch runs a custom pass without uuid() "early" (before its cache lookup, warning);
    # aotkit does too, and keeps such compilations off the disk
    seen: list[int] = []

    def plain_pass(graph: torch.fx.Graph) -> None:
        seen.append(1)
        for node in graph.nodes:
            if node.op == "call_function" and node.target is torch.tanh:
                node.target = torch.sigmoid

    m, x = _model(), torch.randn(5, 4)
    saved = disk_cache_config.dir, disk_cache_config.enabled
    disk_cache_config.dir, disk_cache_config.enabled = str(tmp_path), True
    try:
        for _ in range(2):
            cache_counters.clear()
            with inductor_config.patch(pre_grad_custom_pass=plain_pass):
                r = _train_and_infer("aotkit_inductor", m, x)
            torch.testing.assert_close(r["out"], _rewritten_eager(m, x))
            assert cache_counters["trace"] == 2 and "store" not in cache_counters
    finally:
        disk_cache_config.dir, disk_cache_config.enabled = saved
    assert len(seen) == 4
    assert not list(tmp_path.rglob("*.json"))

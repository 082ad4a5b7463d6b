"""Full garbage collections are deferred while aotkit compiles, as torch defers them during
dynamo's compile and its lazy backward compile (Note [Full collections deferred during a
compile]), and the collector's thresholds are restored afterwards."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from aotkit_frontends import aot_function


@pytest.fixture(autouse=True)
def default_thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)  # CPython's defaults
    try:
        yield
    finally:
        gc.set_threshold(*saved)


class Recording:
    """A nop compiler that records the gen-2 threshold it was called under."""

    def __init__(self) -> None:
        self.thresholds: list[int] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        self.thresholds.append(gc.get_threshold()[2])
        return gm


def test_forward_and_lazy_backward_compiles_defer_full_collections() -> None:
    fw, bw = Recording(), Recording()
    f = aot_function(lambda x: (x.sin() * 2).sum(), fw, bw)
    x = torch.randn(4, requires_grad=True)
    out = f(x)
    assert fw.thresholds == [1000] and bw.thresholds == []  # the backward compiles lazily
    assert gc.get_threshold() == (700, 10, 10)
    out.backward()
    assert bw.thresholds == [1000]
    assert gc.get_threshold() == (700, 10, 10)
    torch.testing.assert_close(x.grad, 2 * x.detach().cos())


def test_a_raised_threshold_is_not_lowered() -> None:
    gc.set_threshold(700, 10, 5000)
    fw = Recording()
    aot_function(lambda x: x * 2, fw)(torch.randn(3))
    assert fw.thresholds == [5000]
    assert gc.get_threshold() == (700, 10, 5000)


def test_thresholds_are_restored_when_the_compile_fails() -> None:
    def failing(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        raise RuntimeError("compiler failed")

    with pytest.raises(RuntimeError, match="compiler failed"):
        aot_function(lambda x: x * 2, failing)(torch.randn(3))
    assert gc.get_threshold() == (700, 10, 10)


def test_torch_compile_backward_compile_defers_full_collections() -> None:
    from aotkit_frontends import aot_autograd

    fw, bw = Recording(), Recording()
    f = torch.compile(
        lambda x: (x.cos() * 3).sum(), backend=aot_autograd(fw_compiler=fw, bw_compiler=bw)
    )
    x = torch.randn(5, requires_grad=True)
    f(x).backward()
    assert fw.thresholds and min(fw.thresholds) >= 1000
    assert bw.thresholds and min(bw.thresholds) >= 1000
    assert gc.get_threshold() == (700, 10, 10)


_WITHOUT_DYNAMO = """
import gc, json, sys, torch
from aotkit_frontends import aot_function
gc.set_threshold(700, 10, 10)
seen = []
def fw(gm, example_inputs):
    seen.append(gc.get_threshold()[2])
    return gm
out = aot_function(lambda x: (x * x).sum(), fw, fw)(torch.randn(3, requires_grad=True))
out.backward()
print(json.dumps([seen, list(gc.get_threshold())]))
"""


@pytest.mark.parametrize(("env", "expected"), [(None, 1000), ("0", 10), ("4000", 4000)])
def test_torchs_environment_variable_sets_the_threshold(env: str | None, expected: int) -> None:
    """In a fresh interpreter the first compile starts before dynamo is loaded (aotkit's
    own deferral); the backward compile finds dynamo loaded (dynamo's)."""
    environ = {
        k: v for k, v in os.environ.items() if k != "TORCH_DYNAMO_GC_GEN2_THRESHOLD_DURING_COMPILE"
    }
    if env is not None:
        environ["TORCH_DYNAMO_GC_GEN2_THRESHOLD_DURING_COMPILE"] = env
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_DYNAMO],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
        env=environ,
    )
    seen, after = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen == [expected, expected]
    assert after == [700, 10, 10]


def test_own_deferral_is_reentrant(monkeypatch: pytest.MonkeyPatch) -> None:
    from aotkit_capture.compile._gc import _deferred_without_dynamo

    monkeypatch.delenv("TORCH_DYNAMO_GC_GEN2_THRESHOLD_DURING_COMPILE", raising=False)
    with _deferred_without_dynamo():
        assert gc.get_threshold() == (700, 10, 1000)
        gc.set_threshold(700, 10, 1000)
        with _deferred_without_dynamo():
            assert gc.get_threshold() == (700, 10, 1000)
        assert gc.get_threshold() == (700, 10, 1000)  # the outer one restores
    assert gc.get_threshold() == (700, 10, 10)
    with pytest.raises(ValueError), _deferred_without_dynamo():
        raise ValueError
    assert gc.get_threshold() == (700, 10, 10)


# See Note [Collections paused while a cache entry is restored]


def test_collection_pause_nests_resumes_once_and_keeps_a_users_setting() -> None:
    from aotkit_capture.compile._gc import CollectionPause

    assert gc.isenabled()
    with CollectionPause() as outer:
        assert not gc.isenabled()
        with CollectionPause() as inner:
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause is still active
        outer.resume()
        assert gc.isenabled()
        outer.resume()  # idempotent: does not end a pause it does not own
        assert gc.isenabled()
        with CollectionPause():
            inner.resume()  # already ended
            assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), CollectionPause():
        raise ValueError
    assert gc.isenabled()
    gc.disable()
    try:
        with CollectionPause():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the user's collector stays off
    finally:
        gc.enable()


def _gc_program(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ w).sum(1)


class _GcRecording:
    """A compiler (by its cache key, the same across instances) that records whether the
    collector was on when it ran."""

    def __init__(self) -> None:
        self.enabled: list[bool] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        self.enabled.append(gc.isenabled())
        from aotkit_backends import nop

        return nop(gm, example_inputs)


def test_a_warm_hit_reads_the_entry_with_collections_paused_and_compiles_with_them_on(
    disk_cache_on: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import aotkit_cache._compile_cache as dcc
    from aotkit_cache import cache_counters
    from aotkit_schemas import mark_cache_key

    real_read = dcc.read_entry
    reads: list[bool] = []

    def read_entry(*args: Any, **kwargs: Any) -> Any:
        reads.append(gc.isenabled())
        return real_read(*args, **kwargs)

    monkeypatch.setattr(dcc, "read_entry", read_entry)
    torch.manual_seed(0)
    x, w = torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)
    runs = []
    for _ in range(2):
        compiler = _GcRecording()
        mark_cache_key(compiler, "test.gc_pause/1")
        cache_counters.clear()
        g = aot_function(_gc_program, compiler)
        out = g(x, w)
        out.sum().backward()
        runs.append((compiler.enabled, dict(cache_counters), w.grad.clone()))
        w.grad = None
    (cold_on, cold_counters, cold_grad), (warm_on, warm_counters, warm_grad) = runs
    assert cold_counters["store"] == 1 and warm_counters == {"hit": 1}
    assert reads == [False]  # the warm hit read the entry with the collector off
    assert cold_on == [True, True] and warm_on == [True, True]  # every compiler: on
    assert gc.isenabled()
    torch.testing.assert_close(warm_grad, cold_grad, rtol=0, atol=0)


def test_a_rejected_entry_traces_with_collections_on(
    disk_cache_on: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import aotkit_cache._compile_cache as dcc
    from aotkit_cache import cache_counters
    from aotkit_schemas import CacheFormatError, mark_cache_key

    x, w = torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)
    compiler = _GcRecording()
    mark_cache_key(compiler, "test.gc_pause/2")
    aot_function(_gc_program, compiler)(x, w)

    def damaged(*args: Any, **kwargs: Any) -> Any:
        raise CacheFormatError("damaged")

    monkeypatch.setattr(dcc, "read_entry", damaged)
    compiler = _GcRecording()
    mark_cache_key(compiler, "test.gc_pause/2")
    cache_counters.clear()
    out = aot_function(_gc_program, compiler)(x, w)
    assert cache_counters["trace"] == 1 and "hit" not in cache_counters
    assert compiler.enabled == [True] and gc.isenabled()
    torch.testing.assert_close(out, _gc_program(x, w))

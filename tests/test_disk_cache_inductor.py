"""aotkit_inductor's warm start: Inductor's artifacts loaded by the keys aotkit's disk cache
stored, without tracing and without recomputing Inductor's cache key; every way the stored
key can stop applying falls back to compiling, with the same results. See Note
[Compiled-artifact keys] in aotkit_schemas and Note [Inductor artifact keys] in
aotkit_backends."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from aotkit_backends import inductor_available, inductor_unavailable_reason
from aotkit_cache._files import entry_bytes, split_entry

pytestmark = pytest.mark.skipif(
    not inductor_available(), reason=str(inductor_unavailable_reason())
)

PROGRAM = str(Path(__file__).with_name("_disk_cache_inductor_program.py"))
# a thread count other than the default one (torch's default is the number of cores)
_OTHER_THREADS = 1 if torch.get_num_threads() != 1 else 2


# Inductor's compiled kernels, shared by every process of this file (Inductor keys them by
# their source and locks its writes); each run's FX graph cache, which the tests copy, empty
# and rewrite, stays its own under root/inductor/fxgraph. See the program's docstring.
_KERNELS = tempfile.mkdtemp(prefix="aotkit-test-inductor-kernels-")
atexit.register(shutil.rmtree, _KERNELS, ignore_errors=True)


def _start(
    root: Path, config: dict[str, Any] | None = None, **more: Any
) -> subprocess.Popen[str]:
    env = {**os.environ, "AOTKIT_CACHE": "1", "TORCHINDUCTOR_CACHE_DIR": _KERNELS,
           "AOTKIT_TEST_FXGRAPH_DIR": str(root / "inductor" / "fxgraph"),
           "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
    spec = {"aotkit": str(root / "aotkit"), "config": config or {}, **more}
    return subprocess.Popen([sys.executable, PROGRAM, json.dumps(spec)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait(proc: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=900)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _entries(root: Path) -> list[Path]:
    return sorted((root / "aotkit").rglob("*.json"))


def _payload(p: Path) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(split_entry(p.read_bytes())[1])
    return payload


def _rewrite_keys(p: Path, change: Any) -> None:
    doc, body = split_entry(p.read_bytes())
    payload = json.loads(body)
    payload["artifact_keys"] = {r: change(k) for r, k in payload["artifact_keys"].items()}
    p.write_bytes(entry_bytes(doc, json.dumps(payload, sort_keys=True, separators=(",", ":"))))


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    for field in ("out", "grads", "inference"):
        assert a[field] == b[field], field


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("cold")
    return root, _wait(_start(root))


def _copy(cold: tuple[Path, dict[str, Any]], dest: Path) -> Path:
    shutil.copytree(cold[0], dest)
    return dest


def test_cold_stores_inductor_keys(cold: tuple[Path, dict[str, Any]]) -> None:
    root, result = cold
    assert result["counters"]["trace"] == 2 and result["counters"]["store"] == 2
    # the backward compiled after its entry was written: its key was added then
    assert result["counters"]["artifact_update"] == 1
    # Inductor's pre-grad passes ran on both of dynamo's graphs (See Note [Inductor
    # pre-grad passes] in aotkit_backends)
    assert result["pre_grad_runs"] == 2
    roles = sorted(sorted(_payload(p)["artifact_keys"]) for p in _entries(root))
    assert roles == [["bw", "fw"], ["inference"]]
    for p in _entries(root):
        for key in _payload(p)["artifact_keys"].values():
            assert key.startswith("fxgraph/")


def test_warm_start_loads_by_stored_key(
    cold: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root = _copy(cold, tmp_path / "warm")
    warm = _wait(_start(root))
    _same(warm, cold[1])
    assert "trace" not in warm["counters"] and warm["counters"]["hit"] == 2
    assert warm["fx_graph_hashes"] == 0  # Inductor's key was not recomputed
    assert warm["fxgraph_cache_hit"] == 3  # forward, backward, inference
    assert "artifact_update" not in warm["counters"] and "store" not in warm["counters"]
    assert warm["pre_grad_runs"] == 0  # they run after the lookup, on a miss only


def test_stored_keys_that_do_not_apply_fall_back(
    cold: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    # Inductor's artifacts gone; a key Inductor's cache does not hold; Inductor's settings
    # changed since the cold run; a malformed key (the entry is then refused). The settings
    # changed are the thread count: part of Inductor's artifact key, not of aotkit's entry
    # key. (A change of Inductor's config now changes aotkit's key too, See Note [Inductor
    # settings in the on-disk cache key]; this test used ``comment_origin`` before.)
    gone = _copy(cold, tmp_path / "gone")
    shutil.rmtree(gone / "inductor" / "fxgraph")
    missing = _copy(cold, tmp_path / "missing")
    for p in _entries(missing):
        _rewrite_keys(p, lambda k: k[: -8] + "aaaaaaaa")
    malformed = _copy(cold, tmp_path / "malformed")
    for p in _entries(malformed):
        _rewrite_keys(p, lambda k: k + "/../../x y")
    settings = _copy(cold, tmp_path / "settings")
    procs = {
        "gone": _start(gone),
        "missing": _start(missing),
        "malformed": _start(malformed),
        "settings": _start(settings, threads=_OTHER_THREADS),
    }
    results = {name: _wait(proc) for name, proc in procs.items()}
    for name, r in results.items():
        _same(r, cold[1])
        assert r["fx_graph_hashes"] == 3, name  # each graph went through compile_fx_inner
    for name in ("gone", "missing", "settings"):
        assert "trace" not in results[name]["counters"], name  # aotkit's entries still served
    assert results["malformed"]["counters"]["trace"] == 2
    assert results["malformed"]["counters"]["reject"] == 2
    # Inductor compiled again under new settings: the entries now carry the new keys
    assert results["settings"]["counters"]["artifact_update"] == 3
    again = _wait(_start(settings, threads=_OTHER_THREADS))
    _same(again, cold[1])
    assert again["fx_graph_hashes"] == 0 and "trace" not in again["counters"]


@pytest.mark.parametrize(
    ("what", "change"),
    [
        # Inductor's joint-graph passes (run by aotkit_inductor's partition step) read it
        ("inductor", {"config": {"pattern_matcher": False}}),
        # the min-cut partitioner reads it
        ("functorch", {"functorch": {"ban_recompute_reductions": False}}),
    ],
)
def test_a_config_the_aot_part_reads_changes_the_key(
    cold: tuple[Path, dict[str, Any]], tmp_path: Path, what: str, change: dict[str, Any]
) -> None:
    # See Note [Inductor settings in the on-disk cache key] in aotkit_backends and Note
    # [On-disk cache keys]: an entry made under other settings is not reused
    root = _copy(cold, tmp_path / what)
    config = change.pop("config", None)
    changed = _wait(_start(root, config, **change))
    _same(changed, cold[1])
    assert changed["counters"]["trace"] == 2, what
    assert "hit" not in changed["counters"], what
    assert changed["counters"]["store"] == 2, what
    # the new entries sit beside the old ones, each served under its own settings
    assert len(_entries(root)) == 4
    again = _wait(_start(root, config, **change))
    _same(again, cold[1])
    assert "trace" not in again["counters"] and again["counters"]["hit"] == 2
    back = _wait(_start(root))
    _same(back, cold[1])
    assert "trace" not in back["counters"] and back["counters"]["hit"] == 2


def test_pre_grad_custom_pass_in_the_key_not_run_warm(tmp_path: Path) -> None:
    # See Note [Pre-grad passes after the cache lookup] in aotkit_frontends: a user's
    # pre-grad pass runs on a miss only; its uuid is part of aotkit's key (another uuid
    # traces again) and of Inductor's artifact handle (a warm start still loads Inductor's
    # artifacts by the stored key)
    root = tmp_path / "pre_grad"
    cold = _wait(_start(root, pre_grad="a"))
    assert cold["counters"]["trace"] == 2 and cold["counters"]["store"] == 2
    assert cold["pre_grad_calls"] == 2 and cold["pre_grad_runs"] == 2
    warm = _wait(_start(root, pre_grad="a"))
    _same(warm, cold)
    assert "trace" not in warm["counters"] and warm["counters"]["hit"] == 2
    assert warm["pre_grad_calls"] == 0 and warm["pre_grad_runs"] == 0
    assert warm["fx_graph_hashes"] == 0 and warm["fxgraph_cache_hit"] == 3
    other = _wait(_start(root, pre_grad="b"))
    _same(other, cold)
    assert other["counters"]["trace"] == 2 and "hit" not in other["counters"]
    assert other["pre_grad_calls"] == 2


def test_convnet_warm_start_loads_both_artifacts_bitwise(tmp_path: Path) -> None:
    # A BatchNorm convnet (buffer mutations), contiguous and channels-last. The cold
    # forward saves channels-last activations (Inductor's layout optimization) and the
    # cold backward is compiled for them. The restored forward carries its user-visible
    # output stamp (See Note [User-visible output stamps of cached graphs] in
    # aotkit_capture), so the warm forward compiles as the cold one did: it loads the cold
    # forward's artifact, whose reported strides restride the backward's saved inputs as
    # they were cold, so the backward's artifact loads too. Before, the warm forward kept
    # eager layouts, both graphs were compiled again, and results differed in the last bits.
    roots = {layout: tmp_path / layout for layout in ("contiguous", "channels_last")}
    specs = {
        layout: {"model": "convnet", "batch": 4, "channels_last": layout == "channels_last"}
        for layout in roots
    }
    # checked against eager inside each process
    colds = {k: _start(roots[k], **specs[k]) for k in roots}
    cold = {k: _wait(p) for k, p in colds.items()}
    warms = {k: _start(roots[k], **specs[k]) for k in roots}
    warm = {k: _wait(p) for k, p in warms.items()}
    for layout in roots:
        c, w = cold[layout], warm[layout]
        assert c["counters"]["trace"] == 2 and c["inductor_codegens"] == 3, layout
        assert "trace" not in w["counters"] and w["counters"]["hit"] == 2, layout
        # forward, backward and inference loaded from Inductor's cache by the stored keys:
        # no Inductor compile, no key recomputed, no entry rewritten
        assert w["inductor_codegens"] == 0, layout
        assert w["fx_graph_hashes"] == 0 and w["fxgraph_cache_hit"] == 3, layout
        assert "artifact_update" not in w["counters"], layout
        for field in ("out", "grads", "inference", "buffers", "strides"):
            assert w[field] == c[field], (layout, field)  # bitwise
    assert cold["channels_last"]["strides"][1] != cold["contiguous"]["strides"][1]


def test_dynamic_shapes_warm_start_loads_by_stored_key(tmp_path: Path) -> None:
    # See Note [Inductor artifact keys for dynamic shapes] in aotkit_backends: symbolic
    # graphs (dynamo's SymInt inputs bind every size) store Inductor's key too, and a warm
    # start loads the artifacts by it, Inductor checking the artifacts' guards itself
    root = tmp_path / "dynamic"
    cold = _wait(_start(root, dynamic=True))
    assert cold["counters"]["trace"] == 2 and cold["counters"]["store"] == 2
    roles = sorted(sorted(_payload(p)["artifact_keys"]) for p in _entries(root))
    assert roles == [["bw", "fw"], ["inference"]]
    for p in _entries(root):
        assert "shape" in _payload(p)  # symbolic entries, with their shape facts
    warm = _wait(_start(root, dynamic=True))
    _same(warm, cold)
    assert "trace" not in warm["counters"] and warm["counters"]["hit"] == 2
    assert warm["fx_graph_hashes"] == 0  # Inductor's key was not recomputed
    assert warm["fxgraph_cache_hit"] == 3
    # the artifacts gone: each graph compiled again through compile_fx_inner, same values
    shutil.rmtree(root / "inductor" / "fxgraph")
    gone = _wait(_start(root, dynamic=True))
    _same(gone, cold)
    assert "trace" not in gone["counters"] and gone["fx_graph_hashes"] == 3

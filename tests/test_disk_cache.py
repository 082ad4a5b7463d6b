"""The on-disk compile cache: cold then warm runs in fresh processes, damaged entries,
concurrent writers, and what the key covers. See Note [On-disk compile cache]."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from aotkit_capture import ambient_state_key, program_fingerprint
from aotkit_capture._disk_cache import graph_from_json, graph_to_json
from aotkit_capture._disk_cache_key import entry_key
from aotkit_schemas import CacheFormatError, meta_from_json, meta_to_json
from torch._subclasses.fake_tensor import FakeTensorMode

PROGRAMS = str(Path(__file__).with_name("_disk_cache_programs.py"))


def _run(name: str, cache: Path) -> dict[str, Any]:
    env = {**os.environ, "AOTKIT_CACHE": "1", "AOTKIT_CACHE_DIR": str(cache)}
    proc = subprocess.run(
        [sys.executable, PROGRAMS, name], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["stderr"] = proc.stderr
    return result


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    skip = ("counters", "stderr")
    assert {k: v for k, v in a.items() if k not in skip} == {
        k: v for k, v in b.items() if k not in skip
    }


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.json"))


@pytest.mark.parametrize("name", ["mlp", "transformer", "convnet", "compiled"])
def test_cold_then_warm(name: str, tmp_path: Path) -> None:
    cold = _run(name, tmp_path)
    assert cold["counters"].get("trace", 0) >= 1
    assert cold["counters"].get("store", 0) == cold["counters"]["trace"]
    warm = _run(name, tmp_path)
    # no trace ran: every compilation came from the disk
    assert "trace" not in warm["counters"], warm["counters"]
    assert warm["counters"]["hit"] == cold["counters"]["store"]
    _same(cold, warm)


def test_dynamic_shapes_program_is_traced_again(tmp_path: Path) -> None:
    # dynamic-shape compilations are not cached yet (See Note [On-disk cache keys]); the
    # warm run traces again and agrees with the cold one
    cold = _run("dynamic", tmp_path)
    warm = _run("dynamic", tmp_path)
    assert warm["counters"].get("uncacheable") == 1 and warm["counters"].get("trace") == 1
    assert not _entries(tmp_path)
    _same(cold, warm)


def _corrupt(p: Path) -> None:
    p.write_bytes(b"\x00garbage{")


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _bit_flip(p: Path) -> None:
    data = bytearray(p.read_bytes())
    i = data.index(b'"payload"') + 200
    data[i] ^= 0x04
    p.write_bytes(bytes(data))


def _version_change(p: Path) -> None:
    doc = json.loads(p.read_text())
    doc["torch"] = "1.0.0"
    p.write_text(json.dumps(doc))


def _tamper_with_checksum(p: Path) -> None:
    # a payload that checks out by hash but names an operator that does not exist
    import hashlib

    doc = json.loads(p.read_text())
    text = doc["payload"].replace("op:aten::mm.default", "op:aten::no_such_op.default")
    text = text.replace("op:aten::addmm.default", "op:aten::no_such_op.default")
    assert text != doc["payload"]
    doc["payload"] = text
    doc["sha256"] = hashlib.sha256(text.encode()).hexdigest()
    p.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "damage", [_corrupt, _truncate, _bit_flip, _version_change, _tamper_with_checksum],
    ids=lambda f: f.__name__.strip("_"),
)
def test_damaged_entries_are_ignored_and_recompiled(damage: Any, tmp_path: Path) -> None:
    cold = _run("mlp", tmp_path)
    entries = _entries(tmp_path)
    assert len(entries) == cold["counters"]["store"] >= 1
    for p in entries:
        damage(p)
    warm = _run("mlp", tmp_path)
    assert warm["counters"].get("reject") == len(entries), warm["counters"]
    assert warm["counters"].get("trace") == len(entries)
    assert "aotkit cache: ignoring entry" in warm["stderr"]
    _same(cold, warm)
    # the recompiled entries replaced the damaged ones
    again = _run("mlp", tmp_path)
    assert again["counters"] == {"hit": len(entries)}
    _same(cold, again)


def test_two_processes_compiling_at_once_leave_valid_entries(tmp_path: Path) -> None:
    env = {**os.environ, "AOTKIT_CACHE": "1", "AOTKIT_CACHE_DIR": str(tmp_path)}
    procs = [
        subprocess.Popen([sys.executable, PROGRAMS, "transformer"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    _same(results[0], results[1])
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".tmp")]
    warm = _run("transformer", tmp_path)
    assert "trace" not in warm["counters"] and "reject" not in warm["counters"]
    _same(results[0], warm)


# ---- in-process checks of the format and the key --------------------------------------


def test_metadata_json_round_trip() -> None:
    import aotkit

    g = aotkit.aot_function(lambda x, b: (x.sin() * 2, b.add_(1)), aotkit.nop)
    g(torch.randn(3, requires_grad=True), torch.zeros(3))
    meta = g._aotkit_cache.artifacts[0].meta
    data = json.loads(json.dumps(meta_to_json(meta)))
    back = meta_from_json(data)
    assert back.input_info == meta.input_info
    assert back.output_info == meta.output_info
    assert back.tangent_indices == meta.tangent_indices
    assert [tuple(t.shape) for t in back.traced_tangents] == [
        tuple(t.shape) for t in meta.traced_tangents
    ]
    data["version"] = 999
    with pytest.raises(CacheFormatError):
        meta_from_json(data)
    data["version"] = 1
    data["output_info"][0]["output_type"] = "os.system"
    with pytest.raises(CacheFormatError):
        meta_from_json(data)


def test_graph_json_round_trip_and_unknown_targets() -> None:
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    import aotkit

    g = aotkit.aot_function(lambda x: torch.relu(x).sum(0, keepdim=True), aotkit.nop)
    g(torch.randn(2, 3))
    gm = g._aotkit_cache.artifacts[0].inference_module
    data = graph_to_json(gm)
    back = graph_from_json(json.loads(json.dumps(data)), FakeTensorMode())
    assert back.code == gm.code
    x = torch.randn(2, 3)
    torch.testing.assert_close(back(x), gm(x), rtol=0, atol=0)
    data["nodes"][1]["target"] = "py:builtins.eval"
    with pytest.raises(CacheFormatError):
        graph_from_json(data, FakeTensorMode())


class _Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2


def _use_double(x: torch.Tensor) -> torch.Tensor:
    return _Double.apply(x)


def test_key_covers_custom_function_code_and_ambient_state() -> None:
    import aotkit
    from aotkit_frontends._aot_function import make_config
    from aotkit_partitioners import default_partition

    before = program_fingerprint(_use_double)
    original = _Double.backward

    def other_backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 3

    _Double.backward = staticmethod(other_backward)  # type: ignore[method-assign,assignment]
    try:
        assert program_fingerprint(_use_double) != before
    finally:
        _Double.backward = original  # type: ignore[method-assign]
    assert program_fingerprint(_use_double) == before

    cfg = make_config(aotkit.nop, aotkit.nop, default_partition, None, 0, False, None)
    args = [torch.randn(3, requires_grad=True)]
    key = entry_key(before, args, cfg)
    state = ambient_state_key()
    with torch.no_grad():
        assert ambient_state_key() != state
        assert entry_key(before, args, cfg) != key
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert entry_key(before, args, cfg) != key
    finally:
        torch.set_default_dtype(old)
    assert entry_key(before, [torch.randn(4, requires_grad=True)], cfg) != key
    assert entry_key(before, args, cfg) == key

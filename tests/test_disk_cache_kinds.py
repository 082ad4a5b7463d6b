"""Program kinds the on-disk cache used to refuse, now stored: a warm start in a fresh
process restores them without tracing, with cold's graphs, outputs and gradients; a
program that differs only in a hook, a constant's value or a checkpointed body misses.
See Note [Module hooks in the on-disk cache key], Note [Tensor constants in the on-disk
cache], Note [RNG state operators in the on-disk cache], Note [View chains in the cache
JSON format] (aotkit_schemas), and Note [The program in
aot_function's disk key] (two stale hits this file found)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from aotkit_cache import cache_counters, program_fingerprint
from aotkit_cache.entry._graph import graph_from_json, graph_to_json
from aotkit_cache.key._constants import constant_from_json, constant_to_json
from aotkit_schemas import CacheFormatError, Uncacheable
from torch._subclasses.fake_tensor import FakeTensorMode

PROGRAMS = str(Path(__file__).with_name("_disk_cache_kinds_programs.py"))
KINDS = ["hooks", "hooks_kwargs", "const_function", "const_compiled", "checkpoint",
         "view_chain", "view_chain_input"]
# each differs from the kind before it in the key only: a warm start must not reuse
OTHERS = {"hooks_other": "hooks", "const_function_other": "const_function",
          "checkpoint_other": "checkpoint", "view_chain_other": "view_chain"}


def _run(d: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, PROGRAMS, str(d), *names],
        env={**os.environ, "AOTKIT_CACHE": "1"},
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["name"]: r for r in json.loads(proc.stdout.strip().splitlines()[-1])}


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    d = tmp_path_factory.mktemp("kinds")
    return d, _run(d, KINDS)


def test_cold_then_warm_restores_each_kind(
    cold: tuple[Path, dict[str, dict[str, Any]]], tmp_path: Path
) -> None:
    d = tmp_path / "warm"
    shutil.copytree(cold[0], d)
    warm = _run(d, KINDS + list(OTHERS))
    for name in KINDS:
        c, w = cold[1][name], warm[name]
        assert c["counters"] == {"miss": 1, "trace": 1, "store": 1}, (name, c["counters"])
        assert w["counters"] == {"hit": 1}, (name, w["counters"])  # no trace ran
        assert w["out"] == c["out"] and w["grads"] == c["grads"], name
        assert w["graphs"] == c["graphs"], name
    assert any("_tensor_constant0" in g for g in cold[1]["const_function"]["graphs"])
    assert any("_tensor_constant" in g for g in cold[1]["const_compiled"]["graphs"])
    assert any("run_with_rng_state" in g for g in cold[1]["checkpoint"]["graphs"])
    # another hook, another constant value, another checkpointed body: compiled afresh
    # (each program checks its values against eager)
    for name, like in OTHERS.items():
        assert warm[name]["counters"] == {"miss": 1, "trace": 1, "store": 1}, name
        assert warm[name]["out"] != cold[1][like]["out"], name


def test_two_module_classes_with_the_same_parameters_do_not_share_an_entry(
    tmp_path: Path,
) -> None:
    # before: aot_module's key named only aotkit's wrapper, and a warm start ran the other
    # module's graph
    script = """
import sys, torch, aotkit
from aotkit_cache import cache_counters
class M1(torch.nn.Module):
    def __init__(s):
        super().__init__(); s.l = torch.nn.Linear(4, 4)
    def forward(s, x): return s.l(x).relu()
class M2(M1):
    def forward(s, x): return s.l(x).sigmoid()
def f(a, b): return a - 2 * b
torch.manual_seed(0)
m = M1() if sys.argv[1] == "1" else M2()
x, y = torch.randn(3, 4), torch.randn(3, 4)
torch.testing.assert_close(aotkit.aot_module(m, aotkit.nop)(x), m(x))
g = aotkit.aot_function(f, aotkit.nop)
# the same flat inputs, another call structure
torch.testing.assert_close(g(x, y) if sys.argv[1] == "1" else g(b=x, a=y),
                           f(x, y) if sys.argv[1] == "1" else f(b=x, a=y))
print(dict(cache_counters))
"""
    env = {**os.environ, "AOTKIT_CACHE": "1", "AOTKIT_CACHE_DIR": str(tmp_path)}
    for arg in ("1", "2"):
        proc = subprocess.run([sys.executable, "-c", script, arg], env=env, capture_output=True,
                              text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.strip().splitlines()[-1] == str(
            {"miss": 2, "trace": 2, "store": 2}
        ), proc.stdout


def _hooked_fingerprint(hook: Any, **kw: Any) -> str:
    mod = torch.nn.Linear(2, 2)
    mod.register_forward_hook(hook, **kw)
    return program_fingerprint(mod)


def test_hooks_are_keyed_by_code_and_flags() -> None:
    def h1(m: Any, a: Any, o: Any) -> Any:
        return o * 2

    def h2(m: Any, a: Any, o: Any) -> Any:
        return o * 3

    plain = program_fingerprint(torch.nn.Linear(2, 2))
    assert _hooked_fingerprint(h1) == _hooked_fingerprint(h1)
    assert len({plain, _hooked_fingerprint(h1), _hooked_fingerprint(h2),
                _hooked_fingerprint(h1, always_call=True)}) == 4
    # a hook the fingerprint cannot describe leaves the module uncached
    with pytest.raises(Uncacheable):
        _hooked_fingerprint(object.__new__(type("Opaque", (), {"__call__": lambda *a: None})))


def test_global_hooks_are_in_the_key() -> None:
    from aotkit_cache.key._fingerprint import global_hooks_key

    assert global_hooks_key() is None
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: None)
    try:
        assert global_hooks_key() is not None
    finally:
        handle.remove()
    assert global_hooks_key() is None


def test_tensor_constants_held_by_a_graph_are_keyed_by_value() -> None:
    def gm_with(value: torch.Tensor) -> torch.fx.GraphModule:
        root = torch.nn.Module()
        root.c = value
        g = torch.fx.Graph()
        x = g.placeholder("x")
        g.output(g.call_function(torch.add, (x, g.get_attr("c"))))
        return torch.fx.GraphModule(root, g)

    a = program_fingerprint(gm_with(torch.tensor([1.0, 2.0])))
    assert a == program_fingerprint(gm_with(torch.tensor([1.0, 2.0])))
    assert a != program_fingerprint(gm_with(torch.tensor([1.0, 3.0])))
    assert a != program_fingerprint(gm_with(torch.tensor([1.0, 2.0], dtype=torch.float64)))


@pytest.mark.parametrize("value", [
    torch.tensor(2.5),
    torch.arange(24.0).reshape(2, 3, 4),
    torch.arange(24.0).reshape(2, 3, 4).permute(2, 0, 1),  # dense, not contiguous
    torch.randn(1, 3, 2, 2).to(memory_format=torch.channels_last),
    torch.tensor([True, False, True]),
    torch.randn(5).to(torch.bfloat16),
    torch.empty(0, 3),
    torch.tensor([1 + 2j, -3j]),
])
def test_constant_records_round_trip(value: torch.Tensor) -> None:
    record = json.loads(json.dumps(constant_to_json(value, "c")))
    back = constant_from_json(record, "c")
    assert back.dtype == value.dtype and back.shape == value.shape
    assert back.stride() == value.stride()
    assert torch.equal(back, value)


def test_damaged_constant_records_are_refused() -> None:
    record = constant_to_json(torch.arange(6.0), "c")
    flipped = dict(record, bytes=record["bytes"][:-4] + "AAA=")
    bad = [
        flipped,                                     # bytes that fail the checksum
        dict(record, size=[7]),                      # another size than the bytes
        dict(record, stride=[2]),                    # a layout with gaps
        dict(record, size=[1 << 40], stride=[1]),    # a huge allocation
        dict(record, bytes="not base64!"),
        dict(record, order="big" if sys.byteorder == "little" else "little"),
        dict(record, extra=1),
    ]
    for r in bad:
        with pytest.raises(CacheFormatError):
            constant_from_json(r, "c")


def test_constants_the_format_cannot_store_leave_the_compilation_uncached() -> None:
    with pytest.raises(Uncacheable):
        constant_to_json(torch.arange(10.0)[::2], "c")  # not dense
    with pytest.raises(Uncacheable):
        constant_to_json(torch.nn.Parameter(torch.ones(2)), "c")  # not a plain tensor


def test_a_graph_with_a_constant_round_trips_and_is_checked() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * torch.tensor([1.0, 2.0, 3.0])

    from aotkit_backends import nop
    from aotkit_capture import record_compilations
    from aotkit_frontends import aot_function

    with record_compilations() as compiled:
        aot_function(f, nop)(torch.randn(3))
    gm = compiled[0].inference_module
    d = json.loads(json.dumps(graph_to_json(gm)))
    assert set(d["constants"]) == {"_tensor_constant0"}
    back = graph_from_json(d, FakeTensorMode())
    assert back.code == gm.code
    assert torch.equal(back._tensor_constant0, gm._tensor_constant0)
    # a stored constant no node reads, a read constant that is not stored
    unread = dict(d, constants={**d["constants"], "_other": d["constants"]["_tensor_constant0"]})
    missing = {k: v for k, v in d.items() if k != "constants"}
    for broken in (unread, missing):
        with pytest.raises(CacheFormatError):
            graph_from_json(broken, FakeTensorMode())
    cache_counters.clear()

"""Graphs that call higher-order operators in the on-disk cache: a warm start in a fresh
process restores them (subgraphs included) without tracing, with the same graphs and
values; a stored nested graph that does not fit its call is refused and compiled again.
See Note [Higher-order operators in the on-disk cache]."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from aotkit_backends import nop
from aotkit_cache._files import entry_bytes, split_entry
from aotkit_cache.entry._graph import graph_from_json, graph_to_json
from aotkit_capture import record_compilations
from aotkit_frontends import aot_function
from aotkit_schemas import CacheFormatError, Uncacheable
from torch._subclasses.fake_tensor import FakeTensorMode

PROGRAMS = str(Path(__file__).with_name("_disk_cache_hops_programs.py"))
NAMES = ["cond_function", "cond_compiled", "regions_compiled"]
# See Note [Effect tokens in the on-disk cache]: aten._print and linalg's error checks
EFFECTS = ["effects_function", "effects_compiled"]
MARKER = "aotkit-effect-marker"


def _run(d: Path, names: list[str], **env: str) -> dict[str, dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, PROGRAMS, str(d), *names],
        env={**os.environ, "AOTKIT_CACHE": "1", **env},
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    results = json.loads(lines[-1])
    out = {r["name"]: r for r in results}
    # the effectful print of effects_function: once by the compiled call, once by eager
    out["markers"] = {"count": sum(line.strip() == MARKER for line in lines[:-1])}
    return out


def _entries(d: Path) -> list[Path]:
    return sorted(d.rglob("*.json"))


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    d = tmp_path_factory.mktemp("hops")
    return d, _run(d, NAMES + EFFECTS)


def test_cold_then_warm_restores_hop_graphs(
    cold: tuple[Path, dict[str, dict[str, Any]]], tmp_path: Path
) -> None:
    d = tmp_path / "warm"
    shutil.copytree(cold[0], d)
    warm = _run(d, NAMES + EFFECTS)
    for name in NAMES + EFFECTS:
        c, w = cold[1][name], warm[name]
        assert c["counters"] == {"miss": 1, "trace": 1, "store": 1}, (name, c["counters"])
        assert w["counters"] == {"hit": 1}, (name, w["counters"])  # no trace ran
        assert w["out"] == c["out"] and w["grads"] == c["grads"], name
        # the same graphs, subgraphs included, as the cold trace made
        assert w["graphs"] == c["graphs"], name
        if name in EFFECTS:
            assert any("with_effects" in g for g in c["graphs"]), name
        else:
            assert any("subgraph" in g or "graph_0" in g for g in c["graphs"]), name
    # the restored forward still prints, once per call
    assert cold[1]["markers"]["count"] == 2 and warm["markers"]["count"] == 2


INDUCTOR = ["cond_inductor", "regions_inductor", "effects_inductor"]


def test_cold_then_warm_with_aotkit_inductor(tmp_path: Path) -> None:
    # the restored HOP subgraphs and effect tokens compiled by Inductor (its own cache in
    # the test's directory); each program checks outputs and gradients against eager
    from aotkit_backends import inductor_available

    if not inductor_available():
        pytest.skip("Inductor cannot compile here")
    inductor_dir = str(tmp_path / "inductor")
    cold = _run(tmp_path / "aotkit", INDUCTOR, TORCHINDUCTOR_CACHE_DIR=inductor_dir)
    warm = _run(tmp_path / "aotkit", INDUCTOR, TORCHINDUCTOR_CACHE_DIR=inductor_dir)
    for name in INDUCTOR:
        assert cold[name]["counters"]["trace"] == 1, (name, cold[name]["counters"])
        assert warm[name]["counters"] == {"hit": 1}, (name, warm[name]["counters"])
        assert warm[name]["out"] == cold[name]["out"], name
        assert warm[name]["grads"] == cold[name]["grads"], name
        assert warm[name]["graphs"] == cold[name]["graphs"], name


def _rewrite(p: Path, change: Callable[[dict[str, Any]], None]) -> None:
    doc, body = split_entry(p.read_bytes())
    payload = json.loads(body)
    change(payload)
    p.write_bytes(entry_bytes(doc, json.dumps(payload, sort_keys=True, separators=(",", ":"))))


def _swap_branches(payload: dict[str, Any]) -> None:
    # a forged entry whose forward's cond reads a subgraph the entry does not hold
    for node in payload["fw"]["nodes"]:  # [op, name, target, ...]
        if node[0] == "get_attr":
            node[2] = "missing_graph"


def test_a_tampered_nested_graph_is_refused_and_compiled_again(
    cold: tuple[Path, dict[str, dict[str, Any]]], tmp_path: Path
) -> None:
    d = tmp_path / "tampered"
    shutil.copytree(cold[0], d)
    entries = _entries(d)
    assert entries
    for p in entries:
        _rewrite(p, _swap_branches)
    again = _run(d, NAMES)
    for name in NAMES:
        r = again[name]
        assert r["counters"].get("reject") == 1 and r["counters"]["trace"] == 1, (name, r["counters"])
        assert r["out"] == cold[1][name]["out"] and r["grads"] == cold[1][name]["grads"], name
        assert r["graphs"] == cold[1][name]["graphs"], name


# ---- the stored form, in process ------------------------------------------------------


def _cond(x: torch.Tensor) -> torch.Tensor:
    return torch.cond(x.sum() > 0, lambda y: y.sin(), lambda y: y.cos() * 2, (x,))


def _fw_json() -> dict[str, Any]:
    with record_compilations() as compiled:
        aot_function(_cond, nop)(torch.randn(3, requires_grad=True))
    d = graph_to_json(compiled[0].fw_module)
    assert set(d["subgraphs"]) == {"true_graph_0", "false_graph_0"}
    return d


def test_hop_graph_round_trip() -> None:
    with record_compilations() as compiled:
        aot_function(_cond, nop)(torch.randn(3, requires_grad=True))
    fw = compiled[0].fw_module
    back = graph_from_json(graph_to_json(fw), FakeTensorMode())
    assert back.code == fw.code
    for name in ("true_graph_0", "false_graph_0"):
        assert getattr(back, name).code == getattr(fw, name).code


def _hop_node(d: dict[str, Any]) -> list[Any]:
    # See Note [Graph nodes in the cache JSON]: [op, name, target, args, kwargs, val]
    return next(n for n in d["nodes"] if str(n[2]).startswith("hop:"))


def _drop_a_placeholder(d: dict[str, Any]) -> None:
    nodes = d["subgraphs"]["true_graph_0"]["nodes"]
    # the subgraph takes one input fewer than cond passes (its output reads a constant)
    ph = next(n for n in nodes if n[0] == "placeholder")
    nodes.remove(ph)
    for n in nodes:
        if n[0] != "placeholder":
            n[3] = json.loads(json.dumps(n[3]).replace(json.dumps(ph[1]), "1"))


TAMPERS: dict[str, Callable[[dict[str, Any]], None]] = {
    "missing subgraph": lambda d: d["subgraphs"].pop("false_graph_0"),
    "unread subgraph": lambda d: d["subgraphs"].__setitem__(
        "extra_graph", copy.deepcopy(d["subgraphs"]["true_graph_0"])
    ),
    "bad subgraph name": lambda d: d["subgraphs"].__setitem__(
        "a.b", d["subgraphs"].pop("true_graph_0")
    ),
    "unknown hop": lambda d: _hop_node(d).__setitem__(2, "hop:triton_kernel_wrapper_mutation"),
    "not a hop": lambda d: _hop_node(d).__setitem__(2, "hop:__class__"),
    "subgraph input count": _drop_a_placeholder,
    "subgraphs not an object": lambda d: d.__setitem__("subgraphs", ["true_graph_0"]),
    "subgraph does not lint": lambda d: d["subgraphs"]["true_graph_0"]["nodes"].reverse(),
}


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_a_mismatched_nested_graph_is_refused(tamper: str) -> None:
    d = _fw_json()
    TAMPERS[tamper](d)
    with pytest.raises(CacheFormatError):
        graph_from_json(d, FakeTensorMode())


def test_hops_outside_the_list_and_other_attributes_are_not_stored() -> None:
    # tensor constants and the functionalized RNG's state operators were refused here
    # before; they are stored now (See Note [Tensor constants in the on-disk cache] and
    # Note [RNG state operators in the on-disk cache]: tests/test_disk_cache_kinds.py)
    root = torch.nn.Module()
    root.sub = torch.nn.Linear(2, 2)  # a module that is not an FX subgraph
    g = torch.fx.Graph()
    g.output((g.get_attr("sub"),))
    with pytest.raises(Uncacheable, match="not an FX subgraph"):
        graph_to_json(torch.fx.GraphModule(root, g))
    g2 = torch.fx.Graph()
    x = g2.placeholder("x")
    # a HOP that carries process-local state (a TorchBind object)
    g2.output((g2.call_function(torch.ops.higher_order.call_torchbind, (x, "m")), x))
    with pytest.raises(Uncacheable, match="no cache form"):
        graph_to_json(torch.fx.GraphModule(torch.nn.Module(), g2))


def _print_twice(x: torch.Tensor) -> torch.Tensor:
    torch.ops.aten._print("aotkit-in-process-effect")
    return x.cos() * 2


@pytest.mark.parametrize(
    "tokens",
    [
        {"effects": [], "backward": 0},  # the forward's token placeholder left unexplained
        {"effects": ["ORDERED", "ORDERED"], "backward": 0},
        {"effects": ["NOT_AN_EFFECT"], "backward": 0},
        {"effects": ["ORDERED"], "backward": -1},
        None,  # the tokens dropped
    ],
)
def test_mismatched_effect_tokens_are_refused(
    tokens: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aotkit_cache import cache_counters
    from aotkit_schemas import disk_cache_config

    monkeypatch.setattr(disk_cache_config, "dir", str(tmp_path))
    monkeypatch.setattr(disk_cache_config, "enabled", True)
    x = torch.randn(3, requires_grad=True)
    cache_counters.clear()
    aot_function(_print_twice, nop)(x)
    assert cache_counters["store"] == 1
    (entry,) = _entries(tmp_path)

    def change(payload: dict[str, Any]) -> None:
        if tokens is None:
            del payload["tokens"]
        else:
            payload["tokens"] = tokens

    _rewrite(entry, change)
    cache_counters.clear()
    out = aot_function(_print_twice, nop)(x)
    assert cache_counters["reject"] == 1 and cache_counters["trace"] == 1, dict(cache_counters)
    torch.testing.assert_close(out, _print_twice(x))

"""The on-disk compile cache: cold then warm runs in fresh processes, damaged entries,
concurrent writers, and what the key covers. See Note [On-disk compile cache]."""

from __future__ import annotations

import hashlib
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
from aotkit_cache import ambient_state_key, program_fingerprint
from aotkit_cache._files import entry_bytes, split_entry
from aotkit_cache.entry._graph import graph_from_json, graph_to_json
from aotkit_cache.key._key import entry_key
from aotkit_schemas import CacheFormatError, meta_from_json, meta_to_json
from torch._subclasses.fake_tensor import FakeTensorMode

PROGRAMS = str(Path(__file__).with_name("_disk_cache_programs.py"))
COLD = ["mlp", "transformer", "convnet", "dynamic", "compiled", "compiled_dynamic"]
# warm: the cold programs, and the dynamic program with sizes that satisfy the cold
# entry's shape guards (used, no trace) and with a size that does not (traced again)
WARM = [*COLD, "dynamic_other", "dynamic_one", "compiled_dynamic_other"]
Spec = list[tuple[Path, list[str], int]]


def _argv(spec: Spec) -> list[str]:
    return [sys.executable, PROGRAMS, json.dumps([[str(d), n, r] for d, n, r in spec])]


def _env() -> dict[str, str]:
    # the programs set aotkit_schemas.disk_cache_config.dir; AOTKIT_CACHE turns it on for
    # aot_function/aot_module
    return {**os.environ, "AOTKIT_CACHE": "1"}


def _parse(out: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = json.loads(out.strip().splitlines()[-1])
    return result


def _start(spec: Spec) -> subprocess.Popen[str]:
    return subprocess.Popen(_argv(spec), env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait(proc: subprocess.Popen[str]) -> tuple[list[dict[str, Any]], str]:
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    return _parse(out), err


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    skip = ("counters", "dir")
    assert {k: v for k, v in a.items() if k not in skip} == {
        k: v for k, v in b.items() if k not in skip
    }


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.json"))


def _corrupt(p: Path) -> None:
    p.write_bytes(b"\x00garbage{")


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _bit_flip(p: Path) -> None:
    data = bytearray(p.read_bytes())
    i = data.index(b"\n") + 200  # inside the payload
    data[i] ^= 0x04
    p.write_bytes(bytes(data))


def _rewrite_entry(p: Path, header: Callable[[dict[str, Any]], None] = lambda h: None,
                   payload: Callable[[str], str] = lambda t: t) -> None:
    """Rewrite an entry file with a changed header or payload, checksum recomputed."""
    doc, body = split_entry(p.read_bytes())
    header(doc)
    text = payload(body.decode())
    p.write_bytes(entry_bytes(doc, text))


def _version_change(p: Path) -> None:
    _rewrite_entry(p, header=lambda h: h.update(torch="1.0.0"))


def _format_change(p: Path) -> None:
    _rewrite_entry(p, header=lambda h: h.update(format=999))


def _format_2_file(p: Path) -> None:
    # an entry as format 2 wrote it (one JSON object holding the payload as a string)
    doc, body = split_entry(p.read_bytes())
    doc["payload"] = body.decode()
    p.write_text(json.dumps(doc))


def _tamper_with_checksum(p: Path) -> None:
    # a payload that checks out by hash but names an operator that does not exist
    def change(text: str) -> str:
        new = text.replace("op:aten::mm.default", "op:aten::no_such_op.default")
        new = new.replace("op:aten::addmm.default", "op:aten::no_such_op.default")
        assert new != text
        return new

    _rewrite_entry(p, payload=change)


def _tamper_with_inputs(p: Path) -> None:
    # a payload that checks out by hash but whose graph takes inputs of another shape
    def change(text: str) -> str:
        new = text.replace('"shape":[5,8]', '"shape":[6,8]')
        assert new != text
        return new

    _rewrite_entry(p, payload=change)


DAMAGES = [
    _corrupt, _truncate, _bit_flip, _version_change, _format_change, _format_2_file,
    _tamper_with_checksum, _tamper_with_inputs,
]


class Runs:
    """Every subprocess of this file, run once (process start dominates their cost): a
    cold process that fills ``all`` (every program) and ``mlp`` (the MLP alone, the
    source of the damaged copies), started together with a second process that, like the
    first, compiles the MLP into ``shared`` first (two writers of the same keys at once);
    then one warm process over ``all``, ``shared`` and every damaged copy (twice each)."""

    def __init__(self, root: Path) -> None:
        self.all, self.mlp, self.shared = root / "all", root / "mlp", root / "shared"
        first = _start([(self.shared, ["mlp"], 1), (self.all, COLD, 1), (self.mlp, ["mlp"], 1)])
        second = _start([(self.shared, ["mlp"], 1)])
        cold, _ = _wait(first)
        self.concurrent = [cold[0], _wait(second)[0][0]]
        self.cold = {r["name"]: r for r in cold[1:-1]}
        self.cold_mlp = cold[-1]
        self.mlp_entries = _entries(self.mlp)
        self.damaged = []
        for damage in DAMAGES:
            d = root / damage.__name__.strip("_")
            shutil.copytree(self.mlp, d)
            for p in _entries(d):
                damage(p)
            self.damaged.append(d)
        # the shared directory is checked before the warm run reads it
        self.shared_entries = _entries(self.shared)
        self.leftovers = [p for p in self.shared.rglob("*") if p.name.startswith(".tmp")]
        spec: Spec = [(self.all, WARM, 1), (self.shared, ["mlp"], 1)]
        spec += [(d, ["mlp"], 2) for d in self.damaged]
        warm, self.warm_stderr = _wait(_start(spec))
        self.warm = {r["name"]: r for r in warm[: len(WARM)]}
        self.shared_warm = warm[len(WARM)]
        rest = warm[len(WARM) + 1 :]
        self.damaged_runs = list(zip(rest[::2], rest[1::2], strict=True))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("disk_cache"))


def test_cold_then_warm(runs: Runs) -> None:
    # one process compiles every program cold, a fresh one runs them warm
    for name in COLD:
        c, w = runs.cold[name], runs.warm[name]
        _same(c, w)
        assert c["counters"].get("trace", 0) >= 1, (name, c["counters"])
        assert c["counters"].get("store", 0) == c["counters"]["trace"], (name, c["counters"])
        # no trace ran: every compilation came from the disk
        assert "trace" not in w["counters"], (name, w["counters"])
        assert w["counters"]["hit"] == c["counters"]["store"], (name, w["counters"])


def test_dynamic_entry_used_only_where_its_guards_hold(runs: Runs) -> None:
    # See Note [Dynamic shapes in the on-disk cache]: other sizes >= 2 satisfy the cold
    # entry's guards (no trace); a size of 1 does not (traced again, stored as a second
    # entry of the same key); both agree with eager (checked in the program)
    other, one = runs.warm["dynamic_other"], runs.warm["dynamic_one"]
    assert other["eager_ok"] and one["eager_ok"]
    assert other["counters"] == {"hit": 1}, other["counters"]
    assert one["counters"].get("guard_fail", 0) >= 1, one["counters"]
    assert one["counters"].get("trace") == 1 and one["counters"].get("store") == 1
    assert "hit" not in one["counters"] and "reject" not in one["counters"]


def test_a_dynamo_dynamic_entry_is_used_at_another_batch_size(runs: Runs) -> None:
    # torch.compile(dynamic=True): cold at batch 5, warm at batch 7 in a fresh process; the
    # key holds dynamo's symbolic sizes, not the real tensors' (it missed before)
    other = runs.warm["compiled_dynamic_other"]
    stored = runs.cold["compiled_dynamic"]["counters"]["store"]
    assert other["counters"] == {"hit": stored}, other["counters"]


def test_damaged_entries_are_ignored_and_recompiled(runs: Runs) -> None:
    n = len(runs.mlp_entries)
    assert n == runs.cold_mlp["counters"]["store"] >= 1
    assert "aotkit cache: ignoring entry" in runs.warm_stderr
    # per directory: a run that finds the damaged entries, then one that finds the
    # entries the first rewrote
    for d, (warm, again) in zip(runs.damaged, runs.damaged_runs, strict=True):
        assert warm["dir"] == again["dir"] == str(d)
        assert warm["counters"].get("reject") == n, (d.name, warm["counters"])
        assert warm["counters"].get("trace") == n, (d.name, warm["counters"])
        _same(runs.cold_mlp, warm)
        assert again["counters"] == {"hit": n}, (d.name, again["counters"])
        _same(runs.cold_mlp, again)


def test_two_processes_compiling_at_once_leave_valid_entries(runs: Runs) -> None:
    results = runs.concurrent
    _same(results[0], results[1])
    assert not runs.leftovers
    entries = runs.shared_entries
    # each process stored every entry or (when the other was faster) found it
    for r in results:
        assert r["counters"].get("store", 0) + r["counters"].get("hit", 0) == len(entries) >= 1
    for p in entries:  # each a complete, checksummed document
        doc, body = split_entry(p.read_bytes())
        assert hashlib.sha256(body).hexdigest() == doc["sha256"]
        json.loads(body)
    warm = runs.shared_warm
    assert "trace" not in warm["counters"] and "reject" not in warm["counters"]
    _same(results[0], warm)


def test_cache_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from aotkit._cli import main
    from aotkit_schemas import disk_cache_config

    entry = tmp_path / "v1" / "ab" / ("ab" + "0" * 62 + ".json")
    entry.parent.mkdir(parents=True)
    entry.write_text("{}")
    other = tmp_path / "notes.json"  # not an entry: never listed or removed
    other.write_text("{}")
    disk_cache_config.dir = str(tmp_path)
    try:
        assert main(["cache", "where"]) == 0
        assert capsys.readouterr().out.strip() == str(tmp_path)
        assert main(["cache", "list"]) == 0
        assert str(entry) in capsys.readouterr().out
        assert main(["cache", "size"]) == 0
        assert capsys.readouterr().out.strip() == "1 entries, 2 bytes"
        assert main(["cache"]) == 0
        assert "entries: 1, 2 bytes" in capsys.readouterr().out
        assert main(["cache", "clear"]) == 0
        assert "removed 1 files" in capsys.readouterr().out
    finally:
        disk_cache_config.dir = None
    assert not entry.exists() and other.exists()


# ---- in-process checks of the format and the key --------------------------------------


def test_metadata_json_round_trip() -> None:
    import aotkit

    g = aotkit.aot_function(lambda x, b: (x.sin() * 2, b.add_(1)), aotkit.nop)
    g(torch.randn(3, requires_grad=True), torch.zeros(3))
    meta = g._aotkit_cache.artifacts[0].meta
    data = json.loads(json.dumps(meta_to_json(meta)))
    data_version = data["version"]
    back = meta_from_json(data)
    assert back.bw_donated_idxs == meta.bw_donated_idxs
    assert back.input_info == meta.input_info
    assert back.output_info == meta.output_info
    assert back.tangent_indices == meta.tangent_indices
    assert [tuple(t.shape) for t in back.traced_tangents] == [
        tuple(t.shape) for t in meta.traced_tangents
    ]
    data["version"] = 999
    with pytest.raises(CacheFormatError):
        meta_from_json(data)
    data["version"] = data_version
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
    data["nodes"][1][2] = "py:builtins.eval"  # [op, name, target, args, kwargs, val]
    with pytest.raises(CacheFormatError):
        graph_from_json(data, FakeTensorMode())


def test_graph_json_keeps_argument_types() -> None:
    # See Note [Graph nodes in the cache JSON]: a node name is a bare string, a string
    # literal is tagged; lists stay lists, tuples tuples, floats exact
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = FakeTensorMode().from_tensor(torch.randn(4, 4))
    calls = [
        (torch.ops.aten.div.Tensor_mode, (x, x), {"rounding_mode": "floor"}),
        (torch.ops.aten.sum.dim_IntList, (x, [0, 1], True), {"dtype": torch.float64}),
        (torch.ops.aten.reshape.default, (x, [2, 8]), {}),
        (torch.ops.aten.add.Tensor, (x, x), {"alpha": 0.1}),
        (torch.ops.aten.empty_strided.default, ((2, 2), [2, 1]),
         {"device": torch.device("cpu"), "pin_memory": None}),
    ]
    made = []
    for target, args, kwargs in calls:
        n = graph.call_function(target, args, kwargs)
        n.meta["val"] = x.meta["val"]
        made.append(n)
    graph.output(tuple(made))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    back = graph_from_json(json.loads(json.dumps(graph_to_json(gm))), FakeTensorMode())

    def typed(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return ("node", a.name)
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, [typed(v) for v in a])
        return (type(a).__name__, a)

    for before, after in zip(gm.graph.nodes, back.graph.nodes, strict=True):
        assert (after.op, after.name, after.target) == (before.op, before.name, before.target)
        assert typed(list(after.args)) == typed(list(before.args)), before.name
        assert list(after.kwargs) == list(before.kwargs), before.name
        assert typed(list(after.kwargs.values())) == typed(list(before.kwargs.values()))
    assert back.code == gm.code


def _last_call_first(d: dict[str, Any]) -> None:
    # the last call (``+ 1``) reads the one before it (``relu``): swapped, it reads it early
    # nodes are [op, name, target, args, kwargs, val]: See Note [Graph nodes in the cache JSON]
    nodes = d["nodes"]
    assert nodes[-1][0] == "output" and nodes[-2][3][0] == nodes[-3][1]
    nodes[-3], nodes[-2] = nodes[-2], nodes[-3]


# what ``graph.lint()`` checked, now held by construction in graph_from_json: each form is
# rejected (CacheFormatError: the entry is compiled again), never rebuilt into a graph
_MALFORMED_GRAPHS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "nodes reversed": lambda d: d["nodes"].reverse(),
    "a node read before it is made": _last_call_first,
    "a repeated node name": lambda d: d["nodes"][2].__setitem__(1, d["nodes"][1][1]),
    "a name that is not an identifier": lambda d: d["nodes"][1].__setitem__(1, "a b"),
    "an unknown node op": lambda d: d["nodes"][1].__setitem__(0, "call_module"),
    "an argument naming no node": lambda d: d["nodes"][-1].__setitem__(3, ["nowhere"]),
    "a node that is not an array": lambda d: d["nodes"].__setitem__(1, dict(enumerate(d["nodes"][1]))),
    "a node with too few items": lambda d: d["nodes"][1].pop(),
    "an unknown extra": lambda d: d["nodes"][0].append({"static": False, "other": 1}),
    "an output with a value": lambda d: d["nodes"][-1].__setitem__(5, 0),
    "an unknown argument tag": lambda d: d["nodes"][-2][3].__setitem__(1, {"x": 1}),
}


@pytest.mark.parametrize("corrupt", list(_MALFORMED_GRAPHS), ids=list(_MALFORMED_GRAPHS))
def test_graph_json_rejects_malformed_graphs(corrupt: str) -> None:
    import aotkit

    g = aotkit.aot_function(lambda x: (x.sin() * x.cos()).relu() + 1, aotkit.nop)
    g(torch.randn(2, 3))
    gm = g._aotkit_cache.artifacts[0].inference_module
    data = json.loads(json.dumps(graph_to_json(gm)))
    graph_from_json(json.loads(json.dumps(data)), FakeTensorMode())  # intact: rebuilds
    _MALFORMED_GRAPHS[corrupt](data)
    with pytest.raises(CacheFormatError):
        graph_from_json(data, FakeTensorMode())


def test_graph_json_keeps_the_user_visible_output_stamp() -> None:
    # See Note [User-visible output stamps of cached graphs]: aotkit_inductor's forward
    # keeps the stamp, which decides how Inductor lays out its saved outputs
    import aotkit

    g = aotkit.aot_function(lambda x: (x.sin(), x.cos()), aotkit.nop)
    g(torch.randn(2, 3))
    gm = g._aotkit_cache.artifacts[0].inference_module
    output = gm.graph.find_nodes(op="output")[0]
    data = graph_to_json(gm)
    # unmarked graphs stay unmarked: the output's only extra is its descriptors (See Note
    # [Graph descriptors] in aotkit_schemas)
    assert data["nodes"][-1][6] == {"desc": [["PlainAOTOutput", {"idx": 0}],
                                             ["PlainAOTOutput", {"idx": 1}]]}
    back = graph_from_json(json.loads(json.dumps(data)), FakeTensorMode())
    assert "user_visible_output_idxs" not in back.graph.find_nodes(op="output")[0].meta
    output.meta["user_visible_output_idxs"] = [1]
    data = graph_to_json(gm)
    back = graph_from_json(json.loads(json.dumps(data)), FakeTensorMode())
    assert back.graph.find_nodes(op="output")[0].meta["user_visible_output_idxs"] == [1]
    for bad in ([2], [0, 0], ["0"], [True], 1, [-1]):
        data["nodes"][-1][6:] = [{"user_visible": bad}]
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
    # a constant in the forward's code changes the key too
    original_fw = _Double.forward

    def other_forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2.5

    _Double.forward = staticmethod(other_forward)  # type: ignore[method-assign,assignment]
    try:
        assert program_fingerprint(_use_double) != before
    finally:
        _Double.forward = original_fw  # type: ignore[method-assign]

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
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert entry_key(before, args, cfg) != key
    torch.use_deterministic_algorithms(True)
    try:
        assert entry_key(before, args, cfg) != key
    finally:
        torch.use_deterministic_algorithms(False)
    assert entry_key(before, [torch.randn(4, requires_grad=True)], cfg) != key
    assert entry_key(before, [torch.randn(3)], cfg) != key
    assert entry_key(before, [torch.randn(3, dtype=torch.float64, requires_grad=True)], cfg) != key
    assert entry_key(before, [torch.randn(6, requires_grad=True)[::2]], cfg) != key
    assert entry_key(before, args, cfg) == key


def test_off_by_default_and_opt_in_by_cache_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import aotkit
    from aotkit_cache import cache_counters
    from aotkit_schemas import disk_cache_config, mark_cache_key

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin().sum()

    def user_compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        return aotkit.nop(gm, example_inputs)

    x = torch.randn(3, requires_grad=True)
    monkeypatch.delenv("AOTKIT_CACHE", raising=False)
    monkeypatch.setattr(disk_cache_config, "dir", str(tmp_path))
    cache_counters.clear()
    aotkit.aot_function(f, aotkit.nop)(x).backward()  # off by default
    assert not _entries(tmp_path) and cache_counters == {"trace": 1}
    monkeypatch.setattr(disk_cache_config, "enabled", True)
    aotkit.aot_function(f, user_compiler)(x).backward()  # on, but no key: not cached
    assert not _entries(tmp_path) and cache_counters["uncacheable"] == 1
    assert cache_counters["trace"] == 2
    mark_cache_key(user_compiler, "test.user_compiler/1")
    cache_counters.clear()
    aotkit.aot_function(f, user_compiler)(x).backward()
    assert len(_entries(tmp_path)) == 1 and cache_counters["store"] == 1
    cache_counters.clear()
    g = aotkit.aot_function(f, user_compiler)
    torch.testing.assert_close(g(x), f(x))
    assert cache_counters == {"hit": 1}
    assert g._aotkit_cache.artifacts[0].from_cache
    monkeypatch.setenv("AOTKIT_CACHE", "0")  # the config object wins over the environment
    cache_counters.clear()
    aotkit.aot_function(f, user_compiler)(x).backward()
    assert cache_counters == {"hit": 1}
    monkeypatch.setattr(disk_cache_config, "enabled", None)
    cache_counters.clear()
    aotkit.aot_function(f, user_compiler)(x).backward()
    assert "hit" not in cache_counters and cache_counters["trace"] == 1


def test_a_warm_hit_logs_torchs_metadata_line_with_the_stored_donated_buffers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A warm process logs what a cold one does (Note [torch's aot_graphs metadata line]):
    # torch's suite reads ``bw_donated_idxs=[...]`` off this line, and aotkit_eager's
    # entries are on by default, so a second run of a program must log it too.
    import logging

    import aotkit
    from aotkit_cache import cache_counters
    from aotkit_schemas import disk_cache_config

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin().cos().sum()  # saves sin(x): an intermediate, so donated

    logger = "torch._functorch._aot_autograd.graph_compile"
    monkeypatch.setattr(disk_cache_config, "dir", str(tmp_path))
    monkeypatch.setattr(disk_cache_config, "enabled", True)
    x = torch.randn(3, requires_grad=True)
    lines = []
    for expected in ("store", "hit"):
        cache_counters.clear()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=logger):
            aotkit.aot_function(f, aotkit.nop)(x).backward()
        assert cache_counters.get(expected) == 1
        lines.append([r.getMessage() for r in caplog.records if r.name.startswith(logger)])
    cold, warm = lines
    assert len(cold) == 1 and "bw_donated_idxs=[1]" in cold[0], cold
    # the restored metadata holds TensorSpecs where the traced one held fake tensors
    assert len(warm) == 1 and "bw_donated_idxs=[1]" in warm[0], warm

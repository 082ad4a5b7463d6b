"""TORCH_TRACE holds aotkit's graphs under torch's artifact names (Note [Structured trace
artifacts]), so tlparse shows them where it shows torch's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

# two frames in one process: frame 0 compiled by torch's aot_eager (the oracle), frame 1 by
# aotkit_eager; each is called once with grad (joint/forward/backward) and once without
# (inference)
PROGRAM = """
import torch, aotkit

def f(x, w):
    return (x @ w).relu().sum()

def g(x, w):
    return (x @ w).relu().sum()

for fn, backend in ((f, "aot_eager"), (g, "aotkit_eager")):
    c = torch.compile(fn, backend=backend)
    c(torch.randn(3, 4), torch.randn(4, 2, requires_grad=True)).backward()
    with torch.no_grad():
        c(torch.randn(3, 4), torch.randn(4, 2))
"""

GRAPHS = ("aot_joint_graph", "aot_forward_graph", "aot_backward_graph", "aot_inference_graph")


def _records(trace_dir: Path) -> list[tuple[dict[str, object], str]]:
    """(metadata, payload) of every structured-trace record in the directory."""
    records: list[tuple[dict[str, object], str]] = []
    for path in sorted(trace_dir.iterdir()):
        for line in path.read_text().splitlines():
            if line.startswith("\t"):
                if records:
                    meta, payload = records[-1]
                    records[-1] = (meta, payload + line[1:] + "\n")
                continue
            start = line.find("] {")
            if start < 0:
                continue
            records.append((json.loads(line[start + 2 :]), ""))
    return records


def _artifacts_by_frame(records: list[tuple[dict[str, object], str]]) -> dict[int, dict[str, str]]:
    frames: dict[int, dict[str, str]] = defaultdict(dict)
    for meta, payload in records:
        frame = meta.get("frame_id")
        if not isinstance(frame, int):
            continue
        for name in GRAPHS:
            if name in meta:
                frames[frame][name] = payload
        artifact = meta.get("artifact")
        if isinstance(artifact, dict):
            frames[frame][str(artifact["name"])] = payload
    return frames


def test_trace_file_holds_aotkit_graphs_under_torch_names(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("AOTKIT_LOGS", "TORCH_LOGS")}
    env["TORCH_TRACE"] = str(tmp_path)
    subprocess.run(
        [sys.executable, "-c", PROGRAM], env=env, check=True, timeout=300,
        capture_output=True, text=True,
    )
    frames = _artifacts_by_frame(_records(tmp_path))
    torch_names, ours = set(frames[0]), frames[1]
    # every graph artifact torch's aot_eager writes, aotkit writes too
    for name in (*GRAPHS, "aot_forward_graph_fw_metadata"):
        assert name in torch_names, f"the oracle did not write {name}"
        assert name in ours, f"aotkit did not write {name}; it wrote {sorted(ours)}"
    # with readable payloads: the graphs in torch's naming
    assert "primals_1" in ours["aot_joint_graph"] and "tangents_1" in ours["aot_joint_graph"]
    assert "primals_1" in ours["aot_forward_graph"]
    assert "tangents_1" in ours["aot_backward_graph"]
    assert "arg0_1" in ours["aot_inference_graph"]
    assert "ViewAndMutationMeta" in ours["aot_forward_graph_fw_metadata"]
    # and the partition report, which torch does not have
    assert "aotkit_partition_report" in ours
    # aotkit_eager partitions with min-cut, as torch's aot_eager does
    assert "partitioner min_cut_rematerialization_partition: saved 2 tensors" in ours["aotkit_partition_report"]
    assert "aotkit_partition_report" not in frames[0]

"""Where Inductor's time goes on aotkit_inductor's graphs against torch's ``inductor``.

For each model of ``zoo.py`` and each backend of the pair, a fresh ``torch.compile`` runs
one training step; every graph Inductor compiles (``_compile_fx_inner``) is recorded with
its role, node count, per-op counts and CPU time, and Inductor's own phase timers
(``torch._dynamo.utils.compilation_time_metrics``) are read per step. The two backends
alternate; each compiles once untimed first (Inductor's in-process kernel cache warms up,
as in ``zoo.py``).

Usage:
  uv run --group bench python tools/bench/inductor_split.py --models gpt2,resnet18 --reps 2
  uv run --group bench python tools/bench/inductor_split.py --models gpt2 --ops   # op diff
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
os.environ.setdefault("AOTKIT_CACHE", "0")

import argparse  # noqa: E402
import collections  # noqa: E402
import gc  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import aotkit  # noqa: E402, F401  (registers aotkit_inductor)
import torch  # noqa: E402
import torch._dynamo.utils as dynamo_utils  # noqa: E402
import torch._inductor.compile_fx as compile_fx  # noqa: E402
import zoo  # noqa: E402


@dataclass
class GraphRecord:
    role: str
    nodes: int
    ops: collections.Counter[str]
    seconds: float
    inputs: int
    outputs: int
    meta_keys: frozenset[str] = field(default_factory=frozenset)


RECORDS: list[GraphRecord] = []
_inner = compile_fx._compile_fx_inner


def _op_name(node: torch.fx.Node) -> str:
    t = node.target
    return str(getattr(t, "__name__", t)) if node.op == "call_function" else node.op


def _recording_inner(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *a: Any, **kw: Any
) -> Any:
    role = (
        "backward"
        if kw.get("is_backward")
        else "inference"
        if kw.get("is_inference")
        else "forward"
    )
    ops = collections.Counter(_op_name(n) for n in gm.graph.nodes if n.op == "call_function")
    out = gm.graph.find_nodes(op="output")[0].args[0]
    keys: set[str] = set()
    for n in gm.graph.nodes:
        if n.op == "call_function":
            keys.update(n.meta)
    nin = len(gm.graph.find_nodes(op="placeholder"))
    t0 = time.process_time()
    try:
        return _inner(gm, example_inputs, *a, **kw)
    finally:
        RECORDS.append(
            GraphRecord(
                role,
                len(gm.graph.nodes),
                ops,
                time.process_time() - t0,
                nin,
                len(out) if isinstance(out, list | tuple) else 1,
                frozenset(keys),
            )
        )


compile_fx._compile_fx_inner = _recording_inner  # type: ignore[assignment]


def one_step(name: str, backend: str) -> tuple[float, list[GraphRecord], dict[str, float]]:
    torch._dynamo.reset()
    t = zoo.make_trainer(name, backend)
    gc.collect()
    RECORDS.clear()
    dynamo_utils.compilation_time_metrics.clear()
    t0 = time.process_time()
    t.step()
    elapsed = time.process_time() - t0
    phases = {k: sum(v) for k, v in dynamo_utils.compilation_time_metrics.items()}
    return elapsed, list(RECORDS), phases


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", default="gpt2,resnet18")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--ops", action="store_true", help="print per-op count differences per graph")
    ap.add_argument("--meta", action="store_true", help="print node.meta keys per graph")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    backends = ["aotkit_inductor", "inductor"]
    for name in args.models.split(","):
        for b in backends:  # untimed: warms Inductor's kernel cache
            one_step(name, b)
        steps: dict[str, list[float]] = {b: [] for b in backends}
        inductor: dict[str, list[float]] = {b: [] for b in backends}
        phases: dict[str, dict[str, list[float]]] = {
            b: collections.defaultdict(list) for b in backends
        }
        per_graph: dict[str, list[list[GraphRecord]]] = {b: [] for b in backends}
        for _ in range(args.reps):
            for b in backends:
                s, recs, ph = one_step(name, b)
                steps[b].append(s)
                inductor[b].append(sum(r.seconds for r in recs))
                for k, v in ph.items():
                    phases[b][k].append(v)
                per_graph[b].append(recs)
        load = os.getloadavg()[0]
        print(f"\n== {name} (CPU s, median of {args.reps}, load {load:.1f})")
        for b in backends:
            print(
                f"  {b:16s} step {statistics.median(steps[b]):.3f}  inductor {statistics.median(inductor[b]):.3f}"
            )
        ratio = statistics.median(steps[backends[0]]) / statistics.median(steps[backends[1]])
        print(f"  first-step ratio {ratio:.3f}")
        keys = sorted(
            set(phases[backends[0]]) | set(phases[backends[1]]),
            key=lambda k: -statistics.median(phases[backends[1]].get(k, [0.0])),
        )
        print("  phase (wall s, median)                          aotkit   torch")
        for k in keys[:30]:
            a = statistics.median(phases[backends[0]].get(k, [0.0]))
            t = statistics.median(phases[backends[1]].get(k, [0.0]))
            print(f"  {k[:46]:46s} {a:8.3f} {t:8.3f}")
        last = {b: per_graph[b][-1] for b in backends}

        def graph_seconds(
            b: str, i: int, per_graph: dict[str, list[list[GraphRecord]]] = per_graph
        ) -> float:
            return statistics.median(recs[i].seconds for recs in per_graph[b] if len(recs) > i)

        for i, (ra, rt) in enumerate(zip(last[backends[0]], last[backends[1]], strict=False)):
            print(
                f"  graph {i} {ra.role}/{rt.role}: nodes {ra.nodes}/{rt.nodes} in {ra.inputs}/{rt.inputs}"
                f" out {ra.outputs}/{rt.outputs} CPU s (median) {graph_seconds(backends[0], i):.3f}"
                f"/{graph_seconds(backends[1], i):.3f}"
            )
            if args.ops:
                for op in sorted(set(ra.ops) | set(rt.ops)):
                    if ra.ops[op] != rt.ops[op]:
                        print(f"      {op:40s} {ra.ops[op]:4d} {rt.ops[op]:4d}")
            if args.meta:
                print(f"      meta aotkit only: {sorted(ra.meta_keys - rt.meta_keys)}")
                print(f"      meta torch only:  {sorted(rt.meta_keys - ra.meta_keys)}")
        if len(last[backends[0]]) != len(last[backends[1]]):
            print(f"  graph counts differ: {len(last[backends[0]])} vs {len(last[backends[1]])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where Inductor's time goes on aotkit_inductor's graphs against torch's ``inductor``.

For each model of ``zoo.py`` and each backend of the pair, a fresh ``torch.compile`` runs
one training step; every graph Inductor compiles (``_compile_fx_inner``) is recorded with
its role, node count, per-op counts and CPU time, and Inductor's own phase timers
(``torch._dynamo.utils.compilation_time_metrics``) are read per step. The two backends
alternate; each compiles once untimed first (Inductor's in-process kernel cache warms up,
as in ``zoo.py``).

With ``--phases`` the first step is split instead (CPU seconds, medians, one process,
alternating), through ``zoo.py``'s AOT-layer clock:

* ``dynamo``: dynamo's frame compiles (its start/end callbacks, trigger ``dynamo``) minus the
  backend calls inside them;
* ``aot``: the AOT layer (the backend call and the lazy backward compile, minus the graph
  compilers, as ``zoo.py`` measures it);
* ``ind fw`` / ``ind bw``: the graph compilers handed to the AOT layer, per keyword: the
  forward (and inference) compiler, plus torch's pre-grad passes; the backward compiler;
* ``rest``: the remainder: running the forward and backward, the optimizer step, and glue.

* ``dyn 1st`` (a control, inside ``dynamo``): dynamo's compile of the step's first frame
  (the zoo wrapper's ``forward``) up to its first backend call: it runs before any
  backend code of the step, so a difference there between the two contenders is not the
  step's backend work: machine noise (other processes sharing the cores and caches slow
  every instruction of this one, and the CPU clock counts it) or state left by earlier
  steps. Read the ``dynamo`` column against it. On GPT-2 (load 17, 2 repetitions)
  ``dynamo`` was 2471/2147 ms and ``dyn 1st`` 556/475: the same factor (about 1.15).

``no-aot`` is the first-step ratio aotkit/torch if both AOT layers cost nothing (the first
step minus ``aot``, per side): how much of the gap the AOT layer can explain at all.

Usage:
  uv run --group bench python tools/bench/inductor_split.py --models gpt2,resnet18 --reps 2
  uv run --group bench python tools/bench/inductor_split.py --models gpt2 --ops   # op diff
  uv run --group bench python tools/bench/inductor_split.py --phases --reps 3 --models bert
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
import contextlib  # noqa: E402
import gc  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator, Sequence  # noqa: E402
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


PHASES = ("dynamo", "aot", "ind fw", "ind bw", "rest", "dyn 1st")


# CPU time at which the current dynamo frame compile first entered the AOT layer
_FIRST_LAYER_AT: list[float | None] = [None]
_zoo_layer = zoo.AotClock.layer


@contextlib.contextmanager
def _noting_layer(self: zoo.AotClock) -> Iterator[None]:
    if _FIRST_LAYER_AT[0] is None:
        _FIRST_LAYER_AT[0] = time.process_time()
    with _zoo_layer(self):
        yield


zoo.AotClock.layer = _noting_layer  # type: ignore[method-assign]


class _DynamoClock:
    """CPU seconds inside dynamo's frame compiles (start/end callbacks, trigger dynamo)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.backend = 0.0  # zoo's AOT-layer ``outer`` inside the frames
        self.first: float | None = None  # the step's first frame compile, minus its backend
        self._t0 = 0.0
        self._outer0 = 0.0
        from torch._dynamo.callback import CallbackTrigger

        self._trigger = CallbackTrigger.DYNAMO

    def register(self) -> None:
        """After ``torch._dynamo.reset()``, which clears the callbacks."""
        from torch._dynamo.callback import callback_handler

        if self._start not in callback_handler.start_callbacks:
            callback_handler.register_start_callback(self._start)
        if self._end not in callback_handler.end_callbacks:
            callback_handler.register_end_callback(self._end)

    def _start(self, args: Any) -> None:
        if args.callback_trigger == self._trigger:
            _FIRST_LAYER_AT[0] = None
            self._t0 = time.process_time()
            self._outer0 = zoo.CLOCK.outer

    def _end(self, args: Any) -> None:
        if args.callback_trigger == self._trigger:
            spent = time.process_time() - self._t0
            backend = zoo.CLOCK.outer - self._outer0
            self.seconds += spent
            self.backend += backend
            if self.first is None:  # up to the frame's first backend call, if it made one
                entered = _FIRST_LAYER_AT[0]
                self.first = spent - backend if entered is None else entered - self._t0

    def reset(self) -> None:
        self.seconds = self.backend = 0.0
        self.first = None


def phase_step(name: str, backend: Any, dyn: _DynamoClock) -> tuple[float, dict[str, float]]:
    """One fresh first step: (seconds, phase -> seconds)."""
    torch._dynamo.reset()
    dyn.register()
    t = zoo.make_trainer(name, backend)
    gc.collect()
    zoo.CLOCK.reset()
    dyn.reset()
    t0 = time.process_time()
    t.step()
    total = time.process_time() - t0
    kinds = zoo.CLOCK.by_kind
    fw = sum(v for k, v in kinds.items() if k != "bw_compiler")
    bw = kinds.get("bw_compiler", 0.0)
    phases = {
        "dynamo": dyn.seconds - dyn.backend,
        "aot": zoo.CLOCK.aot_seconds,
        "ind fw": fw,
        "ind bw": bw,
    }
    phases["rest"] = total - sum(phases.values())
    # See the module docstring: the control, not part of the sum
    phases["dyn 1st"] = dyn.first or 0.0
    return total, phases


def phases_main(models: list[str], reps: int, json_path: str | None) -> int:
    import json

    zoo.clock = time.process_time
    backends = zoo.make_backends()
    pair = ("aotkit_inductor", "inductor")
    dyn = _DynamoClock()
    results: dict[str, Any] = {}
    print(
        f"first step split, CPU ms, median of {reps} (one process, alternating);"
        " ratios aotkit/torch"
    )
    header = "  ".join(f"{p:>13s}" for p in ("total", *PHASES))
    print(f"{'model':18s} {'load':>5s}  {header}  {'ratio':>6s} {'no-aot':>6s}")
    for name in models:
        for b in pair:  # untimed: Inductor's kernel cache, lazy imports
            phase_step(name, backends[b], dyn)
        totals: dict[str, list[float]] = {b: [] for b in pair}
        split: dict[str, dict[str, list[float]]] = {b: {p: [] for p in PHASES} for b in pair}
        load = os.getloadavg()[0]
        for rep in range(reps):
            for b in pair if rep % 2 == 0 else pair[::-1]:
                total, ph = phase_step(name, backends[b], dyn)
                totals[b].append(total)
                for p in PHASES:
                    split[b][p].append(ph[p])
        med = {b: statistics.median(totals[b]) for b in pair}
        mph = {b: {p: statistics.median(split[b][p]) for p in PHASES} for b in pair}
        ratio = statistics.median(
            a / t for a, t in zip(totals[pair[0]], totals[pair[1]], strict=True)
        )
        no_aot = statistics.median(
            (a - aa) / (t - ta)
            for a, aa, t, ta in zip(
                totals[pair[0]],
                split[pair[0]]["aot"],
                totals[pair[1]],
                split[pair[1]]["aot"],
                strict=True,
            )
        )
        cells = "  ".join(
            f"{med[pair[0]] * 1e3:6.0f}/{med[pair[1]] * 1e3:<6.0f}"
            if p == "total"
            else f"{mph[pair[0]][p] * 1e3:6.0f}/{mph[pair[1]][p] * 1e3:<6.0f}"
            for p in ("total", *PHASES)
        )
        print(f"{name:18s} {load:5.1f}  {cells}  {ratio:6.3f} {no_aot:6.3f}", flush=True)
        results[name] = {
            "load": load,
            "totals": totals,
            "phases": split,
            "ratio": ratio,
            "ratio_without_aot": no_aot,
        }
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", default="gpt2,resnet18")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--ops", action="store_true", help="print per-op count differences per graph")
    ap.add_argument("--meta", action="store_true", help="print node.meta keys per graph")
    ap.add_argument("--phases", action="store_true", help="split the first step into phases")
    ap.add_argument("--json", default=None, help="with --phases: write the samples to FILE")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.phases:
        return phases_main(args.models.split(","), args.reps, args.json)
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

"""Where the AOT layer's time goes, phase by phase: aotkit_eager against torch's aot_eager.

For each model of ``zoo.py`` and each contender, a fresh first step is compiled (as in
``zoo.py``'s first-step measurement) and the AOT layer (``zoo.py``'s clock: backend call
plus lazy backward compile, minus the graph compilers) is split into:

* ``fwd N``: each run of dynamo's graph with ``torch.fx.Interpreter`` (aotkit's single pass
  runs it once; torch runs it twice, in the metadata pass and again in the joint trace);
* ``bwd``: ``torch.autograd.grad`` (the backward half of the joint trace);
* ``rest``: everything else (fakification, make_fx set-up, the partitioner, wrappers).

Next to each phase, FakeTensorMode's dispatch cache counters within it: hits, misses and
bypasses (``h/m/b``). A miss runs the op's fake kernel (and, for an op torch decomposes,
every op of the decomposition, each a dispatch of its own); a hit builds the output from the
cache entry. See the zoo note for what the counters showed.

Usage:
  uv run --group bench python tools/bench/aot_phases.py --models bert,micro_convnet --reps 3
Times are ``time.process_time`` (CPU time of this process), medians over the repetitions;
the two contenders alternate within every repetition.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo  # noqa: E402

CONTENDERS = ("aotkit_eager", "aot_eager")


class Phases:
    """Per-phase CPU seconds and fake-tensor cache counters inside the AOT layer."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.cache: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
        self.stack: list[str] = []
        self.n_forward = 0

    @staticmethod
    def _counters() -> tuple[int, int, int]:
        return (
            FakeTensorMode.cache_hits,
            FakeTensorMode.cache_misses,
            sum(FakeTensorMode.cache_bypasses.values()),
        )

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if zoo.CLOCK.depth == 0 or self.stack:  # outside the layer, or nested in a phase
            yield
            return
        self.stack.append(name)
        c0, t0 = self._counters(), time.process_time()
        try:
            yield
        finally:
            self.seconds[name] += time.process_time() - t0
            for k, (a, b) in enumerate(zip(self._counters(), c0, strict=True)):
                self.cache[name][k] += a - b
            self.stack.pop()

    def forward_name(self) -> str:
        if zoo.CLOCK.depth == 0 or self.stack:
            return ""
        self.n_forward += 1
        return f"fwd {self.n_forward}"


PHASES = Phases()


def _install() -> None:
    run = torch.fx.Interpreter.run
    grad = torch.autograd.grad

    @functools.wraps(run)
    def timed_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with PHASES.phase(PHASES.forward_name() or "-"):
            return run(self, *args, **kwargs)

    @functools.wraps(grad)
    def timed_grad(*args: Any, **kwargs: Any) -> Any:
        with PHASES.phase("bwd"):
            return grad(*args, **kwargs)

    torch.fx.Interpreter.run = timed_run  # type: ignore[method-assign]
    torch.autograd.grad = timed_grad


def measure(
    name: str, backends: dict[str, Callable[..., Any] | str], reps: int
) -> dict[str, dict[str, list[float]]]:
    """contender -> phase -> CPU seconds per repetition (``layer`` is the whole layer;
    ``cache <phase>`` entries hold (hits, misses, bypasses) of the last repetition)."""
    out: dict[str, dict[str, list[Any]]] = {c: collections.defaultdict(list) for c in CONTENDERS}
    for c in CONTENDERS:  # untimed: imports, first compiles of the kernels' code paths
        zoo.first_step(name, backends[c])
    for rep in range(reps):
        for c in CONTENDERS if rep % 2 == 0 else CONTENDERS[::-1]:
            PHASES.seconds.clear()
            PHASES.cache.clear()
            PHASES.n_forward = 0
            _, layer = zoo.first_step(name, backends[c])
            out[c]["layer"].append(layer)
            phased = sum(PHASES.seconds.values())
            out[c]["rest"].append(layer - phased)
            for k, v in PHASES.seconds.items():
                out[c][k].append(v)
                out[c]["cache " + k] = [tuple(PHASES.cache[k])]
    return out


def report(name: str, res: dict[str, dict[str, list[Any]]]) -> None:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\n{name} (load {load:.1f}), CPU ms, medians; fake-tensor cache h/m/b per phase")
    phases = sorted(
        {k for r in res.values() for k in r if not k.startswith("cache ")} - {"layer", "rest"}
    )
    cols = ["layer", *phases, "rest"]
    print(f"{'':14s}" + "".join(f"{c:>20s}" for c in cols))
    for c, r in res.items():
        cells = []
        for col in cols:
            if col not in r:
                cells.append(f"{'-':>20s}")
                continue
            ms = statistics.median(r[col]) * 1e3
            cache = r.get("cache " + col)
            hmb = "/".join(str(x) for x in cache[0]) if cache else ""
            cells.append(f"{ms:8.1f} {hmb:>11s}")
        print(f"{c:14s}" + "".join(cells))
    ours, theirs = (statistics.median(res[c]["layer"]) for c in CONTENDERS)
    print(f"layer ratio {ours / theirs:.2f}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--models", default="bert", help=f"comma-separated subset of {','.join(zoo.MODELS)}"
    )
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    zoo.clock = time.process_time  # zoo's AOT-layer and first-step clock
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    backends = zoo.make_backends()
    _install()
    for name in args.models.split(","):
        report(name, measure(name, backends, args.reps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

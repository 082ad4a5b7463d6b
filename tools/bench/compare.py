"""Side-by-side benchmark: torch's AOTAutograd vs aotkit, both with the ``nop`` compiler.

Runs in one process with ``torch.set_num_threads(1)``. Contenders take turns within every
repetition (eager, torch, aotkit, eager, torch, aotkit, ...), so slow drifts of a noisy
machine hit all of them alike. Absolute figures are medians over repetitions; every ratio
is the median of the per-repetition (paired) ratios, which is more robust to drift than the
ratio of two medians, so a ratio can differ slightly from the quotient of the printed
medians. ``noise`` is the largest interquartile range / median among the contenders.

Measured, per model (mlp, transformer, convnet, pointwise):

* first-call latency: a FRESH wrapper (new ``aot_module``/``aot_function``) per repetition,
  timing its first forward + backward (trace, partition, compile, run). One untimed first
  call per contender runs before, so lazy imports and process-wide one-time set-up are not
  counted; neither torch's nor aotkit's ``aot_function`` keeps a global compile cache.
  The garbage collector stays enabled here (compilation allocates: that is real cost).
* steady state: forward + backward step time after warm-up, for eager, torch and aotkit,
  with the garbage collector disabled inside the timed loop. On this machine the speed of
  the same matmul kernel depends on where its buffers land in memory (the same MLP step
  varies by up to 25% from one process to the next, for eager and compiled code alike), so
  the full run rebuilds the model a few times ("placements": fresh parameters at new
  addresses, compiled again) and pools the paired repetitions of all placements.

And for the tiny function ``x.sin() + 1`` on 10 elements, the per-call cost for
forward + backward (``y.backward(ones)``) and for inference (input without grad), each with
its own compiled object (torch's ``aot_function`` reuses its first graph for any input).

Usage: python tools/bench/compare.py [--quick] [--models mlp,pointwise] [--no-tiny]
Benchmarks are not tests: the exit status is 0 whether targets pass or miss.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aotkit_backends
import aotkit_frontends
import torch
import torch.nn as nn
import torch.nn.functional as F

Impl = Literal["eager", "torch", "aotkit"]
COMPILED: tuple[Impl, Impl] = ("torch", "aotkit")
ALL_IMPLS: tuple[Impl, Impl, Impl] = ("eager", "torch", "aotkit")

# time.perf_counter (wall) by default; --clock cpu switches to time.process_time, which on a
# machine shared with other jobs does not count the time this process spends descheduled
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
clock: Callable[[], float] = time.perf_counter


# --------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """One benchmark model: what ``aot_*`` compiles, its inputs, and its gradient leaves."""

    name: str
    # an nn.Module goes through aot_module, a plain function through aot_function
    target: nn.Module | Callable[..., torch.Tensor]
    inputs: tuple[torch.Tensor, ...]
    # tensors whose .grad a training step resets to None: parameters or grad-requiring inputs
    grad_leaves: tuple[torch.Tensor, ...]


def _module_workload(name: str, mod: nn.Module, *inputs: torch.Tensor) -> Workload:
    return Workload(name, mod.train(), inputs, tuple(mod.parameters()))


def build_mlp() -> Workload:
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(512, 512), nn.GELU()]
    return _module_workload("mlp", nn.Sequential(*layers), torch.randn(64, 512))


def build_transformer() -> Workload:
    layer = nn.TransformerEncoderLayer(256, 4, dim_feedforward=512, dropout=0.0, batch_first=True)
    return _module_workload("transformer", layer, torch.randn(8, 128, 256))


def build_convnet() -> Workload:
    blocks: list[nn.Module] = []
    for cin, cout in ((3, 16), (16, 32), (32, 64)):
        blocks += [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]
    return _module_workload("convnet", nn.Sequential(*blocks), torch.randn(8, 3, 32, 32))


def pointwise_chain(x: torch.Tensor) -> torch.Tensor:
    for _ in range(24):
        x = F.gelu(x) * x.sigmoid() + x.cos()
    return x


def build_pointwise() -> Workload:
    # scaled so that the chain converges instead of overflowing (values stay near 1)
    x = (torch.randn(256, 256) * 0.5).requires_grad_()
    return Workload("pointwise", pointwise_chain, (x,), (x,))


MODELS: dict[str, Callable[[], Workload]] = {
    "mlp": build_mlp,
    "transformer": build_transformer,
    "convnet": build_convnet,
    "pointwise": build_pointwise,
}


def tiny(x: torch.Tensor) -> torch.Tensor:
    return x.sin() + 1


def compile_with(impl: Impl, target: nn.Module | Callable[..., Any]) -> Callable[..., Any]:
    """A fresh compiled wrapper of ``target`` (``target`` itself for eager)."""
    if impl == "eager":
        return target
    # torch's AOTAutograd imports torch._dynamo: imported only when asked for, so that
    # cache.py's plain-process runs can build these models without it
    import torch._functorch.aot_autograd as torch_aot
    from torch._functorch.compilers import nop as torch_nop

    if isinstance(target, nn.Module):
        if impl == "torch":
            return torch_aot.aot_module(target, torch_nop)
        return aotkit_frontends.aot_module(target, aotkit_backends.nop)
    if impl == "torch":
        return torch_aot.aot_function(target, torch_nop)
    return aotkit_frontends.aot_function(target, aotkit_backends.nop)


def make_step(fn: Callable[..., Any], w: Workload) -> Callable[[], None]:
    """One training step: reset grads, forward, ``sum().backward()``."""
    inputs, leaves = w.inputs, w.grad_leaves

    def step() -> None:
        for t in leaves:
            t.grad = None
        fn(*inputs).sum().backward()

    return step


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------


def time_loop(fn: Callable[[], object], n: int) -> float:
    """Seconds per call of ``fn`` over ``n`` back-to-back calls, GC off."""
    gc.collect()
    gc.disable()
    try:
        t0 = clock()
        for _ in range(n):
            fn()
        return (clock() - t0) / n
    finally:
        gc.enable()


def calibrate(fns: Sequence[Callable[[], object]], block_s: float, max_n: int) -> int:
    """Calls per timed block so that the slowest contender's block takes about ``block_s``."""
    per_call = 0.0
    for fn in fns:
        n = 1
        while True:
            t = time_loop(fn, n) * n
            if t > 0.02 or n >= max_n:
                break
            n *= 4
        per_call = max(per_call, t / n)
    return max(1, min(max_n, round(block_s / per_call)))


@dataclass
class Samples:
    """Per-repetition seconds of each contender; lists are index-aligned by repetition."""

    times: dict[str, list[float]]

    def median(self, impl: str) -> float:
        return statistics.median(self.times[impl])

    def ratio(self, num: str, den: str) -> float:
        return statistics.median(
            a / b for a, b in zip(self.times[num], self.times[den], strict=True)
        )

    def overhead_ratio(self, num: str, den: str, base: str) -> float:
        """Median over repetitions of (num - base) / (den - base)."""
        vals = []
        for a, b, e in zip(self.times[num], self.times[den], self.times[base], strict=True):
            vals.append((a - e) / (b - e) if b > e else float("nan"))
        return statistics.median(vals)

    def noise(self) -> str:
        """Largest interquartile range / median among the contenders ("-" under 4 reps)."""
        if min(len(ts) for ts in self.times.values()) < 4:
            return "-"
        worst = 0.0
        for ts in self.times.values():
            q = statistics.quantiles(ts, n=4)
            worst = max(worst, (q[2] - q[0]) / statistics.median(ts))
        return f"{worst:.0%}"


def looped(fn: Callable[[], object], n: int) -> Callable[[], float]:
    """A measurement: seconds per call of ``fn`` over one block of ``n`` calls."""
    return lambda: time_loop(fn, n)


def interleave(contenders: dict[str, Callable[[], float]], reps: int) -> Samples:
    """Run each contender's measurement once per repetition, taking turns."""
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(reps):
        for name, measure in contenders.items():
            times[name].append(measure())
    return Samples(times)


def first_call_seconds(impl: Impl, w: Workload) -> float:
    """Build a fresh wrapper and time its first forward + backward."""
    for t in w.grad_leaves:
        t.grad = None
    gc.collect()
    t0 = clock()
    fn = compile_with(impl, w.target)
    fn(*w.inputs).sum().backward()
    elapsed = clock() - t0
    del fn
    return elapsed


# --------------------------------------------------------------------------------------
# Sanity check: do not benchmark a wrong answer
# --------------------------------------------------------------------------------------


def check_matches_eager(w: Workload) -> list[str]:
    problems: list[str] = []
    results: dict[str, tuple[torch.Tensor, list[torch.Tensor | None]]] = {}
    for impl in ALL_IMPLS:
        for t in w.grad_leaves:
            t.grad = None
        torch.manual_seed(0)
        out = compile_with(impl, w.target)(*w.inputs)
        out.sum().backward()
        results[impl] = (out.detach(), [t.grad for t in w.grad_leaves])
    ref_out, ref_grads = results["eager"]
    for impl in COMPILED:
        out, grads = results[impl]
        ok = torch.allclose(out, ref_out, rtol=1e-4, atol=1e-4) and all(
            (g is None and r is None)
            or (g is not None and r is not None and torch.allclose(g, r, rtol=1e-3, atol=1e-4))
            for g, r in zip(grads, ref_grads, strict=True)
        )
        if not ok:
            problems.append(f"{w.name}: {impl} output/gradients differ from eager")
    for t in w.grad_leaves:
        t.grad = None
    return problems


# --------------------------------------------------------------------------------------
# Benchmarks
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    first_reps: int
    steady_reps: int  # per placement
    steady_placements: int
    steady_block_s: float
    tiny_reps: int
    tiny_block_s: float


FULL = Settings(
    first_reps=7, steady_reps=3, steady_placements=4, steady_block_s=0.25, tiny_reps=15,
    tiny_block_s=0.1,
)
QUICK = Settings(
    first_reps=3, steady_reps=3, steady_placements=1, steady_block_s=0.05, tiny_reps=5,
    tiny_block_s=0.03,
)


def bench_first_call(w: Workload, s: Settings) -> Samples:
    for impl in COMPILED:  # untimed: lazy imports, one-time set-up
        first_call_seconds(impl, w)
    return interleave({impl: _first_call_measure(impl, w) for impl in COMPILED}, s.first_reps)


def _first_call_measure(impl: Impl, w: Workload) -> Callable[[], float]:
    return lambda: first_call_seconds(impl, w)


def bench_steady(build: Callable[[], Workload], s: Settings) -> tuple[Samples, int]:
    """Paired repetitions pooled over ``s.steady_placements`` fresh builds of the model
    (see the module docstring); ``n`` steps per block, calibrated on the first build."""
    times: dict[str, list[float]] = {impl: [] for impl in ALL_IMPLS}
    n = 0
    for placement in range(s.steady_placements):
        torch.manual_seed(placement)
        w = build()
        steps = {impl: make_step(compile_with(impl, w.target), w) for impl in ALL_IMPLS}
        for step in steps.values():
            for _ in range(3):
                step()
        if not n:
            n = calibrate(list(steps.values()), s.steady_block_s, max_n=10_000)
        samples = interleave({k: looped(f, n) for k, f in steps.items()}, s.steady_reps)
        for impl in ALL_IMPLS:
            times[impl] += samples.times[impl]
    return Samples(times), n


def make_tiny_call(fn: Callable[..., Any], x: torch.Tensor, train: bool) -> Callable[[], None]:
    ones = torch.ones_like(x)

    def train_call() -> None:
        fn(x).backward(ones)

    def inference_call() -> None:
        fn(x)

    return train_call if train else inference_call


def bench_tiny(s: Settings) -> dict[str, tuple[Samples, int]]:
    out: dict[str, tuple[Samples, int]] = {}
    for mode in ("fwd+bwd", "inference"):
        train = mode == "fwd+bwd"
        x = torch.randn(10, requires_grad=train)
        # a separate compiled object per mode: torch's aot_function reuses its first graph
        calls = {impl: make_tiny_call(compile_with(impl, tiny), x, train) for impl in ALL_IMPLS}
        for call in calls.values():
            for _ in range(20):
                call()
        n = calibrate(list(calls.values()), s.tiny_block_s, max_n=200_000)
        samples = interleave({k: looped(f, n) for k, f in calls.items()}, s.tiny_reps)
        out[mode] = (samples, n)
    return out


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def _fmt(seconds: float, unit: str) -> str:
    scale = {"ms": 1e3, "us": 1e6}[unit]
    return f"{seconds * scale:10.3f}"


def _three_way(stats: Any, unit: str) -> list[str]:
    """eager/torch/aotkit medians and the three ratios between them, as table cells."""
    return [
        _fmt(stats.median("eager"), unit),
        _fmt(stats.median("torch"), unit),
        _fmt(stats.median("aotkit"), unit),
        f"{stats.ratio('aotkit', 'torch'):.3f}",
        f"{stats.ratio('aotkit', 'eager'):.3f}",
        f"{stats.ratio('torch', 'eager'):.3f}",
    ]


def _table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(f"\n== {title} ==")
    print(
        "  ".join(
            h.rjust(wd) if i else h.ljust(wd)
            for i, (h, wd) in enumerate(zip(header, widths, strict=True))
        )
    )
    for r in rows:
        print(
            "  ".join(
                c.rjust(wd) if i else c.ljust(wd)
                for i, (c, wd) in enumerate(zip(r, widths, strict=True))
            )
        )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, for a smoke run")
    ap.add_argument(
        "--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}"
    )
    ap.add_argument(
        "--no-tiny", action="store_true", help="skip the tiny-function per-call benchmark"
    )
    ap.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall: time.perf_counter (default); cpu: time.process_time, for a busy machine",
    )
    args = ap.parse_args(argv)
    global clock
    clock = CLOCKS[args.clock]
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    s = QUICK if args.quick else FULL

    torch.set_num_threads(1)
    torch.manual_seed(0)
    started = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"{time.perf_counter() - started:6.1f}s {msg} ...", file=sys.stderr, flush=True)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"torch {torch.__version__}, threads={torch.get_num_threads()}, python {sys.version.split()[0]}, "
        f"{'quick' if args.quick else 'full'} run, clock={args.clock}, load average at start {load:.2f}"
    )

    first_rows: list[list[str]] = []
    steady_rows: list[list[str]] = []
    targets: list[
        tuple[str, float, float]
    ] = []  # (label, value, threshold): PASS if value <= threshold
    problems: list[str] = []
    for name in names:
        torch.manual_seed(0)
        w = MODELS[name]()
        progress(f"[{name}] sanity check, first call")
        problems += check_matches_eager(w)
        fc = bench_first_call(w, s)
        first_rows.append(
            [
                name,
                _fmt(fc.median("torch"), "ms"),
                _fmt(fc.median("aotkit"), "ms"),
                f"{fc.ratio('aotkit', 'torch'):.3f}",
                fc.noise(),
            ]
        )
        targets.append((f"first call {name}: aotkit/torch", fc.ratio("aotkit", "torch"), 0.5))
        progress(f"[{name}] steady state")
        st, n = bench_steady(MODELS[name], s)
        steady_rows.append(
            [name, *_three_way(st, "ms"), str(n), st.noise()]
        )
        if name in ("mlp", "transformer"):
            targets.append((f"steady step {name}: aotkit/eager", st.ratio("aotkit", "eager"), 1.03))

    tiny_rows: list[list[str]] = []
    if not args.no_tiny:
        progress("[tiny] per call")
        for mode, (ts, n) in bench_tiny(s).items():
            tiny_rows.append(
                [
                    mode,
                    *_three_way(ts, "us"),
                    f"{ts.overhead_ratio('aotkit', 'torch', 'eager'):.3f}",
                    str(n),
                    ts.noise(),
                ]
            )
            if mode == "fwd+bwd":
                targets.append(
                    (
                        "tiny fwd+bwd: aotkit overhead / torch overhead",
                        ts.overhead_ratio("aotkit", "torch", "eager"),
                        0.25,
                    )
                )
            else:
                targets.append(("tiny inference: aotkit/eager", ts.ratio("aotkit", "eager"), 1.8))

    if first_rows:
        _table(
            f"first-call latency: fresh wrapper, trace + partition + compile + fwd + bwd (median of {s.first_reps})",
            ["model", "torch ms", "aotkit ms", "aotkit/torch", "noise"],
            first_rows,
        )
        _table(
            f"steady-state fwd+bwd step (median of {s.steady_reps * s.steady_placements} "
            f"blocks of n steps, {s.steady_placements} placements)",
            [
                "model",
                "eager ms",
                "torch ms",
                "aotkit ms",
                "aotkit/torch",
                "aotkit/eager",
                "torch/eager",
                "n",
                "noise",
            ],
            steady_rows,
        )
    if tiny_rows:
        _table(
            f"tiny x.sin() + 1 on 10 elements, per call (median of {s.tiny_reps} blocks of n calls)",
            [
                "mode",
                "eager us",
                "torch us",
                "aotkit us",
                "aotkit/torch",
                "aotkit/eager",
                "torch/eager",
                "ovh aotkit/torch",
                "n",
                "noise",
            ],
            tiny_rows,
        )
        print(
            "ovh aotkit/torch = (aotkit - eager) / (torch - eager): aotkit's overhead over eager relative to torch's"
        )

    print("\n== targets ==")
    width = max((len(t[0]) for t in targets), default=0)
    for label, value, threshold in targets:
        verdict = "PASS" if value <= threshold else "MISS"
        print(f"{label.ljust(width)}  {value:7.3f} <= {threshold:<5}  {verdict}")
    for p in problems:
        print(f"WARNING: {p}")
    print(
        f"\n(total {time.perf_counter() - started:.0f} s; ratios are medians of per-repetition paired ratios)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

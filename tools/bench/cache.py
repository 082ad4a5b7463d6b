"""On-disk compile cache: first-call time of a fresh process, cold cache against warm.

Three measurements, each in fresh processes (``python cache.py --child ...``), so process
start is outside the timed region and nothing of an earlier compilation survives in
memory; ``aot`` and ``compile`` import torch's AOTAutograd (and with it ``torch._dynamo``)
before they time, ``plain`` does not:

* ``aot``: for each model of ``compare.py`` (mlp, transformer, convnet, pointwise),
  ``aot_module``/``aot_function`` with aotkit's ``nop`` and ``AOTKIT_CACHE=1``. A cold run
  uses an empty cache directory, a warm run the directory the cold run filled; an eager
  run (the model itself, no aotkit) in the same fresh-process shape takes its turn with
  them. Reported: the first forward + backward, and the AOT part of it, for BOTH cold and
  warm: first call minus the median of seven later calls (which run the same compiled
  code), minus eager PyTorch's own first-call extra (the eager run's first call minus its
  later ones: first kernel calls, the autograd engine's first run, lazy imports), which
  is not aotkit's work. The raw ratio (without that subtraction) is printed too. And
  ``inside``: the CPU time spent inside aotkit's own compilation work of the first call,
  timed directly around it (the frontend's lookup and compile of the forward, which holds
  the key, the restore or trace and the forward compiler; the lazy backward compile; the
  backward's stealing entry), so no kernel time is in it. The subtraction above leaves
  the difference of two noisy step times in the AOT part (on convnet, steps vary by 5-10
  ms from process to process against a warm AOT part of 10-20 ms); ``inside`` does not.
  Target: warm AOT part <= 0.1x cold.
* ``plain``: the same ``aot_module``/``aot_function`` + ``nop`` programs in a process
  that imported only torch, aotkit and the model (no ``torch._dynamo``, no sympy, as a
  script using aotkit without torch.compile), cold against warm: the CPU time of the
  first forward + backward including whatever it imports on the way (a cold compile's
  fake tensors import ``torch._dynamo``, about a second; a warm hit of nop imports
  nothing: See Note [A restored entry's fake mode made when first needed] in
  aotkit_cache). Also reported: whether the warm processes imported ``torch._dynamo``.
* ``compile``: end to end, ``torch.compile(model)`` first forward + backward, with
  ``backend="aotkit_inductor"`` (aotkit's disk cache + Inductor's FX graph cache) against
  torch's ``backend="inductor"`` with its FX graph cache and AOTAutogradCache on. Cold:
  empty cache directories (aotkit's and Inductor's); warm: the directories the cold run
  filled. Target: aotkit_inductor warm <= torch warm. Every ``compare.py`` model by
  default (``--compile-models``); each warm process reports what it compiled (aotkit's
  cache counters, Inductor's FX-graph-cache hits and code generations), and a warm
  aotkit_inductor run that traced or generated code is flagged. ``--profile DIR`` runs
  the warm processes under cProfile (``DIR/<backend>-<model>-<n>.prof``).

Processes take turns (cold, warm, cold, warm, ...), medians over ``--reps``. In the
compile part, each backend gets a cold process per ``--compile-reps``, then ``--warm-reps``
warm processes each, the two backends alternating. The machine may be loaded: read
ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _child(kind: str, model: str) -> dict[str, Any]:
    profile = os.environ.get("AOTKIT_BENCH_PROFILE")
    if not profile:
        return _child_run(kind, model)
    import cProfile

    prof = cProfile.Profile()
    result = prof.runcall(_child_run, kind, model)
    prof.dump_stats(profile)
    return result


def _child_run(kind: str, model: str) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    import torch
    from compare import MODELS

    if kind != "plain":
        # what compare.py imported at its top until session 20 (torch's AOTAutograd, and
        # with it torch._dynamo and sympy): imports stay out of the timed region
        import torch._functorch.aot_autograd  # noqa: F401
    torch.manual_seed(0)
    torch.set_num_threads(1)
    w = MODELS[model]()
    if kind == "eager":

        def build() -> Any:
            return w.target

    elif kind in ("aot", "plain"):
        import aotkit_backends
        import aotkit_frontends

        inside = _time_inside_aotkit()

        def build() -> Any:
            if isinstance(w.target, torch.nn.Module):
                return aotkit_frontends.aot_module(w.target, aotkit_backends.nop)
            return aotkit_frontends.aot_function(w.target, aotkit_backends.nop)

    else:
        import aotkit  # noqa: F401  (registers the backends)
        import torch._inductor.compile_fx as compile_fx

        codegens = [0]
        real_codegen = compile_fx.fx_codegen_and_compile

        def counted_codegen(*args: Any, **kwargs: Any) -> Any:
            codegens[0] += 1
            return real_codegen(*args, **kwargs)

        compile_fx.fx_codegen_and_compile = counted_codegen  # Inductor generating code

        backend = "aotkit_inductor" if kind == "aotkit_inductor" else "inductor"

        def build() -> Any:
            return torch.compile(w.target, backend=backend)

    # the aot part is timed in CPU time of this process (the machine is shared: wall time
    # there counts the time other processes held the cores); torch.compile end to end in
    # wall time, since Inductor compiles in worker processes
    clock = time.process_time if kind in ("aot", "plain", "eager") else time.perf_counter

    def step(fn: Any) -> float:
        for t in w.grad_leaves:
            t.grad = None
        t0 = clock()
        fn(*w.inputs).sum().backward()
        return clock() - t0

    t0, c0 = clock(), time.process_time()
    fn = build()
    first = clock() - t0 + step(fn)
    first_cpu = time.process_time() - c0
    # seven: a convnet step moves by 5-10 ms from process to process and within one, and
    # the AOT part is the difference of two step times
    later = statistics.median(step(fn) for _ in range(7))
    result: dict[str, Any] = {"first": first, "later": later, "first_cpu": first_cpu}
    if kind in ("aot", "plain"):
        from aotkit_cache import cache_counters

        result["counters"] = dict(cache_counters)
        result["inside"] = inside[0]
        result["dynamo"] = "torch._dynamo" in sys.modules
    elif kind != "eager":
        from aotkit_cache import cache_counters
        from torch._dynamo.utils import counters

        result["counters"] = dict(cache_counters)
        result["inductor"] = {
            "codegen": codegens[0],
            **{k: v for k, v in counters["inductor"].items() if "cache" in k},
            **{f"aotautograd_{k}": v for k, v in counters["aot_autograd"].items() if "cache" in k},
        }
    return result


def _time_inside_aotkit() -> list[float]:
    """CPU time spent inside aotkit's compilation of the first call (``[seconds]``, grows
    as it runs): the frontend's lookup-and-compile of the forward (the cache key, the
    restore or the trace, partitioner, the forward compiler, the runtime wrappers), the
    lazy backward compile, and the backward's stealing entry. Timed directly, so
    the kernels' run times (and their first-call costs) are not in it."""
    import aotkit_capture.compile._compiled_calls as calls
    import aotkit_runtime._autograd_function as runtime_fn
    from aotkit_frontends._aot_function import CompiledCache

    spent = [0.0]

    def timed(fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.process_time() - t0

        return run

    real_backward_compiler = calls._backward_compiler
    calls._backward_compiler = lambda *a, **k: timed(real_backward_compiler(*a, **k))
    runtime_fn._backward_caller = timed(runtime_fn._backward_caller)  # type: ignore[assignment]
    CompiledCache._lookup = timed(CompiledCache._lookup)  # type: ignore[method-assign]
    return spent


def _run(kind: str, model: str, env: dict[str, str], profile: str | None = None) -> dict[str, Any]:
    more = {"AOTKIT_BENCH_PROFILE": profile} if profile else {}
    proc = subprocess.run(
        [sys.executable, __file__, "--child", kind, model],
        env={**os.environ, **env, **more},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} {model} failed:\n{proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _cold_warm(
    kind: str, model: str, reps: int, with_eager: bool = True
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    cold, warm, eager = [], [], []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as d:
            env = {
                "AOTKIT_CACHE": "1",
                "AOTKIT_CACHE_DIR": os.path.join(d, "aotkit"),
                "TORCHINDUCTOR_CACHE_DIR": os.path.join(d, "inductor"),
                "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
                "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
            }
            cold.append(_run(kind, model, env))
            warm.append(_run(kind, model, env))
            if with_eager:
                eager.append(_run("eager", model, env))
    return cold, warm, eager


def _compile_cold_warm(
    kinds: list[str], model: str, reps: int, warm_reps: int, profile: str | None = None
) -> dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """Per rep: a cold process per backend (fresh cache directories), then ``warm_reps``
    warm processes per backend, the backends taking turns, so load drifts hit both alike."""
    out: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {k: ([], []) for k in kinds}
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as d:
            envs = {
                k: {
                    "AOTKIT_CACHE": "1",
                    "AOTKIT_CACHE_DIR": os.path.join(d, k, "aotkit"),
                    "TORCHINDUCTOR_CACHE_DIR": os.path.join(d, k, "inductor"),
                    "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
                    "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
                }
                for k in kinds
            }
            for k in kinds:
                out[k][0].append(_run(k, model, envs[k]))
            for i in range(warm_reps):
                for k in kinds if i % 2 == 0 else kinds[::-1]:
                    prof = None
                    if profile:
                        prof = os.path.join(profile, f"{k}-{model}-{len(out[k][1])}.prof")
                    out[k][1].append(_run(k, model, envs[k], prof))
    return out


def _plain(models: list[str], reps: int) -> None:
    """The ``plain`` part: see the module docstring."""
    print("\nplain process (torch and aotkit imported, nothing else): first forward+backward "
          "CPU seconds, the imports it triggers included")
    print(f"{'model':<12} {'cold':>8} {'warm':>8} {'ratio':>8}  warm imported torch._dynamo")
    for model in models:
        cold, warm, _ = _cold_warm("plain", model, reps, with_eager=False)
        if any("hit" not in r["counters"] or "trace" in r["counters"] for r in warm):
            print(f"  warning: {model} warm run traced: {[r['counters'] for r in warm]}")
        c, w = _med(cold, "first"), _med(warm, "first")
        dynamo = sorted({r["dynamo"] for r in warm})
        print(f"{model:<12} {c:>8.3f} {w:>8.3f} {w / c:>8.3f}  {dynamo}")


def _med(runs: list[dict[str, Any]], field: str) -> float:
    return statistics.median(r[field] for r in runs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--child", nargs=2, metavar=("KIND", "MODEL"), help=argparse.SUPPRESS)
    ap.add_argument("--models", default="mlp,transformer,convnet,pointwise")
    ap.add_argument(
        "--compile-models", "--compile-model", dest="compile_models",
        default="mlp,transformer,convnet,pointwise",
        help="comma-separated models for the torch.compile part",
    )
    ap.add_argument("--profile", metavar="DIR", help="cProfile the warm compile processes")
    ap.add_argument("--reps", type=int, default=3, help="cold/warm pairs per model (aot part)")
    ap.add_argument("--compile-reps", type=int, default=1, help="cold runs per backend (compile part)")
    ap.add_argument("--warm-reps", type=int, default=3, help="warm runs per cold run and backend")
    ap.add_argument("--skip-compile", action="store_true")
    ap.add_argument("--skip-aot", action="store_true")
    ap.add_argument("--skip-plain", action="store_true")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(*args.child)))
        return 0

    print("aot_module/aot_function + nop, fresh process, first forward+backward (CPU seconds)")
    print("AOT part = first call - median of later calls - eager PyTorch's own first-call "
          "extra ('eager 1st', same process shape), for cold and warm alike")
    print("inside = CPU time inside aotkit's own compilation (lookup/restore or trace, "
          "forward and backward compilers, wrappers), timed directly; its ratio warm/cold")
    print(f"{'model':<12} {'cold':>8} {'warm':>8} {'eager 1st':>9} {'cold AOT':>9} "
          f"{'warm AOT':>9} {'AOT ratio':>9} {'raw ratio':>9} {'cold in':>8} {'warm in':>8} "
          f"{'in ratio':>8}")
    for model in [] if args.skip_aot else args.models.split(","):
        cold, warm, eager = _cold_warm("aot", model, args.reps)
        if any("hit" not in r["counters"] or "trace" in r["counters"] for r in warm):
            print(f"  warning: {model} warm run traced: {[r['counters'] for r in warm]}")
        e_first = statistics.median(r["first"] - r["later"] for r in eager)
        c_raw = statistics.median(r["first"] - r["later"] for r in cold)
        w_raw = statistics.median(r["first"] - r["later"] for r in warm)
        c_aot, w_aot = c_raw - e_first, w_raw - e_first
        print(
            f"{model:<12} {_med(cold, 'first'):>8.3f} {_med(warm, 'first'):>8.3f} "
            f"{e_first:>9.3f} {c_aot:>9.3f} {w_aot:>9.3f} {w_aot / c_aot:>9.3f} "
            f"{w_raw / c_raw:>9.3f} {_med(cold, 'inside'):>8.3f} {_med(warm, 'inside'):>8.3f} "
            f"{_med(warm, 'inside') / _med(cold, 'inside'):>8.3f}"
        )
    if not args.skip_plain:
        _plain(args.models.split(","), args.reps)
    if args.skip_compile:
        return 0
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    kinds = {"aotkit_inductor": "aotkit_inductor", "inductor": "inductor (FXGraph+AOTAutograd caches)"}
    summary = []
    for model in args.compile_models.split(","):
        print(f"\ntorch.compile({model}), fresh process, first forward+backward (wall seconds)")
        print(f"{'backend':<38} {'cold':>8} {'warm':>8} {'warm CPU':>9}")
        runs = _compile_cold_warm(
            list(kinds), model, args.compile_reps, args.warm_reps, args.profile
        )
        warm_first = {}
        for kind, label in kinds.items():
            cold, warm = runs[kind]
            warm_first[kind] = _med(warm, "first")
            print(
                f"{label:<38} {_med(cold, 'first'):>8.3f} {warm_first[kind]:>8.3f} "
                f"{_med(warm, 'first_cpu'):>9.3f}"
            )
        a_warm, t_warm = runs["aotkit_inductor"][1], runs["inductor"][1]
        for r in a_warm:
            if "trace" in r["counters"] or r["inductor"]["codegen"]:
                print(f"  warning: a warm aotkit_inductor run compiled: {r['counters']} "
                      f"{r['inductor']}")
        print(f"  warm runs: aotkit {a_warm[0]['counters']} {a_warm[0]['inductor']}; "
              f"torch {t_warm[0]['inductor']}")
        ratio = warm_first["aotkit_inductor"] / warm_first["inductor"]
        cpu_ratio = _med(a_warm, "first_cpu") / _med(t_warm, "first_cpu")
        pairs = " ".join(
            f"{a['first_cpu'] / b['first_cpu']:.3f}" for a, b in zip(a_warm, t_warm, strict=True)
        )
        print(f"warm aotkit_inductor / warm inductor: {ratio:.3f} wall, {cpu_ratio:.3f} CPU "
              f"(CPU per pair: {pairs})")
        summary.append((model, warm_first["aotkit_inductor"], warm_first["inductor"], ratio,
                        cpu_ratio))
    if len(summary) > 1:
        print(f"\n{'model':<12} {'aotkit warm':>11} {'torch warm':>10} {'wall ratio':>10} "
              f"{'CPU ratio':>9}")
        for model, a, t, ratio, cpu_ratio in summary:
            print(f"{model:<12} {a:>11.3f} {t:>10.3f} {ratio:>10.3f} {cpu_ratio:>9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

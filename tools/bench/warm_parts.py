"""Where the warm AOT part goes: a per-model table in CPU milliseconds.

``cache.py`` reports aotkit's warm AOT part (the first forward + backward of a fresh process
that hits the on-disk cache, minus the median of later calls) against its cold one. This
tool splits the warm part up, for the same models (``compare.py``'s, ``nop`` compilers,
``AOTKIT_CACHE=1``): per model, one cold process fills a fresh cache directory, then
``--reps`` warm processes and ``--reps`` eager processes take turns. In a warm process the
stages of the hit path are timed in place (``time.process_time`` around the functions
below, no profiler: its overhead distorts small Python functions), in an eager process the
model itself runs.

Columns (medians over the processes, CPU ms):

* ``warm AOT``: first fwd+bwd minus the median of 5 later ones (what cache.py reports);
* ``eager 1st``: the same for the eager model: the first-call extra that eager PyTorch
  itself pays (first kernel calls, the autograd engine's first run, lazy imports);
* ``aotkit``: ``warm AOT - eager 1st``, aotkit's own first-call work;
* ``compile_flat``: the whole cache hit (key, load, rebuild, forward compile, wrappers);
  ``key``: the disk key (``source``: of it, the per-process hash of aotkit's sources);
  ``load``: reading, checksumming and parsing the entry; ``rebuild``: rebuilding the FX
  graphs from it; ``fake mode``: constructing the entry's FakeTensorMode
  (``restore_fake_mode``: See Note [A restored entry's fake mode]);
  ``fw wrap``: building the forward and the autograd.Function around it;
* ``graph fn``: nop's graph functions of both graphs (Python code generation,
  ``compile()``, and the in-place-addition analysis), the backward's at the first backward;
* ``rest``: ``aotkit - compile_flat - bw graph fn``: frontends' per-call key and wrapper
  work, and the first run of the compiled code beyond eager's own first-call extra.

The machine may be loaded: read the columns against each other, and report ``uptime``.
Usage: python tools/bench/warm_parts.py [--models mlp,pointwise] [--reps 3]
"""

from __future__ import annotations

import argparse
import functools
import importlib
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

# (label, module, attribute): the hit path's stages, timed where they are looked up
_STAGES = [
    ("compile_flat", "aotkit_frontends._aot_function", "compile_flat"),
    ("key", "aotkit_cache._compile_cache", "cache_key_or_none"),
    ("source", "aotkit_cache.key._key", "aotkit_source_hash"),
    ("load", "aotkit_cache._compile_cache", "cache_load"),
    ("rebuild", "aotkit_cache.entry._entry", "graph_from_json"),
    ("fake mode", "aotkit_cache._compile_cache", "restore_fake_mode"),
    ("fw wrap", "aotkit_cache._compile_cache", "training_call"),
    ("graph fn", "aotkit_backends._nop", "graph_function"),
]


def _child(kind: str, model: str) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    import torch
    from compare import MODELS

    torch.manual_seed(0)
    torch.set_num_threads(1)
    w = MODELS[model]()
    import aotkit_backends
    import aotkit_frontends

    acc: dict[str, float] = {}
    in_backward = [False]

    def timed(label: str, f: Any) -> Any:
        @functools.wraps(f)
        def g(*a: Any, **k: Any) -> Any:
            t = time.process_time()
            try:
                return f(*a, **k)
            finally:
                name = f"bw {label}" if in_backward[0] and label == "graph fn" else label
                acc[name] = acc.get(name, 0.0) + time.process_time() - t

        return g

    if kind == "warm":
        for label, mod, attr in _STAGES:
            m = importlib.import_module(mod)
            setattr(m, attr, timed(label, getattr(m, attr)))
    clock = time.process_time

    def step(fn: Any) -> float:
        for t in w.grad_leaves:
            t.grad = None
        t0 = clock()
        out = fn(*w.inputs).sum()
        in_backward[0] = True
        out.backward()
        in_backward[0] = False
        return clock() - t0

    t0 = clock()
    if kind == "eager":
        fn: Any = w.target
    elif isinstance(w.target, torch.nn.Module):
        fn = aotkit_frontends.aot_module(w.target, aotkit_backends.nop)
    else:
        fn = aotkit_frontends.aot_function(w.target, aotkit_backends.nop)
    step(fn)
    first = clock() - t0
    later = statistics.median(step(fn) for _ in range(5))
    from aotkit_cache import cache_counters

    return {"aot": first - later, "parts": acc, "counters": dict(cache_counters)}


def _run(kind: str, model: str, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", kind, model],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} {model} failed:\n{proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


_COLUMNS = ["warm AOT", "eager 1st", "aotkit", "compile_flat", "key", "source", "load",
            "rebuild", "fake mode", "fw wrap", "graph fn", "bw graph fn", "rest"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--child", nargs=2, metavar=("KIND", "MODEL"), help=argparse.SUPPRESS)
    ap.add_argument("--models", default="mlp,transformer,convnet,pointwise")
    ap.add_argument("--reps", type=int, default=3, help="warm and eager processes per model")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(*args.child)))
        return 0
    print("warm first fwd+bwd of aot_module/aot_function + nop, CPU ms, medians "
          f"over {args.reps} processes ('graph fn' includes 'bw graph fn')")
    print(f"{'model':<12}" + "".join(f"{c:>13}" for c in _COLUMNS))
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory() as d:
            env = {"AOTKIT_CACHE": "1", "AOTKIT_CACHE_DIR": os.path.join(d, "aotkit")}
            _run("cold", model, env)
            warm, eager = [], []
            for _ in range(args.reps):
                warm.append(_run("warm", model, env))
                eager.append(_run("eager", model, env))
        if any("hit" not in r["counters"] or "trace" in r["counters"] for r in warm):
            print(f"  warning: {model} warm run traced: {[r['counters'] for r in warm]}")
        rows: dict[str, list[float]] = {c: [] for c in _COLUMNS}
        e1 = statistics.median(r["aot"] for r in eager)
        for r in warm:
            p = r["parts"]
            own = r["aot"] - e1
            vals = {"warm AOT": r["aot"], "eager 1st": e1, "aotkit": own, **p}
            vals["rest"] = own - p.get("compile_flat", 0.0) - p.get("bw graph fn", 0.0)
            vals["graph fn"] = p.get("graph fn", 0.0) + p.get("bw graph fn", 0.0)
            for c in _COLUMNS:
                rows[c].append(vals.get(c, 0.0))
        print(f"{model:<12}" + "".join(f"{statistics.median(rows[c]) * 1e3:>13.2f}" for c in _COLUMNS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

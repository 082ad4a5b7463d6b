"""Garbage collections during a zoo model's first training step, per backend.

For each model and backend: a fresh ``torch.compile`` (after an untimed warm-up compile, as
``zoo.py`` does), then one training step with a ``gc.callbacks`` hook that times every
collection by generation (CPU clock), and, for each full (gen-2) collection, the innermost
aotkit / dynamo / Inductor frames it ran under. Also the graphs Inductor compiled (role,
call nodes, inputs, CPU time in ``fx_codegen_and_compile``). See Note [Full collections
deferred during a compile] in aotkit_capture.

  uv run --group bench python tools/bench/zoo_gc.py --models gpt2,resnet18
  uv run --group bench python tools/bench/zoo_gc.py --backends aotkit_inductor,inductor,aotkit_eager
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import zoo  # noqa: E402

_KEEP = ("aotkit", "_dynamo/", "_inductor/compile_fx", "runtime_wrappers", "autograd/__init__")


class GcClock:
    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.counts = [0, 0, 0]
        self.full: list[tuple[float, int, list[str]]] = []
        self._start = 0.0
        self._where: list[str] = []

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        gen = info["generation"]
        if phase == "start":
            self._start = time.process_time()
            if gen == 2:
                frames = traceback.extract_stack(limit=80)
                self._where = [
                    f"{f.filename.split('site-packages/')[-1].split('packages/')[-1]}:{f.name}"
                    for f in frames
                    if any(k in f.filename for k in _KEEP)
                ]
            return
        took = time.process_time() - self._start
        self.seconds[gen] += took
        self.counts[gen] += 1
        if gen == 2:
            self.full.append((took, info["collected"], self._where))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default="gpt2")
    p.add_argument("--backends", default="aotkit_inductor,inductor")
    p.add_argument("--reps", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    zoo.clock = time.process_time
    backends = zoo.make_backends()

    import torch._inductor.compile_fx as compile_fx

    graphs: list[str] = []
    original = compile_fx.fx_codegen_and_compile

    def recorded(gm: torch.fx.GraphModule, example_inputs: Any, *a: Any, **kw: Any) -> Any:
        t0 = time.process_time()
        try:
            return original(gm, example_inputs, *a, **kw)
        finally:
            role = "bw" if kw.get("is_backward") else "inf" if kw.get("is_inference") else "fw"
            n = sum(1 for x in gm.graph.nodes if x.op == "call_function")
            ms = (time.process_time() - t0) * 1e3
            graphs.append(f"{role}:{n}n/{len(example_inputs)}in/{ms:.0f}ms")

    compile_fx.fx_codegen_and_compile = recorded
    for name in args.models.split(","):
        names = args.backends.split(",")
        for impl in names:  # the untimed first compile (C++ kernels built once)
            torch._dynamo.reset()
            zoo.train_three(zoo.make_trainer(name, backends[impl]))
        for _ in range(args.reps):
            for impl in names:
                torch._dynamo.reset()
                t = zoo.make_trainer(name, backends[impl])
                gc.collect()
                graphs.clear()
                zoo.CLOCK.reset()
                clock = GcClock()
                gc.callbacks.append(clock)
                t0 = time.process_time()
                try:
                    t.step()
                finally:
                    gc.callbacks.remove(clock)
                ms = (time.process_time() - t0) * 1e3
                gen = " ".join(
                    f"g{g} {clock.counts[g]}x/{clock.seconds[g] * 1e3:.0f}ms" for g in range(3)
                )
                print(
                    f"{name:16s} {impl:16s} first {ms:6.0f} ms  AOT layer "
                    f"{zoo.CLOCK.aot_seconds * 1e3:5.0f}  compilers {zoo.CLOCK.compilers * 1e3:6.0f}"
                    f"  gc {gen}  graphs {' '.join(graphs)}",
                    flush=True,
                )
                for took, collected, where in clock.full:
                    print(
                        f"    full collection {took * 1e3:.0f} ms, {collected} collected, under "
                        + " > ".join(where[-6:]),
                        flush=True,
                    )
                del t
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

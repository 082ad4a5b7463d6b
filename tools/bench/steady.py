"""Focused steady-step A/B of compiled training steps, in one process, alternating.

Per phase of a training step (``zero_grad``, forward, backward, optimizer step): median CPU
time per step and minor page faults per step, for each backend, in rounds that alternate
the backends. A backend may be suffixed ``:nodonate`` to compile it with
``torch._functorch.config.donated_buffer`` off (no donated buffers: the backward allocates
fresh memory where it could reuse saved activations).

    uv run --group bench python tools/bench/steady.py --model resnet18 \\
        --backends aotkit_inductor,inductor --rounds 9 --steps 10

The machine is shared: CPU clocks, alternation, and report ``uptime`` next to numbers.
Page faults depend on the allocator's state, which both backends share in one process:
which backend pays for glibc returning memory to the OS (and faulting it back in) depends
on the order and on the other's pattern. To compare the compiled code alone, run with
``MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=4294967295`` (no faults in the
steady state).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch._functorch.config as functorch_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo  # noqa: E402

PHASES = ("zero", "fw", "bw", "opt")


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18", choices=sorted(zoo.MODELS))
    p.add_argument("--backends", default="aotkit_inductor,inductor")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    import aotkit  # noqa: F401  (registers aotkit's dynamo backends)
    from torch._inductor import lowering  # noqa: F401  (Inductor's lowerings, imported once)

    kinds = args.backends.split(",")
    trainers = {}
    for kind in kinds:
        backend, _, flag = kind.partition(":")
        with functorch_config.patch(donated_buffer=flag != "nodonate"):
            t = zoo.make_trainer(args.model, backend)
            for _ in range(3):  # compile, lazy backward compile, warm up
                t.step()
        trainers[kind] = t
    times = {k: {ph: [] for ph in PHASES} for k in kinds}
    faults = {k: {ph: [] for ph in PHASES} for k in kinds}
    clock = time.process_time
    for _ in range(args.rounds):
        for kind, t in trainers.items():
            acc = dict.fromkeys(PHASES, 0.0)
            flt = dict.fromkeys(PHASES, 0)
            for _ in range(args.steps):
                marks = [(clock(), _faults())]
                t.opt.zero_grad(set_to_none=True)
                marks.append((clock(), _faults()))
                loss = t.fn(*t.built.inputs)
                marks.append((clock(), _faults()))
                loss.backward()
                marks.append((clock(), _faults()))
                t.opt.step()
                marks.append((clock(), _faults()))
                for i, ph in enumerate(PHASES):
                    acc[ph] += marks[i + 1][0] - marks[i][0]
                    flt[ph] += marks[i + 1][1] - marks[i][1]
            for ph in PHASES:
                times[kind][ph].append(acc[ph] / args.steps)
                faults[kind][ph].append(flt[ph] / args.steps)
    ours, theirs = kinds[0], kinds[-1]
    print(f"{args.model}: {ours} vs {theirs}, {args.rounds} rounds x {args.steps} steps, CPU ms/step")
    for ph in [*PHASES, "step"]:
        if ph == "step":
            a = statistics.median(sum(times[ours][q][i] for q in PHASES) for i in range(args.rounds))
            b = statistics.median(sum(times[theirs][q][i] for q in PHASES) for i in range(args.rounds))
            fa = fb = float("nan")
        else:
            a, b = statistics.median(times[ours][ph]), statistics.median(times[theirs][ph])
            fa, fb = statistics.median(faults[ours][ph]), statistics.median(faults[theirs][ph])
        print(f"  {ph:5s} {a * 1e3:9.3f} {b * 1e3:9.3f}  o/t {a / b:.3f}  faults {fa:7.0f} {fb:7.0f}")
    print("  load average", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

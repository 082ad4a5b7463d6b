"""cProfile one compiled call of a benchmark model, to see where aotkit's time goes.

By default this profiles the FIRST forward + backward of a fresh aotkit wrapper (trace,
partition, compile, run), after one untimed first call of another wrapper, so lazy imports
and one-time set-up do not show (``--cold`` keeps them). With ``--calls N`` it profiles N
steady-state calls of an already compiled wrapper instead (the per-call path).

Models are those of ``compare.py`` (mlp, transformer, convnet, pointwise) plus the tiny
function ``x.sin() + 1`` on 10 elements: ``tiny`` (inference, no grad input) and
``tiny-train`` (requires_grad input, ``y.backward(ones)`` each call).

Usage: python tools/bench/profile_first_call.py MODEL [--impl aotkit|torch] [--calls N]
       [--top 30] [--sort cumulative|tottime] [--filter REGEX] [--cold] [--dump FILE]
Examples:
  python tools/bench/profile_first_call.py transformer
  python tools/bench/profile_first_call.py tiny --calls 10000 --sort tottime
Profiling inflates the cost of small Python functions; compare entries with each other, and
take absolute times from compare.py.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from compare import MODELS, Impl, Workload, compile_with, make_step, make_tiny_call, tiny


def _tiny_workload(train: bool) -> Workload:
    x = torch.randn(10, requires_grad=train)
    return Workload("tiny-train" if train else "tiny", tiny, (x,), (x,) if train else ())


def _call_for(impl: Impl, w: Workload) -> Callable[[], None]:
    """A fresh wrapper's call: the tiny function's own call, or a training step for models."""
    fn: Callable[..., Any] = compile_with(impl, w.target)
    if w.target is tiny:
        return make_tiny_call(fn, w.inputs[0], train=bool(w.grad_leaves))
    return make_step(fn, w)


def main(argv: Sequence[str] | None = None) -> int:
    choices = [*MODELS, "tiny", "tiny-train"]
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("model", choices=choices)
    ap.add_argument("--impl", choices=["aotkit", "torch"], default="aotkit")
    ap.add_argument(
        "--calls",
        type=int,
        default=0,
        help="profile N steady-state calls instead of the first call",
    )
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--sort", choices=["cumulative", "tottime"], default="cumulative")
    ap.add_argument(
        "--filter",
        help="only entries whose 'path:line(function)' matches this regex, e.g. 'aotkit_'",
    )
    ap.add_argument(
        "--cold", action="store_true", help="no untimed warm-up compile before the profiled one"
    )
    ap.add_argument("--dump", help="also write the raw profile to this file (for snakeviz, pstats)")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    w = (
        _tiny_workload(args.model == "tiny-train")
        if args.model.startswith("tiny")
        else MODELS[args.model]()
    )
    impl: Impl = args.impl

    if not args.cold or args.calls:
        _call_for(impl, w)()  # untimed: lazy imports, one-time set-up
    call = _call_for(impl, w)
    if args.calls:
        for _ in range(20):
            call()

    gc.collect()
    prof = cProfile.Profile()
    if args.calls:
        gc.disable()
        prof.enable()
        for _ in range(args.calls):
            call()
        prof.disable()
        gc.enable()
        what = f"{args.calls} steady-state calls"
    else:
        prof.enable()
        call()
        prof.disable()
        what = "first call (fresh wrapper: trace, partition, compile, fwd + bwd)"

    print(f"== {impl} {args.model}: {what}; top {args.top} by {args.sort} ==")
    stats = pstats.Stats(prof, stream=sys.stdout)
    if args.filter:  # match against full paths, so that e.g. 'aotkit_' selects our packages
        stats.sort_stats(args.sort).print_stats(args.filter, args.top)
    else:
        stats.strip_dirs().sort_stats(args.sort).print_stats(args.top)
    if args.dump:
        prof.dump_stats(args.dump)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Correctness sweep of the wide zoo (``zoo_wide.py``): no timing, just "does it behave".

Per model, in one process, each contender from the same initial state:

* training: 3 AdamW steps through ``torch.compile`` with aotkit_eager and torch's aot_eager
  (and, with ``--inductor``, aotkit_inductor and inductor), losses and parameters against
  eager: ``bitwise``, ``close`` (rtol 1e-4, atol 1e-5) or ``DIFF <max error>``;
* eval: the loss in eval mode under ``no_grad`` (an inference graph), against eager;
* aot_module: one training step through aotkit's ``aot_module`` (no dynamo) and torch's,
  loss and gradients against eager; ``n/a`` when both fail to trace (a model that only
  works with graph breaks), ``ERROR`` when aotkit fails where torch does not.

A verdict per model: ``ok`` when aotkit matches eager wherever torch does, ``BUG`` when it
does not (the cells say where), ``both`` when torch fails the same way.

Usage:
  uv run --group bench python tools/bench/zoo_wide_check.py [--models a,b] [--inductor] [--json F]
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
os.environ.setdefault("AOTKIT_CACHE", "0")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import aotkit  # noqa: E402
import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch._functorch.aot_autograd as torch_aot  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch._functorch.compilers import nop as torch_nop  # noqa: E402
from zoo_wide import WIDE  # noqa: E402

Result = tuple[list[torch.Tensor], list[torch.Tensor]]


def build(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    module, inputs = WIDE[name]()
    module.train()
    return module, inputs


def compare(ref: Sequence[torch.Tensor], got: Sequence[torch.Tensor]) -> str:
    if len(ref) != len(got):
        return f"DIFF len {len(ref)} vs {len(got)}"
    pairs = list(zip(ref, got, strict=True))
    for a, b in pairs:
        if (a is None) != (b is None):
            return "DIFF grad None"
    pairs = [(a, b) for a, b in pairs if a is not None]
    if all(torch.equal(a, b) for a, b in pairs):
        return "bitwise"
    if all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in pairs):
        return "close"
    err = max(float((a.double() - b.double()).abs().max()) for a, b in pairs)
    return f"DIFF {err:.1e}"


def train3(name: str, backend: str | None) -> list[torch.Tensor]:
    torch._dynamo.reset()
    module, inputs = build(name)
    fn: Callable[..., torch.Tensor] = module if backend is None else torch.compile(module, backend=backend)
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    losses = []
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        loss = fn(*inputs)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses + [p.detach().clone() for p in params]


def eval_loss(name: str, backend: str | None) -> list[torch.Tensor]:
    torch._dynamo.reset()
    module, inputs = build(name)
    module.eval()
    fn: Callable[..., torch.Tensor] = module if backend is None else torch.compile(module, backend=backend)
    with torch.no_grad():
        out = fn(*inputs)
    return [out.detach()]


def aot_module_step(name: str, impl: str | None) -> list[torch.Tensor]:
    module, inputs = build(name)
    if impl is None:
        fn: Callable[..., torch.Tensor] = module
    elif impl == "aotkit":
        fn = aotkit.aot_module(module, aotkit.nop)
    else:
        fn = torch_aot.aot_module(module, torch_nop)
    loss = fn(*inputs)
    loss.backward()
    return [loss.detach()] + [p.grad for p in module.parameters() if p.requires_grad]  # type: ignore[misc]


def attempt(f: Callable[[], list[torch.Tensor]]) -> list[torch.Tensor] | str:
    try:
        return f()
    except Exception as e:  # noqa: BLE001 - the sweep reports and goes on
        msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"
        if os.environ.get("ZOO_TRACEBACK"):
            traceback.print_exc()
        return "ERROR " + msg


def cell(ref: list[torch.Tensor] | str, got: list[torch.Tensor] | str) -> str:
    if isinstance(ref, str):
        return "ref " + ref
    if isinstance(got, str):
        return got
    return compare(ref, got)


def good(c: str) -> bool:
    return c in ("bitwise", "close")


def check(name: str, inductor: bool, only_inductor: bool = False) -> dict[str, Any]:
    row: dict[str, Any] = {"model": name}
    ref = attempt(lambda: train3(name, None))
    pairs = [] if only_inductor else [("aotkit_eager", "aot_eager")]
    pairs += [("aotkit_inductor", "inductor")] if inductor or only_inductor else []
    bugs = []
    for ours, theirs in pairs:
        o = cell(ref, attempt(lambda b=ours: train3(name, b)))  # type: ignore[misc]
        t = cell(ref, attempt(lambda b=theirs: train3(name, b)))  # type: ignore[misc]
        row[ours], row[theirs] = o, t
        if not good(o):
            if ours == "aotkit_eager" and o != t:
                bugs.append(ours)
            elif ours == "aotkit_inductor" and good(t):
                bugs.append(ours)
    if only_inductor:
        row["verdict"] = ("BUG " + ",".join(bugs)) if bugs else "ok"
        return row
    eref = attempt(lambda: eval_loss(name, None))
    row["eval aotkit"] = cell(eref, attempt(lambda: eval_loss(name, "aotkit_eager")))
    row["eval torch"] = cell(eref, attempt(lambda: eval_loss(name, "aot_eager")))
    if not good(row["eval aotkit"]) and row["eval aotkit"] != row["eval torch"]:
        bugs.append("eval")
    mref = attempt(lambda: aot_module_step(name, None))
    row["aot_module aotkit"] = cell(mref, attempt(lambda: aot_module_step(name, "aotkit")))
    row["aot_module torch"] = cell(mref, attempt(lambda: aot_module_step(name, "torch")))
    if not good(row["aot_module aotkit"]) and good(row["aot_module torch"]):
        bugs.append("aot_module")
    row["verdict"] = ("BUG " + ",".join(bugs)) if bugs else "ok"
    return row


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(WIDE))
    ap.add_argument("--inductor", action="store_true", help="also the inductor pair")
    ap.add_argument("--only-inductor", action="store_true", help="the inductor pair's training only")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch._dynamo.config.recompile_limit = 64
    warnings.filterwarnings("ignore")
    rows = []
    for name in [m for m in args.models.split(",") if m]:
        t0 = time.perf_counter()
        row = check(name, args.inductor, args.only_inductor)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    print(file=sys.stderr)
    for row in rows:
        print(f"{row['model']:16} {row['verdict']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

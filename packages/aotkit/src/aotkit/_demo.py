"""``aotkit demo``: train a small MLP eagerly and through aot_module, side by side."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import torch
import torch.nn as nn
from aotkit_backends import make_boxed_func
from aotkit_frontends import aot_module


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1)
    )


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(128, 16, generator=g)
    y = (x[:, :1] * 2 - x[:, 1:2]).sin() + 0.1 * torch.randn(128, 1, generator=g)
    return x, y


def _train(model: nn.Module, steps: int) -> list[float]:
    x, y = _data()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        torch.autograd.backward([loss])
        opt.step()
        losses.append(loss.item())
    return losses


def run_demo(steps: int = 20, out: TextIO | None = None) -> int:
    """Print both loss curves and the graph sizes; return 0 when they match."""
    import sys

    stream = out or sys.stdout
    graphs: dict[str, int] = {}

    def counting(name: str) -> Callable[[torch.fx.GraphModule, Sequence[Any]], Any]:
        def compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
            graphs[name] = sum(1 for n in gm.graph.nodes if n.op == "call_function")
            return make_boxed_func(gm)

        return compiler

    start = time.perf_counter()
    eager = _train(_mlp(), steps)
    compiled_model = aot_module(_mlp(), counting("forward"), counting("backward"))
    compiled = _train(compiled_model, steps)
    elapsed = time.perf_counter() - start
    print("step   eager loss   aotkit loss", file=stream)
    for i, (a, b) in enumerate(zip(eager, compiled, strict=True)):
        print(f"{i:4d}   {a:10.6f}   {b:11.6f}", file=stream)
    print(
        f"forward graph: {graphs.get('forward', 0)} ops, "
        f"backward graph: {graphs.get('backward', 0)} ops",
        file=stream,
    )
    worst = max(abs(a - b) for a, b in zip(eager, compiled, strict=True))
    same = worst <= 1e-5 * max(1.0, max(abs(a) for a in eager))
    print(
        f"max |eager - aotkit| = {worst:.2e} -> {'MATCH' if same else 'MISMATCH'} "
        f"({elapsed:.1f}s)",
        file=stream,
    )
    return 0 if same else 1

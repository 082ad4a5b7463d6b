"""WGAN-GP critic steps: gradients of gradients through compiled code (issue 37).

One critic step: the gradient penalty needs ``torch.autograd.grad(D(interp), interp,
create_graph=True)``, then the loss's backward differentiates that gradient again, then
an Adam step. torch's own AOTAutograd refuses this ("does not currently support double
backward"); aotkit recomputes the critic's forward graph under autograd in the backward
(Note [Higher-order gradients through compiled code]).

Contenders, taking turns within each repetition (eager, aot_module, aotkit_eager, ...):
  * eager;
  * aot_module(critic, nop);
  * torch.compile(critic, backend="aotkit_eager") and "aotkit_inductor";
  * torch.compile(critic, backend="aot_eager"), torch's, only to show that it raises.
For each: the first step (a fresh wrapper, dynamo reset: trace + compile + the step, with
its lazy backward compile) and the steady step (median over blocks of steps after warm-up,
garbage collector off in the timed loop). Models: an MLP critic on 784 features and a small
convnet on 3x32x32 images, batch 64. ``torch.set_num_threads(1)``.

Usage: python tools/bench/higher_order.py [--models mlp,conv] [--reps 5] [--steps 10]
Benchmarks are not tests: the exit status is 0.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable

import aotkit
import torch
import torch.nn as nn

BATCH = 64


def mlp() -> tuple[nn.Module, tuple[int, ...]]:
    return nn.Sequential(
        nn.Linear(784, 512), nn.LeakyReLU(0.2), nn.Linear(512, 256), nn.LeakyReLU(0.2),
        nn.Linear(256, 1),
    ), (784,)


def conv() -> tuple[nn.Module, tuple[int, ...]]:
    return nn.Sequential(
        nn.Conv2d(3, 32, 4, 2, 1), nn.LeakyReLU(0.2),
        nn.Conv2d(32, 64, 4, 2, 1), nn.LeakyReLU(0.2),
        nn.Conv2d(64, 128, 4, 2, 1), nn.LeakyReLU(0.2),
        nn.Flatten(), nn.Linear(128 * 4 * 4, 1),
    ), (3, 32, 32)


MODELS: dict[str, Callable[[], tuple[nn.Module, tuple[int, ...]]]] = {"mlp": mlp, "conv": conv}


def wrap(kind: str, model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    if kind == "eager":
        return model
    if kind == "aot_module":
        return aotkit.aot_module(model, aotkit.nop)  # type: ignore[no-any-return]
    torch._dynamo.reset()
    return torch.compile(model, backend=kind)  # type: ignore[return-value]


def critic_step(
    critic: Callable[[torch.Tensor], torch.Tensor], opt: torch.optim.Optimizer,
    real: torch.Tensor, fake: torch.Tensor, eps: torch.Tensor,
) -> float:
    opt.zero_grad(set_to_none=True)
    interp = (eps * real + (1 - eps) * fake).requires_grad_(True)
    (g,) = torch.autograd.grad(critic(interp).sum(), interp, create_graph=True)
    penalty = ((g.flatten(1).norm(2, dim=1) - 1) ** 2).mean()
    loss = critic(fake).mean() - critic(real).mean() + 10 * penalty
    loss.backward()
    opt.step()
    return float(loss.detach())


def data(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    real, fake = torch.randn(BATCH, *shape), torch.randn(BATCH, *shape)
    eps = torch.rand(BATCH, *([1] * len(shape)))
    return real, fake, eps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,conv")
    ap.add_argument("--kinds", default="eager,aot_module,aotkit_eager,aotkit_inductor")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(1)
    kinds = args.kinds.split(",")
    print(f"torch {torch.__version__}, threads=1, batch {BATCH}")
    for name in args.models.split(","):
        torch.manual_seed(0)
        model, shape = MODELS[name]()
        batch = data(shape)
        try:  # torch's AOTAutograd, for the record
            critic_step(wrap("aot_eager", model), torch.optim.SGD(model.parameters()), *batch)
            print(f"[{name}] torch aot_eager: ran")
        except Exception as e:  # noqa: BLE001
            print(f"[{name}] torch aot_eager: {type(e).__name__}: {str(e).splitlines()[0][:90]}")
        # eager's losses as the check that every contender trains the same
        first: dict[str, list[float]] = {k: [] for k in kinds}
        steady: dict[str, list[float]] = {k: [] for k in kinds}
        state = {k: v.clone() for k, v in model.state_dict().items()}
        losses: dict[str, float] = {}
        for _ in range(args.reps):
            for kind in kinds:
                model.load_state_dict(state)
                opt = torch.optim.Adam(model.parameters(), lr=1e-4)
                t0 = time.perf_counter()
                critic = wrap(kind, model)
                loss = critic_step(critic, opt, *batch)
                first[kind].append(time.perf_counter() - t0)
                losses[kind] = loss
                for _ in range(3):
                    critic_step(critic, opt, *batch)
                gc.disable()
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    critic_step(critic, opt, *batch)
                steady[kind].append((time.perf_counter() - t0) / args.steps)
                gc.enable()
        print(f"== {name}: WGAN-GP critic step, medians of {args.reps} ==")
        print(f"{'contender':<18}{'first ms':>10}{'steady ms':>11}{'steady/eager':>14}"
              f"{'first loss':>14}")
        base = statistics.median(steady["eager"]) if "eager" in steady else None
        for kind in kinds:
            s = statistics.median(steady[kind])
            ratio = f"{s / base:.3f}" if base else "-"
            print(f"{kind:<18}{statistics.median(first[kind]) * 1e3:>10.1f}{s * 1e3:>11.2f}"
                  f"{ratio:>14}{losses[kind]:>14.6f}")


if __name__ == "__main__":
    main()

"""The per-rank body of tests/test_subclass_dtensor.py (2 CPU ranks, gloo).

Each scenario trains a model 3 steps eagerly and through ``torch.compile`` with each
requested backend, and returns per-backend (losses, full parameters) from rank 0.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

Result = tuple[list[float], list[torch.Tensor]]


def _mlp_tp(mesh: DeviceMesh) -> torch.nn.Module:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    return parallelize_module(m, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


class Block(torch.nn.Module):
    """A tiny pre-norm transformer block."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.fc1 = torch.nn.Linear(dim, 2 * dim)
        self.fc2 = torch.nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)

        att = torch.nn.functional.scaled_dot_product_attention(split(q), split(k), split(v))
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))


def _block_fsdp(mesh: DeviceMesh) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    m = Block()
    fully_shard(m, mesh=mesh)
    return m


SCENARIOS: dict[str, tuple[Callable[[DeviceMesh], torch.nn.Module], tuple[int, ...]]] = {
    "mlp_tp": (_mlp_tp, (4, 8)),
    "block_fsdp": (_block_fsdp, (2, 4, 16)),
}


def _full(p: torch.Tensor) -> torch.Tensor:
    full = getattr(p, "full_tensor", None)
    return (full() if full is not None else p).detach().clone()


def _train(scenario: str, mesh: DeviceMesh, backend: str | None) -> Result:
    build, shape = SCENARIOS[scenario]
    model = build(mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step_fn: Any = model if backend is None else torch.compile(model, backend=backend)
    losses: list[float] = []
    for step in range(3):
        # every rank feeds the same batch: the results equal the single-device run
        torch.manual_seed(100 + step)
        x = torch.randn(*shape)
        loss = step_fn(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, [_full(p) for p in model.parameters()]


def run_rank(rank: int, port: int, scenario: str, backends: list[str], out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        import aotkit  # noqa: F401  (registers the aotkit_* backends)

        torch._dynamo.reset()
        mesh = init_device_mesh("cpu", (2,))
        results: dict[str, Result] = {"eager": _train(scenario, mesh, None)}
        for backend in backends:
            torch._dynamo.reset()
            results[backend] = _train(scenario, mesh, backend)
        if rank == 0:
            torch.save(results, out_path)
    finally:
        dist.destroy_process_group()
    # The rank's work is done and saved. Leave without the interpreter's teardown: under
    # load a rank was seen to abort there ("terminate called without an active exception",
    # SIGABRT) while destroying a native thread that Inductor's or gloo's statics still
    # own, which failed a finished run. An error above still propagates (not reached).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

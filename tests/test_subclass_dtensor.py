"""DTensor on 2 CPU ranks (gloo): tensor parallelism and FSDP2 compile through aotkit.

Each test spawns two processes (127.0.0.1, a free port) that train a model 3 steps eagerly
and through ``torch.compile`` with aotkit's backend and torch's matching one; losses and
parameters must agree. A hard timeout kills the ranks, so a hang fails instead of blocking.
"""

from __future__ import annotations

import socket
import tempfile
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _dtensor_worker import run_rank

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="gloo is not available"
)

# hard limits per test: far above the normal run (about 1-2.5 min on 2 busy cores), so
# that only a hang (a rank waiting in a collective its peer never joins) hits them
_TIMEOUT_S = {"eager": 400, "inductor": 900}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _spawn(
    scenario: str, backends: list[str], timeout_s: float
) -> dict[str, tuple[list[float], list[torch.Tensor]]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "results.pt")
        ctx = mp.spawn(
            run_rank, args=(_free_port(), scenario, backends, out), nprocs=2, join=False
        )
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() > deadline:
                    pytest.fail(f"{scenario}: the ranks did not finish in {timeout_s} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        results: dict[str, tuple[list[float], list[torch.Tensor]]] = torch.load(out)
        return results


def _assert_same_training(results: dict[str, tuple[list[float], list[torch.Tensor]]], rtol: float) -> None:
    eager_losses, eager_params = results["eager"]
    for backend, (losses, params) in results.items():
        torch.testing.assert_close(losses, eager_losses, rtol=rtol, atol=rtol, msg=backend)
        for p, e in zip(params, eager_params, strict=True):
            torch.testing.assert_close(p, e, rtol=rtol, atol=rtol, msg=backend)


@pytest.mark.parametrize("scenario", ["mlp_tp", "block_fsdp"])
def test_dtensor_training_aotkit_eager(scenario: str) -> None:
    results = _spawn(scenario, ["aotkit_eager", "aot_eager"], _TIMEOUT_S["eager"])
    _assert_same_training(results, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["mlp_tp", "block_fsdp"])
def test_dtensor_training_aotkit_inductor(scenario: str) -> None:
    results = _spawn(scenario, ["aotkit_inductor", "inductor"], _TIMEOUT_S["inductor"])
    _assert_same_training(results, rtol=1e-4)

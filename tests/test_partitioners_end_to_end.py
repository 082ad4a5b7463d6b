"""Every built-in partitioner, plugged into aot_module, trains like eager.

Covers the seam between frontends and partitioners: runtime-mutated inputs (BatchNorm
running statistics) must never be saved for backward (See Note [Joint graph calling
convention]), and a partitioner given by name resolves through the registry.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn
from aotkit import aot_module, memory_budget_partition, nop

PARTITIONERS: dict[str, Any] = {
    "default": "default",
    "min_cut": "min_cut",
    "budget_0": memory_budget_partition(0.0),
    "budget_0.3": memory_budget_partition(0.3),
    "budget_1": memory_budget_partition(1.0),
}


def _convnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
    )


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], torch.Tensor]]] = {
    "convnet_bn_train": (_convnet, lambda: torch.randn(4, 3, 12, 12)),
    "mlp": (_mlp, lambda: torch.randn(8, 16)),
}


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("partitioner", sorted(PARTITIONERS))
def test_two_training_steps_match_eager(model: str, partitioner: str) -> None:
    make_model, make_input = MODELS[model]
    torch.manual_seed(0)
    eager = make_model()
    compiled_source = copy.deepcopy(eager)
    compiled = aot_module(compiled_source, nop, partition_fn=PARTITIONERS[partitioner])
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(compiled_source.parameters(), lr=0.1)
    for step in range(2):
        x = make_input()
        opt_e.zero_grad()
        opt_c.zero_grad()
        out_e, out_c = eager(x), compiled(x)
        torch.testing.assert_close(out_c, out_e, rtol=1e-4, atol=1e-5)
        torch.autograd.backward([(out_e * out_e).sum()])
        torch.autograd.backward([(out_c * out_c).sum()])
        for (name, pe), pc in zip(eager.named_parameters(), compiled_source.parameters(), strict=True):
            assert pc.grad is not None, f"step {step}: no grad for {name}"
            torch.testing.assert_close(pc.grad, pe.grad, rtol=1e-4, atol=1e-4, msg=f"step {step}: {name}")
        for (name, be), bc in zip(eager.named_buffers(), compiled_source.buffers(), strict=True):
            torch.testing.assert_close(bc, be, msg=f"step {step}: buffer {name}")
        opt_e.step()
        opt_c.step()

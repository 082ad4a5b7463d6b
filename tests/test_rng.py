"""Functionalized RNG (Note [Functionalized RNG], Note [RNG replay keys]): random ops in
forward and backward, with and without ``torch.utils.checkpoint``, under every partitioner,
through ``aot_function`` and ``torch.compile``. Values, gradients and the global RNG state
after each call must equal eager's exactly (same draws, not just the same distribution).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from aotkit import aot_autograd, aot_function, nop
from aotkit_partitioners import (
    default_partition,
    memory_budget_partition,
    min_cut_rematerialization_partition,
    partition_report,
)
from aotkit_schemas import functionalize_rng, functionalize_rng_enabled
from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state


class NoisyGrad(torch.autograd.Function):
    """Identity whose backward scales the gradient by fresh uniform noise."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 1.0

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * torch.rand_like(g)


def _dropout(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.dropout(torch.sin(x @ w), 0.5, training=True).cos()


def _rand_forward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x * torch.rand_like(x)).sin() @ w


def _rand_backward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return NoisyGrad.apply(x @ w).sin()


def _attention(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    q = x @ w
    p = torch.softmax(q @ q.t(), dim=-1)
    return F.dropout(p, 0.1, training=True) @ q


BODIES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "dropout": _dropout,
    "rand_forward": _rand_forward,
    "rand_backward": _rand_backward,
    "attention": _attention,
}


def program(body: str, checkpointed: bool) -> Callable[[torch.Tensor, torch.Tensor], Any]:
    fn = BODIES[body]
    if checkpointed:

        def run(x: torch.Tensor, w: torch.Tensor) -> Any:
            return cp.checkpoint(fn, x, w, use_reentrant=False).sum() * 2

    else:

        def run(x: torch.Tensor, w: torch.Tensor) -> Any:
            return fn(x, w).sum() * 2

    return run


PARTITIONERS: dict[str, Callable[..., Any]] = {
    "default": default_partition,
    "min_cut": min_cut_rematerialization_partition,
    "budget_0": memory_budget_partition(0.0),
    "budget_0.5": memory_budget_partition(0.5),
}


def observe(fn: Callable[..., Any], calls: int = 2) -> list[tuple[torch.Tensor, ...]]:
    """Outputs, gradients and the global RNG state after each of ``calls`` calls."""
    torch.manual_seed(0)
    x0, w0 = torch.randn(8, 16), torch.randn(16, 16) / 4
    torch.manual_seed(1234)
    seen = []
    for _ in range(calls):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        out = fn(x, w)
        out.backward()
        assert x.grad is not None and w.grad is not None
        seen.append((out.detach(), x.grad, w.grad, torch.get_rng_state()))
    return seen


def assert_same(
    expected: list[tuple[torch.Tensor, ...]], got: list[tuple[torch.Tensor, ...]]
) -> None:
    for k, (e, g) in enumerate(zip(expected, got, strict=True)):
        for name, a, b in zip(("output", "x.grad", "w.grad", "rng state"), e, g, strict=True):
            assert torch.equal(a, b), f"call {k}: {name} differs from eager"


def test_switch_is_on_by_default() -> None:
    assert functionalize_rng_enabled()


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpoint"])
@pytest.mark.parametrize("body", list(BODIES))
@pytest.mark.parametrize("partitioner", list(PARTITIONERS))
def test_aot_function_matches_eager(partitioner: str, body: str, checkpointed: bool) -> None:
    fn = program(body, checkpointed)
    compiled = aot_function(fn, nop, nop, partition_fn=PARTITIONERS[partitioner])
    assert_same(observe(fn), observe(compiled))


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpoint"])
@pytest.mark.parametrize("body", list(BODIES))
@pytest.mark.parametrize("partitioner", ["aotkit_eager", "min_cut", "budget_0"])
def test_torch_compile_matches_eager(partitioner: str, body: str, checkpointed: bool) -> None:
    fn = program(body, checkpointed)
    torch._dynamo.reset()
    backend: Any = (
        partitioner
        if partitioner == "aotkit_eager"
        else aot_autograd(fw_compiler=nop, bw_compiler=nop, partition_fn=PARTITIONERS[partitioner])
    )
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    try:
        assert_same(observe(fn), observe(compiled))
    finally:
        torch._dynamo.reset()


class Graphs:
    """Partitions with a given partitioner, keeping the graphs."""

    def __init__(self, partition: Callable[..., Any]) -> None:
        self.partition = partition
        self.fw: list[torch.fx.GraphModule] = []
        self.bw: list[torch.fx.GraphModule] = []
        self.bytes: list[int] = []

    def __call__(self, joint: torch.fx.GraphModule, inputs: Any, **kw: Any) -> Any:
        fw, bw = self.partition(joint, inputs, **kw)
        self.fw.append(fw)
        self.bw.append(bw)
        self.bytes.append(partition_report(fw, bw, kw["num_fwd_outputs"]).saved_bytes)
        return fw, bw


def _targets(gm: torch.fx.GraphModule) -> list[Any]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_min_cut_recomputes_a_mask_when_that_saves_bytes() -> None:
    # The attention probabilities are saved for the matmul anyway: the dropout mask is
    # recomputed from them and a 5,056-byte state instead of being saved.
    on, off = (
        Graphs(min_cut_rematerialization_partition),
        Graphs(min_cut_rematerialization_partition),
    )
    fn = program("attention", False)
    x = torch.randn(64, 16, requires_grad=True)
    w = torch.randn(16, 16, requires_grad=True)
    aot_function(fn, nop, nop, partition_fn=on)(x, w).backward()
    with functionalize_rng(False):
        aot_function(fn, nop, nop, partition_fn=off)(x, w).backward()
    assert run_and_save_rng_state in _targets(on.fw[0])
    assert run_with_rng_state in _targets(on.bw[0])
    assert run_and_save_rng_state not in _targets(off.fw[0])
    assert not any(
        isinstance(t, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in t.tags
        for t in _targets(off.bw[0])
    )
    assert on.bytes[0] < off.bytes[0]


def test_min_cut_does_not_replay_attention_with_dropout() -> None:
    # scaled_dot_product_attention with dropout draws (it is random) but is compute-heavy:
    # the backward receives its outputs instead of running it again from a saved state
    graphs = Graphs(min_cut_rematerialization_partition)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).sin().sum()

    q, k, v = (torch.randn(1, 2, 8, 4, requires_grad=True) for _ in range(3))
    aot_function(fn, nop, nop, partition_fn=graphs)(q, k, v).backward()
    assert run_and_save_rng_state not in _targets(graphs.fw[0])
    assert run_with_rng_state not in _targets(graphs.bw[0])
    assert not any(
        isinstance(t, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in t.tags
        for t in _targets(graphs.bw[0])
    )


def test_min_cut_saves_a_draw_smaller_than_a_state() -> None:
    # 16 floats of noise (64 bytes) are cheaper to save than a generator state (5,056).
    graphs = Graphs(min_cut_rematerialization_partition)

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return ((x * torch.rand(16)).sin() @ w).sum()

    x = torch.randn(64, 16, requires_grad=True)
    w = torch.randn(16, 16, requires_grad=True)
    aot_function(fn, nop, nop, partition_fn=graphs)(x, w).backward()
    assert run_and_save_rng_state not in _targets(graphs.fw[0])
    assert run_with_rng_state not in _targets(graphs.bw[0])
    assert torch.ops.aten.rand.default in _targets(graphs.fw[0])


def test_switch_off_refuses_checkpoint_recomputation_that_draws() -> None:
    # This test pinned a silent wrong result (fresh masks in the recomputation, gradients
    # unlike eager's). See Note [Checkpointed random ops with functionalized RNG off].
    fn = program("dropout", True)
    graphs = Graphs(default_partition)
    with functionalize_rng(False):
        compiled = aot_function(fn, nop, nop, partition_fn=graphs)
        with pytest.raises(RuntimeError, match="functionalized RNG.*set_functionalize_rng"):
            observe(compiled, calls=1)
    assert not graphs.fw and not graphs.bw


@pytest.mark.parametrize("solver", ["greedy", "milp"])
def test_memory_budget_sweep_with_random_ops(solver: str) -> None:
    # Bytes (the generator states of replayed draws included) never grow as the budget
    # falls, and every budget's pair draws what eager draws.
    fn = program("attention", True)
    expected = observe(fn)
    sweep = []
    for budget in (1.0, 0.75, 0.5, 0.25, 0.0):
        graphs = Graphs(memory_budget_partition(budget, solver=solver))  # type: ignore[arg-type]
        assert_same(expected, observe(aot_function(fn, nop, nop, partition_fn=graphs)))
        sweep.append(graphs.bytes[0])
    assert sweep == sorted(sweep, reverse=True), sweep

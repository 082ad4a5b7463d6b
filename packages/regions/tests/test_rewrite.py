"""aotkit_regions on its own: dynamo's graph of a model with repeated blocks (captured by a
plain backend, no aotkit compiler), rewritten with one invoke_subgraph per distinct region,
runs as the graph did (forward and backward, bitwise); the switch off leaves it alone."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from aotkit_regions import share_repeated_regions


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.l1 = nn.Linear(d, 2 * d)
        self.l2 = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.l2(torch.tanh(self.l1(x)))
        return out


class Net(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(8) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.sum()


def _dynamo_graph(model: nn.Module, x: torch.Tensor) -> tuple[torch.fx.GraphModule, list[Any]]:
    captured: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        captured.append((gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=backend, fullgraph=True)(x)
    (gm, inputs), = captured
    return gm, inputs


def _run(gm: torch.fx.GraphModule, inputs: list[Any]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    leaves = [i for i in inputs if isinstance(i, torch.Tensor) and i.requires_grad]
    for leaf in leaves:
        leaf.grad = None
    out = gm(*inputs)
    loss = out[0] if isinstance(out, (tuple, list)) else out
    loss.backward()
    return loss.detach(), [leaf.grad.clone() for leaf in leaves if leaf.grad is not None]


def test_repeats_share_one_subgraph_and_run_as_before() -> None:
    torch.manual_seed(0)
    gm, inputs = _dynamo_graph(Net(6), torch.randn(4, 8))
    expected = _run(gm, inputs)
    report = share_repeated_regions(gm, threshold=3)
    assert len(report.shared) == 1, report
    (paths,) = report.shared.values()
    # the first block reads the graph's input (no grad), the others an activation: its
    # input metadata differs, so it stays on its own
    assert paths == [f"L['self'].blocks.{i}" for i in range(1, 6)], paths
    calls = [n for n in gm.graph.nodes
             if n.target is torch.ops.higher_order.invoke_subgraph]
    assert len(calls) == 5
    assert len({c.args[1] for c in calls}) == 1  # one identifier for every repeat
    got = _run(gm, inputs)
    assert torch.equal(got[0], expected[0])
    assert len(got[1]) == len(expected[1]) > 0
    for g, e in zip(got[1], expected[1], strict=True):
        assert torch.equal(g, e)


def test_off_or_too_few_repeats_leave_the_graph() -> None:
    torch.manual_seed(0)
    gm, _ = _dynamo_graph(Net(2), torch.randn(4, 8))
    before = gm.code
    assert share_repeated_regions(gm, threshold=0).skipped == "region sharing is off"
    report = share_repeated_regions(gm, threshold=3)
    assert not report.shared and gm.code == before

"""Note [Preserved node meta]: torch's test_aot_module_simplified_preserves_stack_trace and
..._from_mutation, on aotkit, plus nn_module_stack."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from aotkit_frontends import aot_module_simplified

THIS_FILE = "test_node_meta.py"


def _traced(mod: torch.nn.Module) -> torch.fx.GraphModule:
    tracer = torch.fx.Tracer()
    tracer.record_stack_traces = True
    graph = tracer.trace(mod)
    gm = torch.fx.GraphModule(tracer.root, graph)
    for node in gm.graph.nodes:
        if node.op == "call_function":
            assert node.stack_trace is not None and THIS_FILE in node.stack_trace
    return gm


class _Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(20, 30)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        z = self.linear(x)
        z = z + y
        z = z.relu()
        return (z,)


class _MutatesView(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        x_view = x[0]
        x_view.mul_(2)
        return (x + x,)


@pytest.mark.parametrize("partition", ["default", "min_cut"])
def test_every_forward_and_backward_node_keeps_its_stack_trace(partition: str) -> None:
    seen: dict[str, int] = {}

    def assert_compiler(gm: torch.fx.GraphModule, _: Any) -> Any:
        for node in gm.graph.nodes:
            if node.op in ("output", "placeholder"):
                continue
            assert node.stack_trace is not None, node.format_node()
            assert THIS_FILE in node.stack_trace, node.format_node()
        seen[str(len(seen))] = len(gm.graph.nodes)
        return gm.forward

    x = torch.randn(128, 20, requires_grad=True)
    y = torch.randn(128, 30, requires_grad=True)
    compiled = aot_module_simplified(
        _traced(_Linear()), [x, y], fw_compiler=assert_compiler, bw_compiler=assert_compiler,
        partition_fn=partition,  # type: ignore[arg-type]  # a registered name
    )
    res = compiled(x, y)
    res[0].sum().backward()
    assert len(seen) == 2  # the forward and the backward were both checked


def test_forward_nodes_keep_nn_module_stack() -> None:
    found: list[str] = []

    def compiler(gm: torch.fx.GraphModule, _: Any) -> Any:
        for node in gm.graph.nodes:
            if node.target is torch.ops.aten.addmm.default:
                found.extend(node.meta.get("nn_module_stack", {}))
        return gm.forward

    x = torch.randn(4, 20, requires_grad=True)
    y = torch.randn(4, 30)
    aot_module_simplified(_traced(_Linear()), [x, y], fw_compiler=compiler, bw_compiler=compiler)
    assert any("linear" in key for key in found), found


def test_copy_from_mutation_keeps_the_mutating_line() -> None:
    copies: list[str] = []

    def assert_compiler(gm: torch.fx.GraphModule, _: Any) -> Any:
        for node in gm.graph.nodes:
            if node.target is torch.ops.aten.copy_.default:
                assert "stack_trace" in node.meta
                copies.append(node.meta["stack_trace"])
        return gm.forward

    aot_module_simplified(
        _traced(_MutatesView()), [torch.randn(128, 20)], fw_compiler=assert_compiler,
        bw_compiler=assert_compiler, keep_inference_input_mutations=True,
    )
    assert copies and all("x_view.mul_(2)" in s for s in copies), copies

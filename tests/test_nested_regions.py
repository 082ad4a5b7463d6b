"""Programs that use ``torch.compiler.nested_compile_region``: bitwise equal to eager
through aotkit_eager, equal to torch's aot_eager, each distinct region's joint traced and
partitioned once, and split at the region boundary (See Note [Partitioning at region
boundaries] in aotkit_partitioners)."""

from __future__ import annotations

import importlib
from typing import Any

import torch
from aotkit import aot_autograd
from aotkit_partitioners import min_cut_rematerialization_partition, region_partition_count

# the module (the package attribute of that name is the HOP itself)
torch_invoke_subgraph = importlib.import_module("torch._higher_order_ops.invoke_subgraph")


@torch.compiler.nested_compile_region
def _block_a(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ w) + x


@torch.compiler.nested_compile_region
def _block_b(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x * w.sum(0)).tanh()


def _program(x: torch.Tensor, wa: torch.Tensor, wb: torch.Tensor) -> torch.Tensor:
    # block a three times, block b twice: two distinct regions, repeated (dynamo inlines
    # a region called only once)
    y = _block_a(_block_a(_block_a(x, wa), wa), wa)
    return _block_b(_block_b(y, wb), wb).sum()


def _args() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(4, 8, requires_grad=True) for _ in range(1)] + [
        torch.randn(8, 8, requires_grad=True),
        torch.randn(8, 8, requires_grad=True),
    ]


def _run(fn: Any, args: list[torch.Tensor]) -> list[torch.Tensor]:
    args = [a.detach().clone().requires_grad_() for a in args]
    out = fn(*args)
    out.backward()
    return [out.detach(), *(a.grad for a in args)]


def _graphs_recorder(store: list[torch.fx.GraphModule]) -> Any:
    def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        store.append(gm)
        return gm

    return compiler


def test_nested_regions_aotkit_eager_bitwise_and_traced_once(monkeypatch: Any) -> None:
    traces = []
    original = torch_invoke_subgraph.trace_joint_graph_as_bwd

    def counted(*a: Any, **k: Any) -> Any:
        traces.append(1)
        return original(*a, **k)

    monkeypatch.setattr(torch_invoke_subgraph, "trace_joint_graph_as_bwd", counted)
    args = _args()
    expected = _run(_program, args)
    torch._dynamo.reset()
    before = region_partition_count()
    got = _run(torch.compile(_program, backend="aotkit_eager", fullgraph=True), args)
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e)
    # five region calls, two distinct regions: block a's joint is traced once for its three
    # calls; block b's twice, as in torch: its last call's tangent is sum()'s expanded
    # gradient, its first call's a contiguous one, and torch keys a region's backward on
    # its tangents' metadata. Each traced joint is partitioned once.
    assert len(traces) == 3
    assert region_partition_count() - before == 3
    torch._dynamo.reset()
    oracle = _run(torch.compile(_program, backend="aot_eager", fullgraph=True), args)
    for g, o in zip(got, oracle, strict=True):
        assert torch.equal(g, o)


def test_nested_regions_split_at_the_boundary() -> None:
    fws: list[torch.fx.GraphModule] = []
    bws: list[torch.fx.GraphModule] = []
    backend = aot_autograd(
        fw_compiler=_graphs_recorder(fws), bw_compiler=_graphs_recorder(bws),
        partition_fn=min_cut_rematerialization_partition,
    )
    args = _args()
    torch._dynamo.reset()
    got = _run(torch.compile(_program, backend=backend, fullgraph=True), args)
    for g, e in zip(got, _run(_program, args), strict=True):
        assert torch.equal(g, e)
    (fw,), (bw,) = fws, bws

    def calls(gm: torch.fx.GraphModule) -> list[str]:
        return [
            str(n.args[1]) for n in gm.graph.nodes
            if n.target is torch.ops.higher_order.invoke_subgraph
        ]

    # one subgraph per distinct region joint in each graph, shared by the repeats (block
    # b has two: See the tangent metadata above)
    assert len(set(calls(fw))) == 3 and len(set(calls(bw))) == 3
    assert calls(fw).count("partitioned_fw_subgraph_0_0") == 3
    assert len(calls(fw)) == 5 and len(calls(bw)) == 5
    assert all(c.startswith("partitioned_fw") for c in calls(fw))
    assert all(c.startswith("partitioned_bw") for c in calls(bw))
    # the backward's region graphs do not recompute the forward's matmul
    for name, sub in bw.named_children():
        assert isinstance(sub, torch.fx.GraphModule), name
        mms = [n for n in sub.graph.nodes if n.target is torch.ops.aten.mm.default]
        # gelu(x @ w)'s backward: two matmuls (grad of x and of w); the forward's is saved
        assert len(mms) <= 2, sub.print_readable(False)

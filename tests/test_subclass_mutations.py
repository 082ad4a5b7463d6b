"""Subclass inputs mutated through their inner tensors, kept in the graph, and aliased by
outputs: eager, aotkit and torch's AOTAutograd agree (See Note [Tensor subclasses are
desugared] in aotkit_schemas)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aotkit
import functorch.compile as torch_compile
import pytest
import torch
import torch._dynamo
from aotkit_functional import mutable_ops_in_graph
from test_subclass_layer import Graphs, _recording, assert_plain_graphs, assert_same, two
from torch.testing._internal.two_tensor import TwoTensor


def _mutate_and_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.mul_(2)
    return x + y


def _make() -> list[Any]:
    torch.manual_seed(0)
    return [two(3, requires_grad=False), torch.randn(3, requires_grad=True)]


def _copies_into_inputs(gm: torch.fx.GraphModule) -> list[str]:
    placeholders = {n for n in gm.graph.nodes if n.op == "placeholder"}
    return [
        n.args[0].name
        for n in gm.graph.nodes
        if n.op == "call_function"
        and n.target is torch.ops.aten.copy_.default
        and n.args[0] in placeholders
    ]


@pytest.mark.parametrize("grad", [True, False])
def test_kept_in_graph_mutation_of_a_subclass_input(grad: bool) -> None:
    def run(fn: Callable[..., Any]) -> tuple[Any, Any, Any]:
        args = _make()
        with torch.set_grad_enabled(grad):
            out = fn(*args)
        if grad:
            out.sum().backward()
        return out.detach(), args[0], args[1].grad

    expected = run(_mutate_and_add)
    graphs: Graphs = []
    examples: list[list[Any]] = []
    rec = _recording(graphs, examples, aotkit.nop)
    got = run(aotkit.aot_function(_mutate_and_add, rec, rec, keep_inference_input_mutations=True))
    oracle = run(
        torch_compile.aot_function(
            _mutate_and_add, torch_compile.nop, keep_inference_input_mutations=True
        )
    )
    for g, e, o in zip(got, expected, oracle, strict=True):
        assert_same(g, e)
        assert_same(g, o)
    assert_plain_graphs(graphs, examples)
    # the write to both inner tensors stays in the forward (or inference) graph as copy_
    names = ["primals_1", "primals_2"] if grad else ["arg0_1", "arg1_1"]
    assert sorted(_copies_into_inputs(graphs[0])) == names
    for gm in graphs:
        assert not mutable_ops_in_graph(gm.graph, allow_input_copies=True)


@pytest.mark.parametrize("backend", ["aotkit_eager", "aot_eager"])
def test_torch_compile_mutation_of_a_subclass_input(backend: str) -> None:
    torch._dynamo.reset()
    aotkit.register_dynamo_backends()
    expected_args = _make()
    expected = _mutate_and_add(*expected_args)
    expected.sum().backward()
    args = _make()
    got = torch.compile(_mutate_and_add, backend=backend, fullgraph=True)(*args)
    got.sum().backward()
    assert_same(got.detach(), expected.detach())
    assert_same(args[0], expected_args[0])
    assert_same(args[1].grad, expected_args[1].grad)


def test_output_view_of_a_subclass_input_three_ways() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.t(), x[1:] * 2

    def run(fn: Callable[..., Any]) -> tuple[Any, ...]:
        torch.manual_seed(0)
        leaf = two(3, 4)
        x = leaf * 1
        view, other = fn(x)
        assert view._is_view() and view._base is x
        assert isinstance(view, TwoTensor)
        assert (view.a.stride(), view.b.stride()) == ((1, 4), (1, 4))
        (view.sum() + other.sum()).backward()
        return view.detach(), other.detach(), leaf.grad

    expected = run(f)
    graphs: Graphs = []
    examples: list[list[Any]] = []
    rec = _recording(graphs, examples, aotkit.nop)
    got = run(aotkit.aot_function(f, rec, rec))
    oracle = run(torch_compile.aot_function(f, torch_compile.nop))
    assert_same(got, expected)
    assert_same(got, oracle)
    assert_plain_graphs(graphs, examples)


def test_mutated_subclass_input_returned_as_a_view() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x.view(-1)

    def run(fn: Callable[..., Any]) -> tuple[Any, Any]:
        torch.manual_seed(0)
        x = two(2, 3, requires_grad=False)
        out = fn(x)
        assert out._is_view() and out._base is x
        return out, x

    expected = run(f)
    graphs: Graphs = []
    examples: list[list[Any]] = []
    rec = _recording(graphs, examples, aotkit.nop)
    got = run(aotkit.aot_function(f, rec, rec))
    oracle = run(torch_compile.aot_function(f, torch_compile.nop))
    assert_same(got, expected)
    assert_same(got, oracle)
    assert_plain_graphs(graphs, examples)


def _t_(x: torch.Tensor) -> torch.Tensor:
    x.t_()
    return x * 2


@pytest.mark.parametrize("grad", [False, True])
def test_metadata_mutation_of_a_subclass_input(grad: bool) -> None:
    """torch 2.15 replays it with as_strided_, which the subclass applies to its inner
    tensors (older torch raised "Metadata mutations are currently not allowed")."""

    def run(fn: Callable[..., Any]) -> tuple[Any, ...]:
        torch.manual_seed(0)
        leaf = two(2, 3, requires_grad=grad)
        x = leaf * 1 if grad else leaf
        out = fn(x)
        if grad:
            out.sum().backward()
        inner = (x.a.shape, x.a.stride(), x.b.shape, x.b.stride())
        return out.detach(), x.detach(), x.shape, x.stride(), inner, leaf.grad

    expected = run(_t_)
    graphs: Graphs = []
    examples: list[list[Any]] = []
    rec = _recording(graphs, examples, aotkit.nop)
    got = run(aotkit.aot_function(_t_, rec, rec))
    oracle = run(torch_compile.aot_function(_t_, torch_compile.nop))
    assert_same(got, expected)
    assert_same(got, oracle)
    assert_plain_graphs(graphs, examples)


def test_subclass_created_inside_with_symbolic_sizes() -> None:
    """See Note [Symbolic outer sizes of subclasses] in aotkit_schemas: a subclass output
    whose outer size is symbolic is rebuilt with its run-time size, one graph for all."""

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        t = TwoTensor(x, y * 2)
        return (t * x).sin()

    graphs: Graphs = []
    examples: list[list[Any]] = []
    rec = _recording(graphs, examples, aotkit.nop)
    g = aotkit.aot_function(f, rec, dynamic=True)
    for n in (3, 4, 7):
        x, y = torch.randn(n), torch.randn(n)
        got, expected = g(x, y), f(x, y)
        assert_same(got, expected)
        assert got.stride() == expected.stride()
    assert len(graphs) == 1
    assert_plain_graphs(graphs, examples)


def _dyn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x * y).sin().sum(1) + x[:, 0]


def test_subclass_input_with_symbolic_sizes() -> None:
    """TwoTensor under aot_function(dynamic=True) across batch sizes: one graph, eager's
    values and gradients (See Note [Symbolic outer sizes of subclasses])."""
    graphs: Graphs = []
    examples: list[list[Any]] = []
    rec = _recording(graphs, examples, aotkit.nop)
    g = aotkit.aot_function(_dyn, rec, rec, dynamic=True)
    for batch in (3, 4, 7, 2):
        results = []
        for fn in (_dyn, g):
            torch.manual_seed(batch)
            x, y = two(batch, 5), torch.randn(batch, 5, requires_grad=True)
            out = fn(x, y)
            out.sum().backward()
            results.append((out.detach(), x.grad, y.grad))
        assert_same(results[1], results[0])
    assert len(graphs) == 2  # one forward and one backward for every batch size
    assert_plain_graphs(graphs, examples)


@pytest.mark.parametrize("backend", ["aotkit_eager", "aot_eager"])
def test_torch_compile_dynamic_subclass_input(backend: str) -> None:
    torch._dynamo.reset()
    aotkit.register_dynamo_backends()
    compiled = torch.compile(_dyn, backend=backend, dynamic=True, fullgraph=True)
    for batch in (3, 4, 7):
        results = []
        for fn in (_dyn, compiled):
            torch.manual_seed(batch)
            x, y = two(batch, 5), torch.randn(batch, 5, requires_grad=True)
            out = fn(x, y)
            out.sum().backward()
            results.append((out.detach(), x.grad, y.grad))
        assert_same(results[1], results[0])

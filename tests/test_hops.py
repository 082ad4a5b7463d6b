"""Higher-order operators (Note [Higher-order operators] in aotkit_tracing): ``torch.cond``,
``while_loop``, ``map`` (nested too), non-reentrant checkpoint, ``invoke_subgraph`` and
``flex_attention``, through ``aot_function``/``aot_module``, every partitioner,
``torch.compile`` (aotkit_eager, aotkit_inductor) and ``aot_export_module`` (pre_dispatch
too). Each case is differential: eager, aotkit and torch's AOTAutograd (or torch.compile's
aot_eager where torch's aot_function cannot run the HOP) must agree on outputs and
gradients, and every graph a compiler receives, subgraphs included, must be functional.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import functorch.compile as torch_compile
import pytest
import torch
import torch._functorch.aot_autograd as torch_aot
import torch.utils.checkpoint as cp
from aotkit import aot_autograd, aot_export_module, aot_function, aot_module, nop
from aotkit_backends import graph_function
from aotkit_capture import AOTCompileError, record_compilations
from aotkit_partitioners import (
    default_partition,
    memory_budget_partition,
    min_cut_rematerialization_partition,
)
from torch._C import DispatchKey
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.while_loop import while_loop
from torch._ops import HigherOrderOperator

PARTITIONERS: dict[str, tuple[Any, Any]] = {
    # aotkit's partitioner, torch's counterpart for the oracle
    "default": (default_partition, torch_compile.default_partition),
    "min_cut": (min_cut_rematerialization_partition, torch_compile.min_cut_rematerialization_partition),
    "memory_budget": (memory_budget_partition(0.5), torch_compile.min_cut_rematerialization_partition),
}


def _graphs(gm: torch.fx.GraphModule) -> Iterator[torch.fx.GraphModule]:
    yield gm
    for sub in gm.children():
        if isinstance(sub, torch.fx.GraphModule):
            yield from _graphs(sub)


def _hop_names(gm: torch.fx.GraphModule) -> set[str]:
    return {
        n.target.name()
        for g in _graphs(gm)
        for n in g.graph.nodes
        if n.op == "call_function" and isinstance(n.target, HigherOrderOperator)
    }


def _assert_functional(gm: torch.fx.GraphModule) -> None:
    for g in _graphs(gm):
        for n in g.graph.nodes:
            if n.op != "call_function":
                continue
            schema = getattr(n.target, "_schema", None)
            assert schema is None or not schema.is_mutable, f"mutable op {n.target} in\n{g.code}"
            if isinstance(n.target, HigherOrderOperator):
                # its subgraphs are get_attr nodes of this graph
                for a in n.args:
                    if isinstance(a, torch.fx.Node) and a.op == "get_attr":
                        assert isinstance(getattr(g, str(a.target)), torch.fx.GraphModule)


class Recorder:
    """A compiler (aotkit's nop underneath) that checks and keeps every graph it gets."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        _assert_functional(gm)
        # nop runs the graph through a graph function, which calls HOPs with their
        # subgraph modules (Note [Graph functions] in aotkit_backends)
        assert graph_function(gm) is not None
        self.graphs.append(gm)
        return nop(gm, example_inputs)

    def hops(self) -> set[str]:
        return set().union(*(_hop_names(g) for g in self.graphs))


def _clone_args(args: list[torch.Tensor]) -> list[torch.Tensor]:
    return [a.detach().clone().requires_grad_(a.requires_grad) for a in args]


def _run(f: Callable[..., Any], args: list[torch.Tensor]) -> tuple[Any, list[Any]]:
    out = f(*args)
    outs = out if isinstance(out, tuple | list) else (out,)
    if any(o.requires_grad for o in outs):
        sum(o.sum() for o in outs if o.requires_grad).backward()
    return out, [a.grad for a in args]


def _assert_same(a: Any, b: Any) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _differential(
    f: Callable[..., Any],
    args: list[torch.Tensor],
    partitioner: str = "default",
    *,
    torch_oracle: bool = True,
) -> Recorder:
    """eager vs aotkit's aot_function vs torch's aot_function; returns aotkit's recorder."""
    rec = Recorder()
    ours, theirs = PARTITIONERS[partitioner]
    expected, expected_grads = _run(f, _clone_args(args))
    got, grads = _run(aot_function(f, rec, partition_fn=ours), _clone_args(args))
    _assert_same(got, expected)
    _assert_same(grads, expected_grads)
    if torch_oracle:
        oracle = torch_compile.aot_function(f, torch_compile.nop, partition_fn=theirs)
        t_out, t_grads = _run(oracle, _clone_args(args))
        _assert_same(got, t_out)
        _assert_same(grads, t_grads)
    return rec


# ---------------------------------------------------------------- torch.cond


def _cond(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    def true_fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x.sin() * w).cos()

    def false_fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x.cos() * w.exp()

    return torch.cond(x.sum() > 0, true_fn, false_fn, (x, w))


@pytest.mark.parametrize("partitioner", sorted(PARTITIONERS))
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true_branch", "false_branch"])
def test_cond_training_both_branches(partitioner: str, sign: float) -> None:
    x = (torch.rand(4) + 0.1) * sign
    rec = _differential(_cond, [x.requires_grad_(), torch.randn(4, requires_grad=True)], partitioner)
    # the forward and the backward each keep the cond with its two subgraphs
    assert len(rec.graphs) == 2
    for gm in rec.graphs:
        assert "cond" in _hop_names(gm)
        subgraphs = [n for n in gm.graph.nodes if n.op == "get_attr"]
        assert len(subgraphs) == 2


def test_cond_same_compiled_function_runs_both_branches() -> None:
    compiled = aot_function(_cond, nop)
    w = torch.randn(4)
    for sign in (1.0, -1.0, 1.0):
        x = (torch.rand(4) + 0.1) * sign
        x1, w1 = x.clone().requires_grad_(), w.clone().requires_grad_()
        x2, w2 = x.clone().requires_grad_(), w.clone().requires_grad_()
        out, grads = _run(compiled, [x1, w1])
        expected, expected_grads = _run(_cond, [x2, w2])
        _assert_same(out, expected)
        _assert_same(grads, expected_grads)
    assert len(compiled._aotkit_cache.entries) == 1  # type: ignore[attr-defined]


def test_cond_python_bool_predicate() -> None:
    def f(x: torch.Tensor, w: torch.Tensor, flag: bool) -> torch.Tensor:
        return torch.cond(flag, lambda x, w: x * w, lambda x, w: x + w.sin(), (x, w))

    for flag in (True, False):
        args = [torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)]
        rec = _differential(lambda x, w, flag=flag: f(x, w, flag), args)
        assert rec.hops() == set()  # a constant predicate specializes, as in torch


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true_branch", "false_branch"])
def test_cond_inference(sign: float) -> None:
    x = (torch.rand(4) + 0.1) * sign
    rec = _differential(_cond, [x, torch.randn(4)])
    assert len(rec.graphs) == 1 and rec.hops() == {"cond"}


class _CondModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.scale = torch.nn.Parameter(torch.randn(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the branches close over the module's parameters
        return torch.cond(
            x.sum() > 0,
            lambda x: self.lin(x).relu() * self.scale,
            lambda x: self.lin(x).tanh() - self.scale,
            (x,),
        )


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true_branch", "false_branch"])
def test_cond_aot_module_closes_over_parameters(sign: float) -> None:
    torch.manual_seed(0)
    eager = _CondModule()
    ours = _CondModule()
    ours.load_state_dict(eager.state_dict())
    theirs = _CondModule()
    theirs.load_state_dict(eager.state_dict())
    x = (torch.rand(2, 3) + 0.1) * sign
    rec = Recorder()
    results = []
    for m, run in (
        (eager, eager),
        (ours, aot_module(ours, rec)),
        (theirs, torch_compile.aot_module(theirs, torch_compile.nop)),
    ):
        out = run(x)
        out.sum().backward()
        results.append((out, [p.grad for p in m.parameters()]))
    for out, grads in results[1:]:
        _assert_same(out, results[0][0])
        _assert_same(grads, results[0][1])
    assert rec.hops() == {"cond"}


def test_cond_path_reason_names_the_hop() -> None:
    with record_compilations() as compiled:
        _run(aot_function(_cond, nop), [torch.randn(3, requires_grad=True), torch.randn(3)])
    (artifacts,) = compiled
    assert artifacts.path == "python"
    reason = "the higher-order operator cond needs the Python functionalization mode"
    assert artifacts.single_pass_skipped == reason
    assert artifacts.native_skipped == reason


@pytest.mark.parametrize("backend", ["aotkit_eager", "aotkit_inductor"])
def test_cond_torch_compile(backend: str) -> None:
    torch._dynamo.reset()
    ours = torch.compile(_cond, backend=backend, fullgraph=True)
    theirs = torch.compile(_cond, backend="aot_eager", fullgraph=True)
    w = torch.randn(4)
    for sign in (1.0, -1.0):
        x = (torch.rand(4) + 0.1) * sign
        expected = _run(_cond, [x.clone().requires_grad_(), w.clone().requires_grad_()])
        got = _run(ours, [x.clone().requires_grad_(), w.clone().requires_grad_()])
        oracle = _run(theirs, [x.clone().requires_grad_(), w.clone().requires_grad_()])
        _assert_same(got, expected)
        _assert_same(got, oracle)


# ---------------------------------------------------------------- while_loop


def _while(i: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return while_loop(lambda i, x: i < 5, lambda i, x: (i + 1, x * 2 + x.sin()), (i, x))


def test_while_loop_inference() -> None:
    rec = Recorder()
    args = [torch.tensor(0), torch.randn(3)]
    expected = _while(*args)
    got = aot_function(_while, rec)(*args)
    torch._dynamo.reset()
    oracle = torch.compile(_while, backend="aot_eager")(*args)
    _assert_same(got, expected)
    _assert_same(got, oracle)
    assert rec.hops() == {"while_loop"}
    # other trip counts reuse the entry
    args = [torch.tensor(2), torch.randn(3)]
    _assert_same(aot_function(_while, nop)(*args), _while(*args))


@pytest.mark.parametrize("backend", ["aotkit_eager", "aotkit_inductor"])
def test_while_loop_torch_compile(backend: str) -> None:
    torch._dynamo.reset()
    args = [torch.tensor(1), torch.randn(3)]
    _assert_same(torch.compile(_while, backend=backend)(*args), _while(*args))


# ---------------------------------------------------------------- map


def _map(xs: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return hop_map(lambda x, w: (x * w).sin(), xs, w)


def _nested_map(xs: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    def body(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return hop_map(lambda y, w: y.cos() * w, x, w)

    return hop_map(body, xs, w)


@pytest.mark.parametrize("partitioner", sorted(PARTITIONERS))
def test_map_training(partitioner: str) -> None:
    args = [torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)]
    rec = _differential(_map, args, partitioner)
    assert len(rec.graphs) == 2 and rec.hops() == {"map_impl"}


def test_nested_map_training() -> None:
    args = [torch.randn(2, 4, 3, requires_grad=True), torch.randn(3, requires_grad=True)]
    rec = _differential(_nested_map, args)
    fw = rec.graphs[0]
    (outer,) = [n for n in fw.graph.nodes if n.op == "get_attr"]
    # the inner map lives in the outer map's body
    assert "map_impl" in _hop_names(getattr(fw, str(outer.target)))


def test_map_inference() -> None:
    rec = _differential(_nested_map, [torch.randn(2, 4, 3), torch.randn(3)])
    assert rec.hops() == {"map_impl"}


# ---------------------------------------------------------------- checkpoint


def _checkpointed(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    def region(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x @ w).relu().sin() @ w

    return cp.checkpoint(region, x, w, use_reentrant=False).cos()


@pytest.mark.parametrize("partitioner", sorted(PARTITIONERS))
def test_checkpoint_aot_function(partitioner: str) -> None:
    args = [torch.randn(4, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)]
    _differential(_checkpointed, args, partitioner)


@pytest.mark.parametrize("backend", ["aotkit_eager", "aotkit_inductor"])
def test_checkpoint_torch_compile(backend: str) -> None:
    torch._dynamo.reset()
    args = [torch.randn(4, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)]
    expected = _run(_checkpointed, _clone_args(args))
    got = _run(torch.compile(_checkpointed, backend=backend), _clone_args(args))
    oracle = _run(torch.compile(_checkpointed, backend="aot_eager"), _clone_args(args))
    _assert_same(got, expected)
    _assert_same(got, oracle)


# ---------------------------------------------------------------- invoke_subgraph


@torch.compiler.nested_compile_region
def _region(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x @ w).sin()


def _invoke_twice(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _region(_region(x, w), w)


def test_invoke_subgraph_aot_function() -> None:
    args = [torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)]
    _differential(_invoke_twice, args)


@pytest.mark.parametrize("backend", ["aotkit_eager", "aotkit_inductor"])
def test_invoke_subgraph_torch_compile(backend: str) -> None:
    torch._dynamo.reset()
    args = [torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)]
    expected = _run(_invoke_twice, _clone_args(args))
    got = _run(torch.compile(_invoke_twice, backend=backend, fullgraph=True), _clone_args(args))
    oracle = _run(torch.compile(_invoke_twice, backend="aot_eager", fullgraph=True), _clone_args(args))
    _assert_same(got, expected)
    _assert_same(got, oracle)


def test_invoke_subgraph_reaches_the_compiler() -> None:
    torch._dynamo.reset()
    rec = Recorder()
    args = [torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)]
    backend = aot_autograd(fw_compiler=rec, bw_compiler=rec)
    got = _run(torch.compile(_invoke_twice, backend=backend, fullgraph=True), _clone_args(args))
    _assert_same(got, _run(_invoke_twice, _clone_args(args)))
    assert "invoke_subgraph" in rec.hops()


# ---------------------------------------------------------------- flex_attention


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    def score_mod(score: torch.Tensor, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> torch.Tensor:
        return score + (q_idx - kv_idx).to(score.dtype) * 0.1

    out = flex_attention(q, k, v, score_mod=score_mod)
    assert isinstance(out, torch.Tensor)
    return out


def _qkv(requires_grad: bool = False) -> list[torch.Tensor]:
    return [torch.randn(1, 2, 16, 8, requires_grad=requires_grad) for _ in range(3)]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_flex_attention_inference_aot_function() -> None:
    rec = _differential(_flex, _qkv())
    assert rec.hops() == {"flex_attention"}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("backend", ["aotkit_eager", "aotkit_inductor"])
def test_flex_attention_inference_torch_compile(backend: str) -> None:
    torch._dynamo.reset()
    args = _qkv()
    expected = _flex(*args)
    _assert_same(torch.compile(_flex, backend=backend)(*args), expected)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_flex_attention_training_raises_torchs_cpu_error() -> None:
    # torch 2.15 has no flex_attention backward on CPU; aotkit raises the same error
    with pytest.raises(NotImplementedError, match="FlexAttention does not support backward on CPU"):
        _flex(*_qkv(requires_grad=True))
    with pytest.raises(NotImplementedError, match="FlexAttention does not support backward on CPU"):
        aot_function(_flex, nop)(*_qkv(requires_grad=True))


# ---------------------------------------------------------------- export


class _ExportCond(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, 4))
        self.register_buffer("b", torch.randn(4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def true_fn(x: torch.Tensor) -> torch.Tensor:
            y = x + 4
            y.add_(5)  # a mutation of an intermediate inside a branch
            return (y * self.b).cos()

        def false_fn(x: torch.Tensor) -> torch.Tensor:
            return x.sin() - self.b

        a = torch.cond(x.sum() > 4, true_fn, false_fn, [x])
        return (a + 3, a @ self.w.t())


class _ExportNestedCond(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        def true_fn(x: torch.Tensor) -> torch.Tensor:
            y = x.sin()
            y.add_(5)
            return torch.cond(y.cos().sum() > 5, lambda t: t.sin() + 7, lambda t: t.cos(), [y.cos()])

        def false_fn(x: torch.Tensor) -> torch.Tensor:
            z = x.cos()
            z.add_(6)
            return z.sin()

        return (torch.cond(x.sum() > 4, true_fn, false_fn, [x]),)


def _codes(gm: torch.fx.GraphModule) -> dict[str, str]:
    return {name: g.code for name, g in gm.named_modules() if isinstance(g, torch.fx.GraphModule)}


@pytest.mark.parametrize("pre_dispatch", [False, True], ids=["post_dispatch", "pre_dispatch"])
@pytest.mark.parametrize("module", [_ExportCond, _ExportNestedCond], ids=["cond", "nested"])
def test_cond_aot_export_module_matches_torch(module: type[torch.nn.Module], pre_dispatch: bool) -> None:
    torch.manual_seed(0)
    m = module()
    x = torch.randn(3, 4)
    ours, our_sig = aot_export_module(m, [x], trace_joint=False, pre_dispatch=pre_dispatch)
    theirs, their_sig = torch_aot.aot_export_module(m, [x], trace_joint=False, pre_dispatch=pre_dispatch)
    # the graph has the cond and its subgraphs, with torch's structure and text
    assert _codes(ours) == _codes(theirs)
    assert "cond" in _hop_names(ours)
    _assert_functional(ours)
    for field in ("parameters", "buffers", "user_inputs", "user_outputs", "inputs_to_parameters",
                  "inputs_to_buffers", "buffers_to_mutate"):
        assert getattr(our_sig, field) == getattr(their_sig, field), field
    # and it computes what the module computes, on both branches
    for sign in (1.0, -1.0):
        xs = x.abs() * sign + sign
        flat = [*m.parameters(), *m.buffers(), xs]
        _assert_same(ours(*flat), m(xs))


# ---------------------------------------------------------------- unsupported HOPs


class _RulelessHop(HigherOrderOperator):
    def __init__(self) -> None:
        super().__init__("aotkit_test_ruleless_hop")

    def __call__(self, fn: Callable[..., Any], x: torch.Tensor) -> Any:
        return super().__call__(fn, x)


_ruleless_hop = _RulelessHop()


@_ruleless_hop.py_impl(DispatchKey.CompositeExplicitAutograd)
def _ruleless_dense(fn: Callable[..., Any], x: torch.Tensor) -> Any:
    return fn(x)


@_ruleless_hop.py_impl(DispatchKey.Autograd)
def _ruleless_autograd(fn: Callable[..., Any], x: torch.Tensor) -> Any:
    with torch._C._AutoDispatchBelowAutograd():
        return _ruleless_hop(fn, x)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_hop_without_rules_names_itself(requires_grad: bool) -> None:
    def f(x: torch.Tensor) -> Any:
        return _ruleless_hop(lambda t: t.sin(), x)

    x = torch.randn(3, requires_grad=requires_grad)
    _assert_same(f(x), x.sin())  # eager runs it
    with pytest.raises(AOTCompileError) as info:
        aot_function(f, nop)(x)
    assert isinstance(info.value, NotImplementedError)
    message = str(info.value)
    assert "higher-order operator aotkit_test_ruleless_hop" in message
    assert "FunctionalTensorMode" in message and "Remedy" in message


def _checkpointed_cond(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    def region(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = x @ w
        return torch.cond(y.sum() > 0, lambda y: y.sin() * 2, lambda y: y.cos(), (y,)) @ w

    return cp.checkpoint(region, x, w, use_reentrant=False).relu()


@pytest.mark.parametrize("partitioner", sorted(PARTITIONERS))
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true_branch", "false_branch"])
def test_cond_inside_checkpoint_is_recomputed(partitioner: str, sign: float) -> None:
    x = (torch.rand(4, 3) * sign).requires_grad_()
    rec = _differential(_checkpointed_cond, [x, torch.rand(3, 3, requires_grad=True)], partitioner)
    fw, bw = rec.graphs
    cond = torch.ops.higher_order.cond
    assert sum(n.target is cond for n in fw.graph.nodes) == 1
    # the checkpointed region's cond runs again in the backward, before its own backward
    assert sum(n.target is cond for n in bw.graph.nodes) >= 2


class _LossCond(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.p = torch.nn.Parameter(torch.randn(3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        out = torch.cond(
            x.sum() > 0, lambda x: (x * self.p).sin(), lambda x: x.cos() - self.p.exp(), (x,)
        )
        return (out.sum(),)


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true_branch", "false_branch"])
def test_cond_joint_export(sign: float) -> None:
    torch.manual_seed(0)
    m = _LossCond()
    x = (torch.rand(3) + 0.1) * sign
    ours, our_sig = aot_export_module(m, [x], trace_joint=True, output_loss_index=0)
    _, their_sig = torch_aot.aot_export_module(m, [x], trace_joint=True, output_loss_index=0)
    ours_bw, theirs_bw = our_sig.backward_signature, their_sig.backward_signature
    for field in ("gradients_to_parameters", "gradients_to_user_inputs", "loss_output"):
        assert getattr(ours_bw, field) == getattr(theirs_bw, field), field
    assert our_sig.user_outputs == their_sig.user_outputs
    _assert_functional(ours)
    assert [n.target for n in ours.graph.nodes if isinstance(n.target, HigherOrderOperator)] == [
        torch.ops.higher_order.cond
    ] * 2  # the forward's and the backward's
    loss, grad_p = ours(m.p.detach(), x)
    expected = m(x)[0]
    expected.backward()
    _assert_same(loss, expected)
    _assert_same(grad_p, m.p.grad)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    ("fn", "args", "hop"),
    [
        (_cond, lambda: [torch.rand(4, requires_grad=True), torch.randn(4, requires_grad=True)], "cond"),
        (_map, lambda: [torch.randn(4, 3, requires_grad=True), torch.randn(3)], "map_impl"),
        (_while, lambda: [torch.tensor(0), torch.randn(3)], "while_loop"),
        (_flex, _qkv, "flex_attention"),
    ],
    ids=["cond", "map", "while_loop", "flex_attention"],
)
def test_torch_compile_graphs_are_functional(fn: Any, args: Any, hop: str) -> None:
    torch._dynamo.reset()
    rec = Recorder()
    backend = aot_autograd(fw_compiler=rec, bw_compiler=rec, inference_compiler=rec)
    inputs = args()
    got = _run(torch.compile(fn, backend=backend, fullgraph=True), _clone_args(inputs))
    _assert_same(got, _run(fn, _clone_args(inputs)))
    assert hop in rec.hops()


def test_dynamic_shapes_cond_and_while_loop() -> None:
    looped = aot_function(_while, nop, dynamic=True)
    branched = aot_function(_cond, nop, dynamic=True)
    for n in (3, 5):
        args = [torch.tensor(0), torch.randn(n)]
        _assert_same(looped(*args), _while(*args))
        for sign in (1.0, -1.0):
            inputs = [((torch.rand(n) + 0.1) * sign).requires_grad_(), torch.randn(n, requires_grad=True)]
            _assert_same(_run(branched, _clone_args(inputs)), _run(_cond, _clone_args(inputs)))
    # one symbolic entry each serves every size and both branches
    assert len(looped._aotkit_cache.entries) == 1  # type: ignore[attr-defined]
    assert len(branched._aotkit_cache.entries) == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("pre_dispatch", [False, True], ids=["post_dispatch", "pre_dispatch"])
def test_hop_without_rules_names_itself_in_export(pre_dispatch: bool) -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[Any]:
            return (_ruleless_hop(lambda t: t.sin(), x),)

    with pytest.raises(AOTCompileError, match="higher-order operator aotkit_test_ruleless_hop"):
        aot_export_module(M(), [torch.randn(3)], trace_joint=False, pre_dispatch=pre_dispatch)

"""Tensor subclasses are desugared: differential tests (eager, aotkit, torch's AOTAutograd).

Every graph a compiler receives must take and return plain tensors only (See Note [Tensor
subclasses are desugared] in aotkit_schemas); values, output types and gradients must match
eager and torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import aotkit
import functorch.compile as torch_compile
import pytest
import torch
import torch._functorch.aot_autograd as torch_aot
from _subclasses import Int8WeightTensor, TaggedTensor, WrapperTensor
from aotkit_schemas import SubclassCreationMeta, graph_outputs
from torch._subclasses.fake_tensor import FakeTensor
from torch.testing._internal.two_tensor import TwoTensor

Graphs = list[torch.fx.GraphModule]


def _recording(graphs: Graphs, examples: list[list[Any]], nop: Callable[..., Any]) -> Any:
    def compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        graphs.append(gm)
        examples.append(list(example_inputs))
        return nop(gm, example_inputs)

    return compiler


def assert_plain_graphs(graphs: Graphs, examples: list[list[Any]]) -> None:
    """Every placeholder and output of every graph, and every example input, is a plain
    (fake) tensor or a non-tensor."""
    assert graphs
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                val = node.meta.get("val")
                assert not isinstance(val, torch.Tensor) or type(val) is FakeTensor, (
                    f"{node.name}: {type(val).__name__}"
                )
        for out in graph_outputs(gm):
            if isinstance(out, torch.fx.Node):
                val = out.meta.get("val")
                assert not isinstance(val, torch.Tensor) or type(val) is FakeTensor, (
                    f"output {out.name}: {type(val).__name__}"
                )
    for ex in examples:
        for v in ex:
            assert not isinstance(v, torch.Tensor) or type(v) is FakeTensor, type(v).__name__


def assert_same(a: Any, b: Any) -> None:
    """Same type, and the same values down to the innermost tensors."""
    assert type(a) is type(b), f"{type(a).__name__} != {type(b).__name__}"
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
        return
    if isinstance(a, torch.Tensor) and hasattr(a, "__tensor_flatten__"):
        attrs, ctx = a.__tensor_flatten__()
        assert (attrs, ctx) == b.__tensor_flatten__()
        assert a.shape == b.shape
        for name in attrs:
            assert_same(getattr(a, name), getattr(b, name))
        return
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b)
        return
    assert a == b


def _run(fn: Callable[..., Any], args: list[Any], backward: bool) -> tuple[Any, list[Any]]:
    out = fn(*args)
    if isinstance(out, list):  # torch's aot_function returns a list for a tuple
        out = tuple(out)
    outs = out if isinstance(out, tuple) else (out,)
    grads: list[Any] = []
    if backward:
        torch.autograd.backward([o.sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad])
        grads = [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    return out, grads


def check_three_ways(
    fn: Callable[..., Any], make_args: Callable[[], list[Any]], *, backward: bool = True
) -> Graphs:
    """Run ``fn`` eagerly, through aotkit and through torch's aot_function on fresh inputs;
    outputs (types included) and input gradients must agree, and aotkit's compilers see
    plain tensors only. Returns aotkit's graphs."""
    torch.manual_seed(0)
    expected = _run(fn, make_args(), backward)
    graphs: Graphs = []
    examples: list[list[Any]] = []
    rec = _recording(graphs, examples, aotkit.nop)
    torch.manual_seed(0)
    got = _run(aotkit.aot_function(fn, rec, rec), make_args(), backward)
    torch_graphs: Graphs = []
    trec = _recording(torch_graphs, [], torch_compile.nop)
    torch.manual_seed(0)
    oracle = _run(torch_compile.aot_function(fn, trec, trec), make_args(), backward)
    assert_same(got, expected)
    assert_same(got, oracle)
    assert_plain_graphs(graphs, examples)
    assert len(graphs) == len(torch_graphs)
    return graphs


def two(*shape: int, requires_grad: bool = True) -> TwoTensor:
    t = TwoTensor(torch.randn(*shape), torch.randn(*shape))
    return t.requires_grad_(requires_grad)  # type: ignore[no-any-return]


def test_two_tensor_input_gives_two_inner_ops_and_a_two_tensor_gradient() -> None:
    graphs = check_three_ways(
        lambda x, y: (x * y).sin(), lambda: [two(3), torch.randn(3, requires_grad=True)]
    )
    fw = graphs[0]
    muls = [n for n in fw.graph.nodes if n.target is torch.ops.aten.mul.Tensor]
    assert len(muls) == 2  # one per inner tensor


def test_one_tensor_wrapper_with_its_own_dispatch() -> None:
    check_three_ways(
        lambda x, w: (x @ w).relu() + 1,
        lambda: [WrapperTensor(torch.randn(4, 5)).requires_grad_(), torch.randn(5, 3, requires_grad=True)],
    )


def test_nested_subclass() -> None:
    def make() -> list[Any]:
        inner = [torch.randn(2, 3) for _ in range(4)]
        x = TwoTensor(TwoTensor(inner[0], inner[1]), TwoTensor(inner[2], inner[3]))
        return [x.requires_grad_(), torch.randn(2, 3)]

    graphs = check_three_ways(lambda x, y: x.cos() * y, make)
    assert sum(1 for n in graphs[0].graph.nodes if n.op == "placeholder") == 5


def test_subclass_created_inside_the_function() -> None:
    check_three_ways(
        lambda x: TwoTensor(x.sin(), x.cos()) * 2, lambda: [torch.randn(3, requires_grad=True)]
    )


def test_subclass_output_and_plain_output() -> None:
    check_three_ways(
        lambda x, y: (x + y, (y * 2).exp()),
        lambda: [two(2, 2), torch.randn(2, 2, requires_grad=True)],
    )


def test_inference_with_subclass_inputs() -> None:
    check_three_ways(
        lambda x, y: (x * y).sin(), lambda: [two(3, requires_grad=False), torch.randn(3)], backward=False
    )


def test_created_inside_inference() -> None:
    check_three_ways(lambda x: TwoTensor(x, x * 2).relu(), lambda: [torch.randn(3)], backward=False)


def test_data_mutation_of_a_subclass_input() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return x + y

    def make() -> list[Any]:
        return [two(3, requires_grad=False), torch.randn(3, requires_grad=True)]

    torch.manual_seed(0)
    eager_args = make()
    expected = f(*eager_args)
    torch.manual_seed(0)
    args = make()
    graphs: Graphs = []
    examples: list[list[Any]] = []
    rec = _recording(graphs, examples, aotkit.nop)
    got = aotkit.aot_function(f, rec, rec)(*args)
    assert_same(got, expected)
    assert_same(args[0], eager_args[0])  # the mutation reached both inner tensors
    assert_plain_graphs(graphs, examples)


def test_mutation_of_a_subclass_input_that_requires_grad() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return x.sin()

    def make() -> list[Any]:
        return [two(3)]

    def run(fn: Callable[..., Any]) -> tuple[Any, Any, Any]:
        torch.manual_seed(0)
        (leaf,) = make()
        x = leaf.clone()
        out = fn(x)
        out.sum().backward()
        return out, x, leaf.grad

    expected = run(f)
    graphs: Graphs = []
    examples: list[list[Any]] = []
    rec = _recording(graphs, examples, aotkit.nop)
    got = run(aotkit.aot_function(f, rec, rec))
    oracle = run(torch_compile.aot_function(f, torch_compile.nop))
    for g, e, o in zip(got, expected, oracle, strict=True):
        assert_same(g, e)
        assert_same(g, o)
    assert_plain_graphs(graphs, examples)


def test_output_aliasing_a_subclass_input() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.view(-1), x * 2

    x = two(2, 3, requires_grad=False)
    graphs: Graphs = []
    examples: list[list[Any]] = []
    rec = _recording(graphs, examples, aotkit.nop)
    view, doubled = aotkit.aot_function(f, rec, rec)(x)
    expected = f(x)
    assert_same((view, doubled), expected)
    assert view._is_view() and view._base is x
    assert_plain_graphs(graphs, examples)


def test_set_on_a_subclass_input_raises() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.set_(y)  # type: ignore[call-overload]
        return x * 2

    with pytest.raises(RuntimeError):
        aotkit.aot_function(f, aotkit.nop)(two(3, requires_grad=False), two(3, requires_grad=False))


def test_subclass_parameter_in_aot_module() -> None:
    def make_module() -> torch.nn.Module:
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh())
        w = m[0].weight.detach()
        m[0].weight = torch.nn.Parameter(TwoTensor(w.clone(), w * 2))
        return m

    x = torch.randn(5, 4)

    def run(m: Any) -> tuple[Any, list[Any]]:
        out = m(x)
        out.sum().backward()
        return out, [p.grad for p in module_params(m)]

    def module_params(m: Any) -> list[torch.Tensor]:
        return list(m.parameters())

    eager = make_module()
    expected = run(eager)
    graphs: Graphs = []
    examples: list[list[Any]] = []
    rec = _recording(graphs, examples, aotkit.nop)
    mod = make_module()
    got = run(aotkit.aot_module(mod, rec, rec))
    got = (got[0], [p.grad for p in mod.parameters()])
    tmod = make_module()
    oracle = run(torch_compile.aot_module(tmod, torch_compile.nop))
    oracle = (oracle[0], [p.grad for p in tmod.parameters()])
    assert_same(got, expected)
    assert_same(got, oracle)
    assert isinstance(got[1][0], TwoTensor)
    assert_plain_graphs(graphs, examples)


def test_requires_subclass_dispatch_is_recorded() -> None:
    f = aotkit.aot_function(lambda x: x * 2, aotkit.nop)
    f(two(3))
    (artifacts,) = f._aotkit_cache.artifacts  # type: ignore[attr-defined]
    meta = artifacts.meta
    assert meta.requires_subclass_dispatch
    assert isinstance(meta.subclass_inp_meta[0], SubclassCreationMeta)
    assert meta.subclass_inp_meta[0].arg_count == 2
    g = aotkit.aot_function(lambda x: x * 2, aotkit.nop)
    g(torch.randn(3, requires_grad=True))
    (plain,) = g._aotkit_cache.artifacts  # type: ignore[attr-defined]
    assert not plain.meta.requires_subclass_dispatch


def test_int8_weight_only_quantized_linear_through_aotkit_inductor() -> None:
    torch._dynamo.reset()

    def make_module() -> torch.nn.Module:
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        for lin in (m[0], m[2]):
            lin.weight = torch.nn.Parameter(
                Int8WeightTensor.quantize(lin.weight.detach()), requires_grad=False
            )
        return m

    x0 = torch.randn(6, 8)

    def run(m: Any) -> tuple[Any, list[Any]]:
        x = x0.clone().requires_grad_()
        out = m(x)
        out.sum().backward()
        return out, [x.grad, *(p.grad for p in m.parameters() if p.requires_grad)]

    expected = run(make_module())
    got = run(torch.compile(make_module(), backend="aotkit_inductor"))
    torch.testing.assert_close(got[0], expected[0], rtol=1e-4, atol=1e-4)
    for g, e in zip(got[1], expected[1], strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)


class _SubclassParam(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(TwoTensor(torch.randn(3, 3), torch.randn(3, 3)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return ((x @ self.w).sin().sum(),)


@pytest.mark.parametrize("trace_joint", [False, True])
def test_aot_export_module_with_a_subclass_parameter_raises_torchs_error(trace_joint: bool) -> None:
    m, x = _SubclassParam(), torch.randn(2, 3)
    kwargs: dict[str, Any] = {"output_loss_index": 0} if trace_joint else {}
    with pytest.raises(RuntimeError, match="not currently supported with traceable tensor subclass") as oracle:
        torch_aot.aot_export_module(m, [x], trace_joint=trace_joint, **kwargs)
    with pytest.raises(RuntimeError) as got:
        aotkit.aot_export_module(m, [x], trace_joint=trace_joint, **kwargs)
    assert str(oracle.value) in str(got.value)


def test_aot_export_joint_simple_with_a_subclass_input_raises_torchs_error() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
        return ((x @ w).sin(),)

    args = [torch.randn(2, 3), TwoTensor(torch.randn(3, 3), torch.randn(3, 3))]
    with pytest.raises(RuntimeError, match="traceable tensor subclass"):
        torch_aot.aot_export_joint_simple(f, args, trace_joint=False)
    with pytest.raises(RuntimeError, match="traceable tensor subclass"):
        aotkit.aot_export_joint_simple(f, args, trace_joint=False)


def test_torch_compile_hands_plain_graphs_to_the_compilers() -> None:
    torch._dynamo.reset()
    graphs: Graphs = []
    examples: list[list[Any]] = []
    rec = _recording(graphs, examples, aotkit.nop)
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    lin.weight = torch.nn.Parameter(TwoTensor(lin.weight.detach(), lin.weight.detach() * 2))
    x = torch.randn(2, 4)
    expected = lin(x)
    got = torch.compile(lin, backend=aotkit.aot_autograd(fw_compiler=rec, bw_compiler=rec))(x)
    assert_same(got.detach(), expected.detach())
    got.sum().backward()
    assert_plain_graphs(graphs, examples)


def test_tangent_with_other_subclass_metadata_is_coerced() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin() * 2

    def run(fn: Callable[..., Any]) -> tuple[Any, Any]:
        torch.manual_seed(0)
        x = TaggedTensor(torch.randn(3), "a").requires_grad_()
        out = fn(x)
        # the gradient arrives with tag "b"; the backward was traced for tag "a"
        out.backward(TaggedTensor(torch.ones(3) * 3, "b"))
        return out, x.grad

    expected = run(f)
    graphs: Graphs = []
    examples: list[list[Any]] = []
    rec = _recording(graphs, examples, aotkit.nop)
    got = run(aotkit.aot_function(f, rec, rec))
    oracle = run(torch_compile.aot_function(f, torch_compile.nop))
    torch.testing.assert_close(got[1].elem, expected[1].elem)
    assert_same(got, oracle)
    assert_plain_graphs(graphs, examples)


def test_tangent_that_cannot_be_coerced_raises() -> None:
    f = aotkit.aot_function(lambda x: x * 2, aotkit.nop)
    out = f(two(3))
    with pytest.raises(RuntimeError, match="__coerce_same_metadata_as_tangent__"):
        out.backward(WrapperTensor(torch.ones(3)))


def test_subclass_with_symbolic_sizes_is_supported() -> None:
    # used to raise NotImplementedError; see tests/test_subclass_mutations.py for the
    # differential tests (Note [Symbolic outer sizes of subclasses] in aotkit_schemas)
    f = aotkit.aot_function(lambda x: x * 2, aotkit.nop, dynamic=True)
    for n in (3, 5):
        x = two(n)
        assert_same(f(x), x * 2)


def test_view_outputs_of_a_subclass_input_that_requires_grad() -> None:
    check_three_ways(lambda x: (x.view(-1), x.t() * 2, x[0]), lambda: [two(2, 3)])


def test_intermediate_view_output_of_a_subclass() -> None:
    check_three_ways(lambda x: (x * 2).view(-1), lambda: [two(2, 3)])

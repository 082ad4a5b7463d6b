"""Behaviours torch's own AOTAutograd test suite relies on, beyond values and gradients.

Each test pins one convention that a drop-in must share with torch: exception types,
when compilers run, graph output containers, and error texts.
"""

from __future__ import annotations

import itertools
from typing import Any

import aotkit
import aotkit_frontends._aot_function as aotkit_aot_function
import functorch.compile as torch_compile
import pytest
import torch
import torch._functorch.aot_autograd as torch_aot
from aotkit_capture import (
    BACKWARD_INPUT_METADATA_MUTATION,
    BACKWARD_TANGENT_METADATA_MUTATION,
)
from aotkit_frontends import default_decompositions
from torch._guards import TracingContext
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.testing._internal.two_tensor import TwoTensor, TwoTensorMode


def test_tracing_errors_keep_torchs_exception_types() -> None:
    with pytest.raises(DynamicOutputShapeException) as shape_err:
        aotkit.aot_function(lambda x: x[x > 0], aotkit.nop)(torch.randn(4))
    assert isinstance(shape_err.value, aotkit.AOTCompileError)
    assert shape_err.value.func is torch.ops.aten.nonzero.default
    with pytest.raises(DataDependentOutputException) as value_err:
        aotkit.aot_function(lambda x: x * 2 if x.sum() > 0 else x, aotkit.nop)(torch.randn(4))
    assert "torch.where" in str(value_err.value)


def test_backward_is_compiled_at_the_first_backward_like_torch() -> None:
    calls: list[str] = []

    def bw_compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        calls.append("bw")
        return aotkit.nop(gm, example_inputs)

    f = aotkit.aot_function(lambda x: x.sin() * 2, aotkit.nop, bw_compiler)
    x = torch.randn(3, requires_grad=True)
    out = f(x)
    assert calls == []
    torch.autograd.backward([out.sum()])
    torch.autograd.backward([f(x).sum()])
    assert calls == ["bw"]
    torch.testing.assert_close(x.grad, 2 * 2 * x.detach().cos())


def test_inference_graphs_return_tuples() -> None:
    codes: list[str] = []

    def show(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        codes.append(gm.code)
        return aotkit.nop(gm, example_inputs)

    aotkit.aot_function(lambda a: a.view(-1), show)(torch.ones(2, 2))
    assert "return (view,)" in codes[0]


def test_autograd_grad_inside_the_compiled_function() -> None:
    x = torch.randn((), requires_grad=True)
    (grad,) = aotkit.aot_function(lambda t: torch.autograd.grad(torch.exp(t), t), aotkit.nop)(x)
    torch.testing.assert_close(grad, torch.exp(x.detach()))


def test_default_decompositions_is_torchs_table() -> None:
    assert isinstance(default_decompositions, dict)
    assert set(default_decompositions) == set(torch_compile.default_decompositions)
    f = aotkit.aot_function(lambda x: x.cos(), aotkit.nop, decompositions=default_decompositions)
    x = torch.randn(3, requires_grad=True)
    torch.testing.assert_close(f(x), x.cos())


def test_output_aliasing_a_subclass_input_is_a_view() -> None:
    b = TwoTensor(torch.ones(3, 3, requires_grad=True), torch.ones(3, 3, requires_grad=True))
    a = torch.ones(3, 3, requires_grad=True)
    view, prod = aotkit.aot_function(lambda a, b: (b.view(b.shape), a * b), aotkit.nop)(a, b)
    assert isinstance(view, TwoTensor) and view._is_view()
    torch.testing.assert_close(prod.a, a * b.a)


def test_mutated_aliased_subclass_inputs_raise_torchs_error() -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a.mul_(2)
        b.t_()
        return a.mul(b)

    with TwoTensorMode():
        x = torch.ones(2, 2).add(1)
        a, b = x[0], x[0]
    with pytest.raises(RuntimeError, match="Encountered aliased inputs that are mutated in the graph"):
        aotkit.aot_function(f, aotkit.nop)(a, b)


class _MutatesInput(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        x.mul_(2)
        return (x + y,)


@pytest.mark.parametrize(
    ("make_args", "message"),
    [
        (lambda x: [x, x], "Encountered duplicated inputs that are mutated in the graph you are trying to export"),
        (lambda x: [x, x.view(2)], "Encountered aliased inputs that are mutated in the graph you are trying to export"),
    ],
)
def test_export_errors_lead_with_torchs_text(make_args: Any, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        aotkit.aot_export_module(_MutatesInput(), make_args(torch.ones(2)), trace_joint=False)


def test_backward_through_a_stale_saved_value_raises_only_when_used() -> None:
    # See Note [Backward paths through stale saved values]
    def f(v0: torch.Tensor, v1: torch.Tensor) -> tuple[torch.Tensor]:
        v2 = v0.sin()
        v0.add_(1.5)
        v1.add_(v2.mean())
        return (v0,)

    results = []
    for fn in (f, aotkit.aot_function(f, aotkit.nop)):
        torch.manual_seed(0)
        leaf = torch.randn(4, requires_grad=True)
        v0, v1 = leaf.clone(), torch.randn(4)
        (out,) = fn(v0, v1)
        torch.autograd.backward([out.sum()])
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.backward([v1.sum()])
        assert leaf.grad is not None
        results.append((out.detach(), v1.detach(), leaf.grad.clone()))
    for eager_value, aot_value in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(aot_value, eager_value)


def test_leaf_returned_as_is_gets_its_grad_before_a_stale_backward_raises() -> None:
    # Found by the fuzzer (seed 21). Eager accumulates into the returned leaf ``v1`` and
    # then raises at sin's backward; the compiled node must not hold ``v1``'s gradient
    # back (See Note [Inputs the backward never reaches]).
    def f(v0: torch.Tensor, v1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v3 = torch.sin(v0)
        v0.add_(v3)
        return (v3, v1)

    grads = []
    for fn in (f, aotkit.aot_function(f, aotkit.nop)):
        torch.manual_seed(0)
        base = torch.randn(4, requires_grad=True)
        leaf = torch.randn(4, requires_grad=True)
        outs = fn(base * 1, leaf)
        assert outs[1] is leaf and outs[0].requires_grad
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.backward(list(outs), [torch.ones(4), torch.ones(4)])
        assert base.grad is None
        assert leaf.grad is not None
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[1], grads[0])


# --- graph names while compiling (Note [Graph names during compilation]) ---


def _record_compilation_context(
    aot_function: Any, get_context: Any, partition_fn: Any
) -> list[tuple[list[str], int, int]]:
    """(graphs being compiled, nth_graph relative to the first record, node count) for
    every partitioner and compiler call of: a training call, a backward, an inference
    call, and then outside compilation."""
    records: list[tuple[list[str], int, int]] = []

    def record(gm: torch.fx.GraphModule) -> None:
        names, model, nth = get_context()
        assert model == "model"
        records.append((names, nth, len(gm.graph.nodes)))

    def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        record(gm)
        return aotkit.make_boxed_func(gm.forward)

    def partition(joint: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        record(joint)
        return partition_fn(joint, joint_inputs, **kwargs)

    train = aot_function(lambda x: x.sin().sin(), compiler, partition_fn=partition)
    out = train(torch.randn(5, requires_grad=True))
    aot_function(lambda x: x.cos(), compiler)(torch.randn(5))
    out.sum().backward()
    first = records[0][1]
    return [(names, nth - first, n) for names, nth, n in records] + [
        (get_context()[0], -1, -1)
    ]


def test_compilation_context_names_graphs_like_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_aot, "AOT_COUNTER", itertools.count())
    monkeypatch.setattr(aotkit_aot_function, "_AOT_COUNTER", itertools.count())
    ours = _record_compilation_context(
        aotkit.aot_function, aotkit.get_aot_compilation_context, aotkit.default_partition
    )
    theirs = _record_compilation_context(
        torch_compile.aot_function, torch_compile.get_aot_compilation_context,
        torch_compile.default_partition,
    )
    assert ours == theirs
    assert [names for names, _, _ in ours] == [
        ["0_joint"], ["0_forward"], ["1_inference"], ["0_backward"], []
    ]
    assert aotkit.get_aot_graph_name() == torch_compile.get_aot_graph_name().replace(
        str(torch_compile.get_aot_compilation_context()[2]),
        str(aotkit.get_aot_compilation_context()[2]),
    )


def test_dynamo_sees_the_graph_name_in_its_tracing_context() -> None:
    seen: list[tuple[Any, list[str], str]] = []

    def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        context = TracingContext.try_get()
        seen.append((
            context.aot_graph_name if context is not None else None,
            aotkit.get_aot_compilation_context()[0],
            aotkit.get_aot_graph_name(),
        ))
        return aotkit.make_boxed_func(gm.forward)

    torch._dynamo.reset()
    f = torch.compile(lambda x: x.sin() * 2, backend=aotkit.aot_autograd(fw_compiler=compiler))
    f(torch.randn(3, requires_grad=True)).sum().backward()
    torch._dynamo.reset()
    (fw_tracing, fw_names, fw_full), (_, bw_names, bw_full) = seen
    aot_id = fw_names[0].removesuffix("_forward")
    assert fw_names == [f"{aot_id}_forward"] and bw_names == [f"{aot_id}_backward"]
    assert fw_tracing == fw_names  # what Inductor prints as "# AOT ID"
    assert fw_full.startswith(f"model__{aot_id}_forward_")
    assert bw_full.startswith(f"model__{aot_id}_backward_")
    assert TracingContext.try_get() is None and aotkit.get_aot_compilation_context()[0] == []


# --- metadata mutations in a custom backward (Note [Metadata mutations in the backward]) ---


class _TransposesSavedInputInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(b)
        return a.clone(), b.clone()

    @staticmethod
    def backward(ctx: Any, grad_a: torch.Tensor, grad_b: torch.Tensor) -> Any:
        (b,) = ctx.saved_tensors
        b.transpose_(1, 0)
        return grad_a.clone(), grad_b.clone()


class _TransposesGradInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad.t_()
        return grad.t()


def _mutates_saved_input(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a_, b_ = _TransposesSavedInputInBackward.apply(a, b)
    return a_ * b_


def _mutates_grad(x: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = _TransposesGradInBackward.apply(x)
    return out


_BACKWARD_MUTATION_CASES = [
    pytest.param(
        _mutates_saved_input,
        lambda: (torch.ones(3, 4, requires_grad=True).clone(), torch.ones(3, 4)),
        id="saved_input",
    ),
    pytest.param(_mutates_grad, lambda: (torch.randn(3, 4, requires_grad=True),), id="grad"),
]


@pytest.mark.parametrize(("fn", "make_args"), _BACKWARD_MUTATION_CASES)
def test_backward_metadata_mutation_messages_are_torchs(fn: Any, make_args: Any) -> None:
    with pytest.raises(AssertionError) as err:
        torch_compile.aot_function(fn, torch_compile.nop)(*make_args())
    assert str(err.value) in (BACKWARD_INPUT_METADATA_MUTATION, BACKWARD_TANGENT_METADATA_MUTATION)


@pytest.mark.parametrize(("fn", "make_args"), _BACKWARD_MUTATION_CASES)
def test_backward_metadata_mutation_raises_like_torch(fn: Any, make_args: Any) -> None:
    with pytest.raises(AssertionError) as theirs:
        torch_compile.aot_function(fn, torch_compile.nop)(*make_args())
    with pytest.raises(AssertionError) as ours:
        aotkit.aot_function(fn, aotkit.nop)(*make_args())
    assert str(ours.value) == str(theirs.value)


class _BufferCounter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("buf", torch.zeros(2))
        self.w = torch.nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.buf.add_(1)
        return (self.w * x).tanh().sum() + self.buf.sum()


def _graph_texts(aot_module: Any, nop: Any, boxed: Any, make: Any, **kwargs: Any) -> tuple[str, str]:
    codes: list[str] = []

    def record(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        codes.append(gm.code)
        return gm

    torch.manual_seed(0)
    model = make()
    compiled = aot_module(model, fw_compiler=boxed(record), bw_compiler=boxed(record), **kwargs)
    compiled(torch.randn(2, requires_grad=True)).sum().backward()
    fw, bw = codes
    return fw, bw


@pytest.mark.parametrize(
    ("name", "make", "kwargs"),
    [
        # See Note [Detach nodes of saved outputs]: tanh's saved result
        ("saved outputs", lambda: torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh()), {}),
        # See Note [Input mutations kept in the training graph]
        ("kept buffer mutation", _BufferCounter, {"keep_inference_input_mutations": True}),
        ("buffer mutation", _BufferCounter, {}),
    ],
)
def test_training_graphs_read_as_torchs(name: str, make: Any, kwargs: Any) -> None:
    ours = _graph_texts(aotkit.aot_module, aotkit.nop, aotkit.make_boxed_compiler, make, **kwargs)
    theirs = _graph_texts(
        torch_aot.aot_module, torch_compile.nop, torch_compile.make_boxed_compiler, make, **kwargs
    )
    assert ours == theirs, name


@pytest.mark.parametrize("requires_grad", [False, True])
def test_metadata_mutation_of_a_subclass_input_is_replayed_as_torch_does(
    requires_grad: bool,
) -> None:
    # torch 2.15 replays the metadata mutation with as_strided_, which TwoTensor applies to
    # its inner tensors (torch used to raise "Metadata mutations are currently not allowed
    # on tensor subclasses", pytorch#114975, and aotkit copied that error)
    def f(a: torch.Tensor) -> torch.Tensor:
        a.transpose_(1, 0)
        return a.mul(2).transpose(1, 0)

    def run(fn: Any) -> tuple[Any, ...]:
        with TwoTensorMode():
            x = torch.ones(1, 2, 4, requires_grad=requires_grad).clone().add(1)
        out = fn(x)
        if requires_grad:
            out.sum().backward()
        return (
            x.shape, x.stride(), x.a.shape, x.a.stride(), x.b.stride(),
            type(out), out.shape, out.a.stride(), out.requires_grad, out.a.tolist(),
        )

    expected = run(f)
    assert run(aotkit.aot_function(f, aotkit.nop)) == expected
    assert run(torch_aot.aot_function(f, torch_compile.nop)) == expected

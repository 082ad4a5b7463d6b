"""Tensor subclasses the function creates from plain inputs, trained through, and the zero
tangents of unused subclass outputs: differential tests (eager, aotkit, torch's
AOTAutograd), with static and symbolic sizes.

See Note [Tensor subclasses are desugared] and Note [Symbolic outer sizes of subclasses]
in aotkit_schemas, Note [Zero tangents of subclass outputs] in aotkit_runtime. Every graph
aotkit hands to a compiler must take and return plain tensors only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aotkit
import functorch.compile as torch_compile
import pytest
import torch
from _subclasses import TaggedTensor, WrapperTensor
from test_subclass_layer import Graphs, _recording, assert_plain_graphs, assert_same
from torch.testing._internal.two_tensor import TwoTensor


class ToTwo(torch.autograd.Function):
    """A differentiable subclass constructor from a plain tensor (as DTensor.from_local
    is): the output is a TwoTensor whose gradient flows back to the plain input."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return TwoTensor(x * 2, x + 1)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g.a * 2 + g.b  # type: ignore[attr-defined,no-any-return]


class ToWrapper(torch.autograd.Function):
    """The same for a one-tensor wrapper with its own ``__torch_dispatch__``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return WrapperTensor(x * 3)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g.elem * 3  # type: ignore[attr-defined,no-any-return]


class ToPartial(torch.autograd.Function):
    """A subclass whose tangent is traced with other metadata than the output's
    (``__coerce_tangent_metadata__``: "partial" outputs, "replicate" tangents)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return TaggedTensor(x * 2, "partial")

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g.elem * 2  # type: ignore[attr-defined,no-any-return]


def _plain(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, requires_grad=True)


def _two(*shape: int) -> torch.Tensor:
    return TwoTensor(torch.randn(*shape), torch.randn(*shape)).requires_grad_()  # type: ignore[no-any-return]


# name: (function, inputs for a leading size n)
CASES: dict[str, tuple[Callable[..., Any], Callable[[int], list[Any]]]] = {
    # trained through the created subclass into the plain input
    "constructor": (lambda x: ToTwo.apply(x).sin(), lambda n: [_plain(n)]),
    # created from a plain input (a leaf wrapper), trained into a plain parameter
    "times_plain_parameter": (
        lambda x, w: TwoTensor(x * 2, x + 1) * w,
        lambda n: [_plain(n), _plain(n)],
    ),
    # a subclass output returned alongside a plain one
    "with_a_plain_output": (
        lambda x, y: (ToTwo.apply(x) * 3, (y * 3).sin()),
        lambda n: [_plain(n), _plain(n)],
    ),
    # a subclass output built from a subclass input and a plain input
    "mixed_inputs": (lambda x, y: (x * ToTwo.apply(y)).cos(), lambda n: [_two(n), _plain(n)]),
    # a view of the created subclass (its outer size is a product of inner symbols)
    "flattening_view": (lambda x: (ToTwo.apply(x) * 2).view(-1), lambda n: [_plain(n, 3)]),
    "matmul": (lambda x, w: (ToTwo.apply(x) @ w).relu(), lambda n: [_plain(n, 3), _plain(3, 4)]),
    "wrapper": (
        lambda x, w: (ToWrapper.apply(x) @ w).tanh(),
        lambda n: [_plain(n, 3), _plain(3, 2)],
    ),
    "nested": (
        lambda x: TwoTensor(ToTwo.apply(x), ToTwo.apply(x * 2)).sin(),
        lambda n: [_plain(n)],
    ),
    # the traced tangent is "replicate", the runtime one "partial" (coerced back)
    "coerced_tangent_metadata": (lambda x: ToPartial.apply(x).sin() * 3, lambda n: [_plain(n)]),
    # the same created subclass returned twice (an output and a view-free use of it)
    "returned_twice": (lambda x: (lambda t: (t, t * 2))(ToTwo.apply(x)), lambda n: [_plain(n)]),
}


def _run(fn: Callable[..., Any], args: list[Any]) -> tuple[Any, list[Any]]:
    out = fn(*args)
    if isinstance(out, list):  # torch's aot_function returns a list for a tuple
        out = tuple(out)
    outs = out if isinstance(out, tuple) else (out,)
    torch.autograd.backward([o.sum() for o in outs if o.requires_grad])
    return tuple(o.detach() for o in outs), [a.grad for a in args]


def _three_ways(
    fn: Callable[..., Any], make: Callable[[int], list[Any]], dynamic: bool
) -> tuple[Graphs, list[list[Any]]]:
    """eager, aotkit and torch's aot_function on fresh inputs of a few sizes (one with
    static shapes); returns aotkit's graphs and their example inputs."""
    graphs: Graphs = []
    examples: list[list[Any]] = []
    rec = _recording(graphs, examples, aotkit.nop)
    compiled = aotkit.aot_function(fn, rec, rec, dynamic=dynamic)
    oracle = torch_compile.aot_function(fn, torch_compile.nop, dynamic=dynamic)
    for n in (3, 5, 4) if dynamic else (3,):
        results = []
        for f in (fn, compiled, oracle):
            torch.manual_seed(n)
            results.append(_run(f, make(n)))
        assert_same(results[1], results[0])
        assert_same(results[1], results[2])
    return graphs, examples


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("name", list(CASES))
def test_created_subclass_three_ways(name: str, dynamic: bool) -> None:
    fn, make = CASES[name]
    graphs, examples = _three_ways(fn, make, dynamic)
    assert_plain_graphs(graphs, examples)
    assert len(graphs) == 2  # one forward and one backward, for every size


def test_gradient_flows_through_the_created_subclass() -> None:
    fn, make = CASES["constructor"]
    x = make(3)[0]
    aotkit.aot_function(fn, aotkit.nop)(x).sum().backward()
    expected = make(3)[0]
    with torch.no_grad():
        expected.copy_(x)
    fn(expected).sum().backward()
    assert x.grad is not None and type(x.grad) is torch.Tensor
    torch.testing.assert_close(x.grad, expected.grad)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("name", ["constructor", "with_a_plain_output", "mixed_inputs"])
def test_created_subclass_through_torch_compile(name: str, dynamic: bool) -> None:
    fn, make = CASES[name]
    graphs: Graphs = []
    examples: list[list[Any]] = []
    rec = _recording(graphs, examples, aotkit.nop)
    aotkit.register_dynamo_backends()
    backends: list[Any] = ["aotkit_eager", aotkit.aot_autograd(fw_compiler=rec, bw_compiler=rec)]
    for backend in backends:
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend=backend, dynamic=dynamic, fullgraph=True)
        torch._dynamo.reset()
        oracle = torch.compile(fn, backend="aot_eager", dynamic=dynamic, fullgraph=True)
        for n in (3, 5) if dynamic else (3,):
            results = []
            for f in (fn, compiled, oracle):
                torch.manual_seed(n)
                results.append(_run(f, make(n)))
            assert_same(results[1], results[0])
            assert_same(results[1], results[2])
    assert_plain_graphs(graphs, examples)


# Unused subclass outputs. Autograd passes plain zeros for an output the backward does not
# reach; torch 2.15 then raises "we guessed its metadata incorrectly" (pinned below), and
# aotkit builds the zero tangent in the traced subclass form, so gradients equal eager's.
UNUSED: dict[str, tuple[Callable[..., Any], Callable[[int], list[Any]]]] = {
    "subclass_input": (lambda x, y: (x * 2, (x * y).sin()), lambda n: [_two(n, 2), _plain(n, 2)]),
    "created_inside": (
        lambda x: (ToTwo.apply(x).sin(), ToTwo.apply(x).cos() * 2),
        lambda n: [_plain(n, 2)],
    ),
    "created_flattened": (
        lambda x, y: ((ToTwo.apply(x) * 2).view(-1), (y * x).sum(1)),
        lambda n: [_plain(n, 2), _plain(n, 2)],
    ),
    # inputs that feed only the unused output keep .grad None, as in eager (See Note
    # [Gradients through unused outputs] in aotkit_runtime)
    "subclass_input_only_in_the_unused": (
        lambda x, y: (x * 2, y.sin()),
        lambda n: [_two(n, 2), _plain(n, 2)],
    ),
    "plain_input_only_in_the_unused": (
        lambda x, y: (ToTwo.apply(x).sin(), y.cos()),
        lambda n: [_plain(n, 2), _plain(n, 2)],
    ),
}


def _backward_through_the_last(fn: Callable[..., Any], args: list[Any]) -> tuple[Any, list[Any]]:
    outs = tuple(fn(*args))
    outs[-1].sum().backward()
    return tuple(o.detach() for o in outs), [a.grad for a in args]


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("name", list(UNUSED))
def test_unused_subclass_output_gets_a_subclass_zero_tangent(name: str, dynamic: bool) -> None:
    fn, make = UNUSED[name]
    graphs: Graphs = []
    examples: list[list[Any]] = []
    rec = _recording(graphs, examples, aotkit.nop)
    compiled = aotkit.aot_function(fn, rec, rec, dynamic=dynamic)
    for n in (3, 5, 4) if dynamic else (3,):
        torch.manual_seed(n)
        expected = _backward_through_the_last(fn, make(n))
        torch.manual_seed(n)
        got = _backward_through_the_last(compiled, make(n))
        assert_same(got, expected)
    assert_plain_graphs(graphs, examples)
    assert len(graphs) == 2
    # torch's AOTAutograd does not build the subclass zero tangent: it raises
    oracle = torch_compile.aot_function(fn, torch_compile.nop, dynamic=dynamic)
    with pytest.raises(RuntimeError, match=r"guessed its\s+metadata incorrectly"):
        _backward_through_the_last(oracle, make(3))


@pytest.mark.parametrize("name", list(UNUSED))
def test_unused_subclass_output_torch_compile_dynamic(name: str) -> None:
    fn, make = UNUSED[name]
    aotkit.register_dynamo_backends()
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="aotkit_eager", dynamic=True, fullgraph=True)
    for n in (3, 5):
        torch.manual_seed(n)
        expected = _backward_through_the_last(fn, make(n))
        torch.manual_seed(n)
        assert_same(_backward_through_the_last(compiled, make(n)), expected)
    torch._dynamo.reset()
    oracle = torch.compile(fn, backend="aot_eager", dynamic=True, fullgraph=True)
    with pytest.raises(RuntimeError, match=r"guessed its\s+metadata incorrectly"):
        _backward_through_the_last(oracle, make(3))


def test_tangent_traced_with_coerced_metadata() -> None:
    """The tangent of a "partial" output is traced as "replicate"
    (``__coerce_tangent_metadata__``, as torch does); the runtime tangent, "partial", is
    converted back (``__coerce_same_metadata_as_tangent__``)."""
    fn, make = CASES["coerced_tangent_metadata"]
    f = aotkit.aot_function(fn, aotkit.nop)
    (x,) = make(3)
    out = f(x)
    assert out.tag == "partial"
    (artifacts,) = f._aotkit_cache.artifacts  # type: ignore[attr-defined]
    (tangent_meta,) = artifacts.meta.subclass_tangent_meta
    assert tangent_meta.original_subclass_type is TaggedTensor and tangent_meta.meta == "replicate"
    out.sum().backward()
    expected = x.detach().clone().requires_grad_()
    fn(expected).sum().backward()
    torch.testing.assert_close(x.grad, expected.grad)

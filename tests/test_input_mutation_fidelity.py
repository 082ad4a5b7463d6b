"""Input mutations that torch's own AOTAutograd suite pins down: ``set_`` on inputs (See
Note [set_ on an input]), mutations a custom backward makes to forward inputs, and the
graphs handed to the compiler when such mutations stay in the graph.

Each case runs eagerly and through aotkit (and, where torch supports it, through torch's
AOTAutograd) and compares values, input states and gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aotkit
import functorch.compile as torch_compile
import pytest
import torch
import torch._functorch.aot_autograd as torch_aot


def _graph_cell(cell: list[torch.fx.GraphModule]) -> Callable[..., Any]:
    def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        cell.append(gm)
        return aotkit.nop(gm, example_inputs)

    return compiler


def _set_then_mutate_other(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        a.set_(b)
        b.mul_(2)
    return a + b


def test_set_under_no_grad_stays_in_the_training_graph_as_set() -> None:
    def inputs() -> list[torch.Tensor]:
        return [torch.ones(3, 3, requires_grad=True).add(1), torch.ones(3, 3, requires_grad=True).add(2)]

    ref = inputs()
    ref_out = _set_then_mutate_other(*ref)
    graphs: list[torch.fx.GraphModule] = []
    got = inputs()
    out = aotkit.aot_function(
        _set_then_mutate_other, _graph_cell(graphs), keep_inference_input_mutations=True
    )(*got)
    torch.testing.assert_close(out, ref_out)
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r)
    targets = [n.target for n in graphs[0].graph.nodes]
    # the swap and the write stay in the graph, so the forward returns only the user output
    assert torch.ops.aten.set_.source_Tensor in targets
    assert torch.ops.aten.copy_.default in targets
    assert len(graphs[0].graph.find_nodes(op="output")[0].args[0]) == 1


def test_set_followed_by_a_mutation_autograd_records_raises_like_torch() -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            a.set_(b)
        a.mul_(2)
        return a + b

    def inputs() -> list[torch.Tensor]:
        return [torch.ones(3, requires_grad=True).add(1), torch.ones(3, requires_grad=True).add(1)]

    for keep in (True, False):
        with pytest.raises(AssertionError, match="other mutations that we cannot") as err:
            aotkit.aot_function(f, aotkit.nop, keep_inference_input_mutations=keep)(*inputs())
        assert "torch.no_grad()" in str(err.value)
        with pytest.raises(AssertionError, match="other mutations that we cannot"):
            torch_compile.aot_function(f, torch_compile.nop, keep_inference_input_mutations=keep)(
                *inputs()
            )


def test_set_alone_out_of_graph_still_matches_eager() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.set_(y * 2)
        return x + 1

    ref = [torch.arange(3.0), torch.arange(3.0) + 5]
    got = [t.clone() for t in ref]
    ref_out = f(*ref)
    out = aotkit.aot_function(f, aotkit.nop)(*got)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(got[0], ref[0])


def test_storage_resize_then_set_on_a_leaf_that_requires_grad() -> None:
    def f(a: torch.Tensor) -> None:
        with torch.no_grad():
            torch.ops.inductor.resize_storage_bytes_(a, 0)
            a.set_(torch.ones(2))

    ref = torch.zeros(8, requires_grad=True)
    f(ref)
    got = torch.zeros(8, requires_grad=True)
    aotkit.aot_function(f, aotkit.nop, keep_inference_input_mutations=True)(got)
    torch.testing.assert_close(got.detach(), ref.detach())
    assert got.shape == ref.shape == (2,)


def _zeroing_clone_op(name: str) -> Any:
    """A custom op whose backward zeroes its second input (a buffer the caller owns)."""

    @torch.library.custom_op(f"aotkit_test::{name}", mutates_args={})
    def op(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @op.register_fake
    def _(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        ctx.buf = inputs[1]

    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        with torch.no_grad():
            ctx.buf.zero_()
        return grad * 2, None

    op.register_autograd(backward, setup_context=setup_context)
    return op


_ZEROING_CLONE = _zeroing_clone_op("zeroing_clone")


@pytest.mark.parametrize("keep", [False, True])
def test_backward_writes_a_forward_input_at_backward_time(keep: bool) -> None:
    def f(x: torch.Tensor, buf: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        other.mul_(5)
        return _ZEROING_CLONE(x, buf) + other

    def inputs() -> list[torch.Tensor]:
        torch.manual_seed(0)
        return [torch.randn(3, requires_grad=True), torch.randn(3), torch.randn(3)]

    ref, got = inputs(), inputs()
    ref_out = f(*ref)
    graphs: list[torch.fx.GraphModule] = []
    out = aotkit.aot_function(
        f, aotkit.nop, _graph_cell(graphs), keep_inference_input_mutations=keep
    )(*got)
    # after the forward: buf untouched, as in eager
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r)
    ref_out.sum().backward()
    out.sum().backward()
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r)
    torch.testing.assert_close(got[0].grad, ref[0].grad)
    # the write lives in the backward graph
    assert torch.ops.aten.copy_.default in [n.target for n in graphs[0].graph.nodes]


def test_backward_write_to_an_input_that_requires_grad_refuses_create_graph() -> None:
    def f(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        return _ZEROING_CLONE(x, buf)

    x = torch.randn(3, requires_grad=True)
    buf = torch.randn(3, requires_grad=True)
    loss = aotkit.aot_function(f, aotkit.nop)(x, buf).sum()
    with pytest.raises(RuntimeError, match="create_graph=True"):
        torch.autograd.grad(loss, x, create_graph=True)
    # a plain backward works and writes the buffer, as in eager
    loss = aotkit.aot_function(f, aotkit.nop)(x, buf).sum()
    (grad,) = torch.autograd.grad(loss, x)
    torch.testing.assert_close(grad, torch.full((3,), 2.0))
    torch.testing.assert_close(buf.detach(), torch.zeros(3))


class _WritesInBothPasses(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
        counter.add_(1)
        ctx.counter = counter
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        ctx.counter.add_(1)
        return grad, None


def test_input_written_in_both_passes() -> None:
    def f(x: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
        return _WritesInBothPasses.apply(x, counter)

    x, counter = torch.randn(2, requires_grad=True), torch.zeros(2)
    out = aotkit.aot_function(f, aotkit.nop, keep_inference_input_mutations=True)(x, counter)
    torch.testing.assert_close(counter, torch.ones(2))
    out.sum().backward()
    torch.testing.assert_close(counter, torch.full((2,), 2.0))
    # replayed after the graph, the forward's write would race the backward's: refused
    with pytest.raises(AssertionError, match="keep_inference_input_mutations=True"):
        aotkit.aot_function(f, aotkit.nop)(torch.randn(2, requires_grad=True), torch.zeros(2))


def test_export_joint_simple_input_mutation_error_reads_as_torchs() -> None:
    def f(p: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor]:
        p.mul_(2)
        return (p + x,)

    args = [torch.nn.Parameter(torch.ones(2)), torch.randn(2)]
    message = "aot_export_joint_simple does not support input mutations. ViewAndMutationMeta"
    with pytest.raises(RuntimeError, match=message):
        aotkit.aot_export_joint_simple(f, args, trace_joint=False)
    with pytest.raises(RuntimeError, match=message):
        torch_aot.aot_export_joint_simple(f, args, trace_joint=False)
    joint_message = "Found a graph input that requires gradients, and received a mutation"
    with pytest.raises(RuntimeError, match=joint_message):
        aotkit.aot_export_joint_simple(f, args, trace_joint=True)
    with pytest.raises(RuntimeError, match=joint_message):
        torch_aot.aot_export_joint_simple(f, args, trace_joint=True)

"""aot_export_joint_simple: no calling-convention change, against torch's own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
import torch
from aotkit_frontends import aot_export_joint_simple, default_decompositions
from aotkit_partitioners import default_partition
from torch._functorch.aot_autograd import aot_export_joint_simple as torch_joint_simple


def two_outputs(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return a.sin() * b, (a * c).cos()


def list_output(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> list[torch.Tensor]:
    return [torch.nn.functional.gelu(a @ b.t()) + c.sum()]


PROGRAMS = [two_outputs, list_output]


def _args(requires_grad: bool) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return (
        torch.randn(3, 3, requires_grad=requires_grad),
        torch.randn(3, 3),
        torch.randn(3, 3, requires_grad=requires_grad),
    )


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__)
def test_inference_graph_has_the_functions_calling_convention(program: Callable[..., Any]) -> None:
    args = _args(requires_grad=False)
    gm = aot_export_joint_simple(program, args, trace_joint=False)
    ref = torch_joint_simple(program, args, trace_joint=False)
    assert len(list(gm.graph.find_nodes(op="placeholder"))) == len(args)
    ours, expected, theirs = gm(*args), program(*args), ref(*args)
    assert len(ours) == len(expected) == len(theirs)
    for o, e, t in zip(ours, expected, theirs, strict=True):
        torch.testing.assert_close(o, e)
        torch.testing.assert_close(o, t)


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__)
def test_joint_graph_matches_torch_and_autograd(program: Callable[..., Any]) -> None:
    args = _args(requires_grad=True)
    gm = aot_export_joint_simple(program, args, trace_joint=True)
    # torch annotates the result as Callable[..., Any]; it is a GraphModule
    ref = cast(torch.fx.GraphModule, torch_joint_simple(program, args, trace_joint=True))
    outs = program(*args)
    tangents = [torch.randn_like(o) for o in outs]
    primals = [a.detach() for a in args]
    # both return ((*outputs,), (*input grads,)); the output node's values are flat
    # (See Note [Joint graph calling convention])
    our_outs, our_grads = gm(primals, tangents)
    torch_outs, torch_grads = ref(primals, tangents)
    assert gm._out_spec == ref._out_spec
    ours = [*our_outs, *our_grads]
    theirs = [*torch_outs, *torch_grads]
    n = len(outs)
    expected_grads = torch.autograd.grad(outs, [args[0], args[2]], tangents)
    assert len(ours) == len(theirs) == n + len(args)
    for o, e in zip(ours[:n], outs, strict=True):
        torch.testing.assert_close(o, e)
    assert ours[n + 1] is None and theirs[n + 1] is None, "b does not require grad"
    torch.testing.assert_close(ours[n], expected_grads[0])
    torch.testing.assert_close(ours[n + 2], expected_grads[1])
    torch.testing.assert_close(ours[n + 2], theirs[n + 2])


def test_partitioned_forward_keeps_the_calling_convention() -> None:
    args = _args(requires_grad=True)
    gm = aot_export_joint_simple(two_outputs, args, trace_joint=True)
    primals = [a.detach() for a in args]
    fw, _ = default_partition(gm, [primals, [torch.ones(3, 3)] * 2], num_fwd_outputs=2)
    outs = fw(*primals)[:2]
    for o, e in zip(outs, two_outputs(*args), strict=True):
        torch.testing.assert_close(o, e)


def test_decompositions_apply() -> None:
    args = _args(requires_grad=True)
    gm = aot_export_joint_simple(
        list_output, args, trace_joint=True, decompositions=default_decompositions
    )
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.gelu_backward.default not in targets


ERRORS: list[tuple[str, Callable[..., Any], tuple[Any, ...], str]] = [
    (
        "input_mutation",
        lambda a: (a.mul_(2),),
        (torch.randn(3),),
        "does not support input mutations",
    ),
    ("output_is_input", lambda a: (a,), (torch.randn(3),), "does not support outputs that alias"),
    (
        "output_views_input",
        lambda a: (a.view(3),),
        (torch.randn(3),),
        "does not support outputs that alias",
    ),
    (
        "output_not_a_sequence",
        lambda a: a + 1,
        (torch.randn(3),),
        "outputs to be a single list/tuple",
    ),
    ("nested_output", lambda a: ((a + 1, a + 2),), (torch.randn(3),), "individual outputs"),
    (
        "pytree_input",
        lambda xs: (xs[0] + 1,),
        ([torch.randn(3)],),
        "individual inputs not to be pytrees",
    ),
]


@pytest.mark.parametrize("error", ERRORS, ids=[e[0] for e in ERRORS])
@pytest.mark.parametrize("trace_joint", [False, True])
def test_restrictions_raise_like_torch(
    error: tuple[str, Callable[..., Any], tuple[Any, ...], str], trace_joint: bool
) -> None:
    _, fn, args, message = error
    with pytest.raises(RuntimeError, match=message):
        aot_export_joint_simple(fn, args, trace_joint=trace_joint)
    with pytest.raises(RuntimeError):
        torch_joint_simple(fn, args, trace_joint=trace_joint)


def test_an_input_passed_twice_is_two_inputs_like_torch() -> None:
    x = torch.randn(3)
    gm = aot_export_joint_simple(lambda a, b: (a * b.cos(),), (x, x), trace_joint=False)
    tgm = torch_joint_simple(lambda a, b: (a * b.cos(),), (x, x), trace_joint=False)
    assert isinstance(tgm, torch.fx.GraphModule)
    assert gm.code == tgm.code
    assert len(gm.graph.find_nodes(op="placeholder")) == 2
    y = torch.randn(3)
    torch.testing.assert_close(gm(x, y)[0], x * y.cos())

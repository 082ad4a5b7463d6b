"""aot_export_module(..., pre_dispatch=True) against eager and against torch's own export.

Every case is exported by aotkit and by torch (the oracle): the graph code and the whole
GraphSignature must be the same, and aotkit's graph, run by hand on the module's real
parameters, buffers and inputs, must give eager's outputs and state updates. The first
cases are the modules of torch's own ``test_aot_export_predispatch_*`` tests.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.fx
import torch.nn as nn
import torch.utils._pytree as pytree
from aotkit_frontends import aot_export_module
from aotkit_functional import mutable_ops_in_graph
from aotkit_schemas import GraphSignature, graph_outputs
from torch._functorch.aot_autograd import aot_export_module as torch_export


class WithParam(nn.Module):
    """torch's TestMod: a parameter ``p`` and a function of it and the inputs."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.ones(2))
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(self.p, *args)


def _func_simple(p: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor]:
    y = x + 2
    with torch.no_grad():
        y.add_(2)
    return (x * 2 + y,)


def _func_composite_implicit(p: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor]:
    with torch.enable_grad():
        y = x @ x
    y.add_(2)
    return (x.sum() + y.sum(),)


def _composite_implicit_inplace(x: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor]:
    return (torch.ops.aten.absolute_.default(x.clone()),)


def _func_view(p: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor]:
    y = x @ x
    y.add_(2)
    return (x.sum() + y.view(1, 4).sum(),)


def _with_autograd_op(p: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor]:
    with torch.enable_grad():
        y = x + 5
        y.add_(5)
        y.add_(7)
        return (x.cos() + y.sin(),)


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.linear(x),)


class BufferAdd(nn.Module):
    foo: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("foo", torch.zeros(2, 2))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        self.foo.add_(4)
        return (x.sum() + self.foo.sum(),)


class ConvBatchnorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 1, 1)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.bn(self.conv(x)),)


class Reshape(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (x.reshape(4, 4).sum(),)


class Contiguous(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.ops.aten.contiguous.default(x).sum(),)


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        x: torch.Tensor = ctx.saved_tensors[0]
        return x * grad * 2


class AutogradFunction(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (Square.apply(self.lin(x)).sum(),)


class StateAndAliases(nn.Module):
    """Mutates a buffer, a user input and (under no_grad) a parameter; returns views of an
    input and a buffer itself."""

    buf: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("buf", torch.ones(3))

    def forward(self, x: torch.Tensor, acc: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            self.lin.bias.mul_(0.5)
        acc.mul_(2)
        self.buf.add_(x.sum(0))
        return (self.lin(x) + acc, x.t(), self.buf, self.buf[:2].view(-1))


class NormsAndKwargs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(3)
        self.ln = nn.LayerNorm(3)

    def forward(self, d: dict[str, torch.Tensor], *, scale: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = torch.nn.functional.linear(d["x"], d["w"])
        y = self.ln(self.bn(h.float())).softmax(-1) * scale
        return y, torch.nn.functional.gelu(d["x"])


class TiedDropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(6, 4)
        self.head = nn.Linear(4, 6, bias=False)
        self.head.weight = self.emb.weight
        self.drop = nn.Dropout(0.3)

    def forward(self, idx: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.head(self.drop(self.emb(idx))),)


@dataclass(frozen=True)
class Case:
    name: str
    module: Callable[[], nn.Module]
    args: Callable[[], tuple[Any, ...]]
    kwargs: Callable[[], dict[str, Any]] = dict


CASES = [
    # torch's test_aot_export_predispatch_* modules
    Case("func_simple", lambda: WithParam(_func_simple), lambda: (torch.randn(2, 2),)),
    Case(
        "func_composite_implicit",
        lambda: WithParam(_func_composite_implicit),
        lambda: (torch.randn(2, 2),),
    ),
    Case(
        "composite_implicit_inplace",
        lambda: WithParam(_composite_implicit_inplace),
        lambda: (torch.randn(2, 2),),
    ),
    Case("composite_implicit_linear", Linear, lambda: (torch.randn(2, 2),)),
    Case("func_view", lambda: WithParam(_func_view), lambda: (torch.randn(2, 2),)),
    Case("buffer_mutation_metadata", BufferAdd, lambda: (torch.randn(2, 2),)),
    Case("with_autograd_op", lambda: WithParam(_with_autograd_op), lambda: (torch.randn(2, 2),)),
    Case("conv_and_bn", ConvBatchnorm, lambda: (torch.randn(1, 1, 3, 3),)),
    Case("reshape", Reshape, lambda: (torch.randn(2, 8),)),
    Case("contiguous", Contiguous, lambda: (torch.randn(2, 8),)),
    # more
    Case("autograd_function", AutogradFunction, lambda: (torch.randn(2, 3),)),
    Case("state_and_aliases", StateAndAliases, lambda: (torch.randn(2, 3), torch.randn(2, 3))),
    Case(
        "norms_pytree_kwargs_autocast",
        NormsAndKwargs,
        lambda: ({"x": torch.randn(4, 3), "w": torch.randn(3, 3)},),
        lambda: {"scale": torch.tensor(2.0)},
    ),
    Case("tied_dropout", TiedDropout, lambda: (torch.tensor([0, 5, 2]),)),
]


def _case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


def _as_aotkit_signature(tsig: Any) -> GraphSignature:
    """torch's (inference) GraphSignature as aotkit's, field by field."""
    fields = {f.name: getattr(tsig, f.name) for f in dataclasses.fields(tsig)}
    assert fields.pop("backward_signature") is None
    return GraphSignature(backward_signature=None, **fields)


@contextlib.contextmanager
def _keeps_grad_mode() -> Iterator[None]:
    """A pre-dispatch graph sets the grad mode itself (``_set_grad_enabled`` nodes)."""
    with torch.set_grad_enabled(torch.is_grad_enabled()):
        yield


def _export_both(
    case: Case, *, grad: bool
) -> tuple[torch.fx.GraphModule, GraphSignature, Any, Any, nn.Module]:
    torch.manual_seed(0)
    mod = case.module()
    with torch.set_grad_enabled(grad):
        gm, sig = aot_export_module(
            mod, case.args(), trace_joint=False, pre_dispatch=True, kwargs=case.kwargs()
        )
        assert torch.is_grad_enabled() is grad
        tgm, tsig = torch_export(
            mod, case.args(), trace_joint=False, pre_dispatch=True, kwargs=case.kwargs()
        )
    return gm, sig, tgm, tsig, mod


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_graph_and_signature_match_torch(case: Case, grad: bool) -> None:
    gm, sig, tgm, tsig, _ = _export_both(case, grad=grad)
    assert gm.code == tgm.code
    assert sig == _as_aotkit_signature(tsig)
    assert mutable_ops_in_graph(gm.graph) == []


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_graph_run_by_hand_gives_eager_outputs_and_updates(case: Case) -> None:
    torch.manual_seed(0)
    mod = case.module()
    args, kwargs = case.args(), case.kwargs()
    gm, sig = aot_export_module(mod, args, trace_joint=False, pre_dispatch=True, kwargs=kwargs)
    eager_mod = copy.deepcopy(mod)
    params = dict(mod.named_parameters(remove_duplicate=False))
    buffers = dict(mod.named_buffers(remove_duplicate=False))
    user_flat = pytree.tree_leaves((args, kwargs))
    inputs = [
        *(params[f].detach().clone() for f in sig.inputs_to_parameters.values()),
        *(buffers[f].clone() for f in sig.inputs_to_buffers.values()),
        *(t.clone() for t in user_flat),
    ]
    names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    torch.manual_seed(1)
    with _keeps_grad_mode():
        results = dict(zip([n.name for n in graph_outputs(gm)], gm(*inputs), strict=True))

    eager_args, eager_kwargs = pytree.tree_map(lambda t: t.clone(), (args, kwargs))
    torch.manual_seed(1)
    eager_out = pytree.tree_leaves(eager_mod(*eager_args, **eager_kwargs))
    assert len(eager_out) == len(sig.user_outputs)
    for name, eager in zip(sig.user_outputs, eager_out, strict=True):
        torch.testing.assert_close(results[name], eager.detach(), msg=name)
    eager_params = dict(eager_mod.named_parameters(remove_duplicate=False))
    eager_buffers = dict(eager_mod.named_buffers(remove_duplicate=False))
    for name, fqn in sig.parameters_to_mutate.items():
        torch.testing.assert_close(results[name], eager_params[fqn].detach(), msg=fqn)
    for name, fqn in sig.buffers_to_mutate.items():
        torch.testing.assert_close(results[name], eager_buffers[fqn], msg=fqn)
    eager_user_flat = pytree.tree_leaves((eager_args, eager_kwargs))
    for name, input_name in sig.user_inputs_to_mutate.items():
        position = sig.user_inputs.index(input_name)
        torch.testing.assert_close(results[name], eager_user_flat[position], msg=input_name)
    # inputs not listed as mutated are the same after eager as before
    mutated_inputs = set(sig.user_inputs_to_mutate.values())
    for input_name, before, after in zip(sig.user_inputs, user_flat, eager_user_flat, strict=True):
        if input_name not in mutated_inputs:
            torch.testing.assert_close(after, before, msg=input_name)
    assert names[: len(params) + len(buffers)] == [*sig.inputs_to_parameters, *sig.inputs_to_buffers]


def _op_targets(gm: torch.fx.GraphModule) -> list[Any]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_composite_implicit_ops_and_grad_mode_changes_are_kept() -> None:
    gm, *_ = _export_both(_case("func_simple"), grad=True)
    grad_calls = [n for n in gm.graph.nodes if n.target is torch._C._set_grad_enabled]
    # entering no_grad, then restoring the caller's mode
    assert [n.args for n in grad_calls] == [(False,), (True,)]

    gm, *_ = _export_both(_case("func_simple"), grad=False)
    grad_calls = [n for n in gm.graph.nodes if n.target is torch._C._set_grad_enabled]
    assert [n.args for n in grad_calls] == [(False,), (False,)]

    gm, *_ = _export_both(_case("conv_and_bn"), grad=True)
    targets = _op_targets(gm)
    assert torch.ops.aten.conv2d.default in targets
    assert torch.ops.aten.convolution.default not in targets
    assert torch.ops.aten._native_batch_norm_legit_functional.default in targets

    gm, *_ = _export_both(_case("composite_implicit_linear"), grad=True)
    assert _op_targets(gm) == [torch.ops.aten.linear.default]


def test_buffer_mutation_graph_text() -> None:
    # torch's test_aot_export_predispatch_buffer_mutation_metadata
    mod = BufferAdd()
    inp = torch.randn(2, 2)
    gm, sig = aot_export_module(mod, [inp], trace_joint=False, pre_dispatch=True)
    assert str(gm.code).strip() == (
        "def forward(self, arg0_1, arg1_1):\n"
        "    add = torch.ops.aten.add.Tensor(arg0_1, 4);  arg0_1 = None\n"
        "    sum_1 = torch.ops.aten.sum.default(arg1_1);  arg1_1 = None\n"
        "    sum_2 = torch.ops.aten.sum.default(add)\n"
        "    add_1 = torch.ops.aten.add.Tensor(sum_1, sum_2);  sum_1 = sum_2 = None\n"
        "    return (add, add_1)"
    )
    assert sig.inputs_to_buffers == {"arg0_1": "foo"}
    assert sig.buffers_to_mutate == {"add": "foo"}
    assert sig.user_outputs == ["add_1"]
    # export traced on fake tensors: the module's buffer is untouched
    assert mod.foo.eq(0).all()
    new_foo, out = gm(torch.zeros(2, 2), inp)
    torch.testing.assert_close(out, BufferAdd()(inp)[0])
    _, out_again = gm(new_foo, inp)
    torch.testing.assert_close(out_again, inp.sum() + 32)


def test_dynamic_shapes_match_torch() -> None:
    mod, x = Linear(), torch.randn(5, 2)
    gm, sig = aot_export_module(mod, (x,), trace_joint=False, pre_dispatch=True, dynamic_shapes=True)
    tgm, tsig = torch_export(mod, (x,), trace_joint=False, pre_dispatch=True, dynamic_shapes=True)
    assert isinstance(tgm, torch.fx.GraphModule)
    assert gm.code == tgm.code
    assert sig == _as_aotkit_signature(tsig)
    x_node = list(gm.graph.find_nodes(op="placeholder"))[2]
    assert isinstance(x_node.meta["val"].shape[0], torch.SymInt)
    torch.testing.assert_close(gm(*mod.parameters(), torch.ones(7, 2))[0], mod(torch.ones(7, 2))[0])


def _dropout_then_mutate(p: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor]:
    y = torch.ops.aten.dropout.default(x, 0.1, train=False)
    y.add_(1)
    return (y,)


def _transpose_input(p: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor]:
    return (x.t_().sum(),)


@pytest.mark.parametrize(
    ("fn", "kwargs", "message"),
    [
        (_func_simple, {"trace_joint": True, "output_loss_index": 0},
         "pre_dispatch is not supported when trace_joint is True"),
        (_dropout_then_mutate, {"trace_joint": False}, "cannot mutate tensors with frozen storage"),
        (_transpose_input, {"trace_joint": False}, "Found an input that received a metadata mutation"),
    ],
    ids=["joint", "dropout_output_mutated", "metadata_mutation"],
)
def test_errors_match_torch(fn: Callable[..., Any], kwargs: dict[str, Any], message: str) -> None:
    for export in (aot_export_module, torch_export):
        with pytest.raises(RuntimeError, match=message):
            export(WithParam(fn), (torch.randn(2, 2),), pre_dispatch=True, **kwargs)

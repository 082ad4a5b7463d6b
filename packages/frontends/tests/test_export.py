"""aot_export_module: graphs, signatures and restrictions, against torch's own."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.fx
import torch.nn as nn
from aotkit_frontends import AOTExportError, TensorAttributeAssignedError, aot_export_module
from aotkit_schemas import GraphSignature, graph_outputs
from torch._functorch.aot_autograd import aot_export_module as torch_export


class MLPLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(4, 8)
        self.lin2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.lin2(self.lin1(x).relu())
        return logits.detach(), nn.functional.cross_entropy(logits, target)


class StatefulLoss(nn.Module):
    """Mutates a buffer and a user input; the loss is not the first output."""

    calls: torch.Tensor
    running: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))
        self.register_buffer("running", torch.zeros(4))

    def forward(self, x: torch.Tensor, seen: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.calls.add_(1)
        y = self.lin(x)
        self.running.mul_(0.9).add_(y.detach().mean(0) * 0.1)
        seen.add_(1)
        return y.detach() * 2, (y * seen).square().mean(), self.calls.clone()


class BatchNormLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.bn(self.conv(x)).relu().sum(),)


class KwargsModule(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 3))

    def forward(self, x: torch.Tensor, *, scale: torch.Tensor) -> tuple[torch.Tensor]:
        return ((x @ self.w * scale).sum(),)


@dataclass(frozen=True)
class Case:
    name: str
    module: Callable[[], nn.Module]
    args: Callable[[], tuple[Any, ...]]
    loss_index: int
    kwargs: Callable[[], dict[str, Any]] = dict
    # torch's joint export passes no kwargs to the module (TypeError); aotkit does
    torch_joint_fails: bool = False


CASES = [
    Case("mlp_loss", MLPLoss, lambda: (torch.randn(5, 4), torch.tensor([0, 1, 1, 0, 1])), 1),
    Case(
        "stateful",
        StatefulLoss,
        lambda: (torch.randn(3, 4, requires_grad=True), torch.zeros(3, 4)),
        1,
    ),
    Case("batchnorm", BatchNormLoss, lambda: (torch.randn(2, 2, 5, 5),), 0),
    Case(
        "kwargs",
        KwargsModule,
        lambda: (torch.randn(2, 3),),
        0,
        lambda: {"scale": torch.randn(())},
        True,
    ),
]


def _torch_export(mod: nn.Module, args: Any, **kwargs: Any) -> tuple[torch.fx.GraphModule, Any]:
    gm, sig = torch_export(mod, args, **kwargs)
    assert isinstance(gm, torch.fx.GraphModule)
    return gm, sig


def _as_aotkit_signature(tsig: Any) -> GraphSignature:
    """torch's GraphSignature as aotkit's, field by field (torch has no extra fields)."""
    fields = {f.name: getattr(tsig, f.name) for f in dataclasses.fields(tsig)}
    assert fields.pop("backward_signature") is None, "only for inference signatures"
    return GraphSignature(backward_signature=None, **fields)


def _names_are_graph_nodes(gm: torch.fx.GraphModule, sig: GraphSignature, *, joint: bool) -> None:
    """Every name in the signature is a placeholder or output of gm, at its place."""
    inputs = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    outputs = [n.name for n in graph_outputs(gm)]
    assert inputs == [*sig.inputs_to_parameters, *sig.inputs_to_buffers, *sig.user_inputs]
    mutated = [*sig.buffers_to_mutate, *sig.user_inputs_to_mutate]
    assert set(outputs[: len(mutated)]) == set(mutated)
    n_user = len(sig.user_outputs)
    assert outputs[len(mutated) : len(mutated) + n_user] == sig.user_outputs
    grads = outputs[len(mutated) + n_user :]
    if joint:
        bw = sig.backward_signature
        assert bw is not None
        assert grads == [*bw.gradients_to_parameters, *bw.gradients_to_user_inputs]
        assert bw.loss_output in sig.user_outputs
    else:
        assert sig.backward_signature is None and grads == []


def _export_both(
    case: Case, joint: bool
) -> tuple[Any, Any, Any, Any, nn.Module, tuple[Any, ...], dict[str, Any]]:
    torch.manual_seed(0)
    mod = case.module()
    args, kwargs = case.args(), case.kwargs()
    loss_index = case.loss_index if joint else None
    ours = aot_export_module(
        mod, args, trace_joint=joint, output_loss_index=loss_index, kwargs=kwargs
    )
    theirs = torch_export(mod, args, trace_joint=joint, output_loss_index=loss_index, kwargs=kwargs)
    return (*ours, *theirs, mod, args, kwargs)


@pytest.mark.parametrize("joint", [False, True], ids=["inference", "joint"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_graph_and_signature_match_torch(case: Case, joint: bool) -> None:
    if joint and case.torch_joint_fails:
        pytest.skip("torch cannot export this; see test_joint_export_forwards_kwargs")
    gm, sig, tgm, tsig, mod, args, kwargs = _export_both(case, joint)
    _names_are_graph_nodes(gm, sig, joint=joint)
    # the input side names the same placeholders (make_fx names them arg0_1, arg1_1, ...)
    assert sig.parameters == tsig.parameters and sig.buffers == tsig.buffers
    assert sig.user_inputs == tsig.user_inputs
    assert sig.inputs_to_parameters == tsig.inputs_to_parameters
    assert sig.inputs_to_buffers == tsig.inputs_to_buffers
    assert sig.in_spec == tsig.in_spec and sig.out_spec == tsig.out_spec
    assert sorted(sig.buffers_to_mutate.values()) == sorted(tsig.buffers_to_mutate.values())
    assert sorted(sig.user_inputs_to_mutate.values()) == sorted(tsig.user_inputs_to_mutate.values())
    assert sig.parameters_to_mutate == tsig.parameters_to_mutate == {}
    if not joint:
        # torch exports its inference graph as traced; aotkit's is the same graph
        assert gm.code == tgm.code
        assert sig == _as_aotkit_signature(tsig)
    if joint:
        bw, tbw = sig.backward_signature, tsig.backward_signature
        assert bw is not None and tbw is not None
        assert list(bw.gradients_to_parameters.values()) == list(
            tbw.gradients_to_parameters.values()
        )
        assert list(bw.gradients_to_user_inputs.values()) == list(
            tbw.gradients_to_user_inputs.values()
        )
    # both graphs compute the same values
    flat = [*mod.parameters(), *mod.buffers(), *args, *kwargs.values()]
    ours = gm(*[t.clone() if isinstance(t, torch.Tensor) else t for t in flat])
    theirs = tgm(*[t.clone() if isinstance(t, torch.Tensor) else t for t in flat])
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)


def test_loss_output_names_the_loss_when_buffers_are_mutated() -> None:
    # torch names graph_output_names[loss_index], ignoring the mutated buffers that come
    # first; here that is the updated `calls` buffer. aotkit names the loss.
    gm, sig = aot_export_module(
        StatefulLoss(),
        (torch.randn(3, 4), torch.zeros(3, 4)),
        trace_joint=True,
        output_loss_index=1,
    )
    bw = sig.backward_signature
    assert bw is not None
    assert bw.loss_output == sig.user_outputs[1]
    _, tsig = torch_export(
        StatefulLoss(),
        (torch.randn(3, 4), torch.zeros(3, 4)),
        trace_joint=True,
        output_loss_index=1,
    )
    assert tsig.backward_signature is not None
    assert tsig.backward_signature.loss_output in tsig.buffers_to_mutate, (
        "torch's bug is still there"
    )


def test_joint_graph_run_by_hand_gives_eager_loss_and_gradients() -> None:
    torch.manual_seed(0)
    mod = StatefulLoss()
    x, seen = torch.randn(3, 4, requires_grad=True), torch.zeros(3, 4)
    gm, sig = aot_export_module(mod, (x, seen), trace_joint=True, output_loss_index=1)

    params = dict(mod.named_parameters())
    buffers = dict(mod.named_buffers())
    inputs = {
        **{n: params[f].detach() for n, f in sig.inputs_to_parameters.items()},
        **{n: buffers[f].clone() for n, f in sig.inputs_to_buffers.items()},
        **dict(zip(sig.user_inputs, [x.detach(), seen.clone()], strict=True)),
    }
    out_names = [n.name for n in graph_outputs(gm)]
    results = dict(zip(out_names, gm(*inputs.values()), strict=True))

    eager_seen = seen.clone()
    eager_out = mod(x, eager_seen)
    eager_out[1].backward()
    bw = sig.backward_signature
    assert bw is not None
    torch.testing.assert_close(results[bw.loss_output], eager_out[1])
    for out_name, fqn in bw.gradients_to_parameters.items():
        torch.testing.assert_close(results[out_name], params[fqn].grad, msg=fqn)
    ((grad_name, input_name),) = bw.gradients_to_user_inputs.items()
    assert input_name == sig.user_inputs[0]
    torch.testing.assert_close(results[grad_name], x.grad)
    for out_name, fqn in sig.buffers_to_mutate.items():
        torch.testing.assert_close(results[out_name], buffers[fqn], msg=fqn)
    ((mut_name, mut_input),) = sig.user_inputs_to_mutate.items()
    assert mut_input == sig.user_inputs[1]
    torch.testing.assert_close(results[mut_name], eager_seen)


def test_joint_export_forwards_kwargs() -> None:
    mod = KwargsModule()
    x, scale = torch.randn(2, 3), torch.randn(())
    gm, sig = aot_export_module(
        mod, (x,), trace_joint=True, output_loss_index=0, kwargs={"scale": scale}
    )
    loss, grad = gm(mod.w.detach(), x, scale)
    mod(x, scale=scale)[0].backward()
    torch.testing.assert_close(loss, (x @ mod.w * scale).sum())
    torch.testing.assert_close(grad, mod.w.grad)
    assert sig.backward_signature is not None
    assert list(sig.backward_signature.gradients_to_parameters.values()) == ["w"]


def test_a_bare_tensor_output_is_accepted() -> None:
    # torch insists on a tuple; the exported graph returns a flat tuple either way
    mod = Returns(lambda m, x: m.lin(x).sum())
    for joint in (False, True):
        gm, sig = aot_export_module(
            mod, (torch.randn(2, 3),), trace_joint=joint, output_loss_index=0
        )
        assert len(sig.user_outputs) == 1


def test_export_leaves_the_module_untouched() -> None:
    mod = StatefulLoss()
    before = {k: v.clone() for k, v in mod.state_dict().items()}
    seen = torch.zeros(3, 4)
    aot_export_module(mod, (torch.randn(3, 4), seen), trace_joint=True, output_loss_index=1)
    for k, v in mod.state_dict().items():
        torch.testing.assert_close(v, before[k], msg=k)
    assert seen.eq(0).all(), "export traces on fake tensors; real inputs are not mutated"


def test_dynamic_shapes_give_symbolic_placeholders() -> None:
    gm, _ = aot_export_module(
        MLPLoss(),
        (torch.randn(5, 4), torch.tensor([0, 1, 1, 0, 1])),
        trace_joint=False,
        dynamic_shapes=True,
    )
    x_node = list(gm.graph.find_nodes(op="placeholder"))[4]
    assert isinstance(x_node.meta["val"].shape[0], torch.SymInt)


# ---- restrictions ----------------------------------------------------------------------


class Returns(nn.Module):
    def __init__(self, body: Callable[[Returns, torch.Tensor], Any]) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("buf", torch.zeros(3))
        self.body = body

    def forward(self, x: torch.Tensor) -> Any:
        return self.body(self, x)


class AssignsAttribute(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.cache: torch.Tensor | None = None
        self.calls = 0

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        self.cache = self.lin(x)
        self.calls += 1
        return (self.cache.sum(),)


def _frozen_bias_update() -> Returns:
    mod = Returns(lambda m, x: (m.lin(x).sum() + m.lin.bias.add_(1).sum(),))
    mod.lin.bias.requires_grad_(False)
    return mod


ERRORS: list[tuple[str, Callable[[], object], str]] = [
    (
        "no_loss_index",
        lambda: aot_export_module(
            Returns(lambda m, x: (m.lin(x).sum(),)), (torch.randn(2, 3),), trace_joint=True
        ),
        "output_loss_index",
    ),
    (
        "loss_not_scalar",
        lambda: aot_export_module(
            Returns(lambda m, x: (m.lin(x),)),
            (torch.randn(2, 3),),
            trace_joint=True,
            output_loss_index=0,
        ),
        "must be a scalar",
    ),
    (
        "loss_without_grad",
        lambda: aot_export_module(
            Returns(lambda m, x: (m.lin(x).sum().detach(),)),
            (torch.randn(2, 3),),
            trace_joint=True,
            output_loss_index=0,
        ),
        "does not require gradients",
    ),
    (
        "other_output_requires_grad",
        lambda: aot_export_module(
            Returns(lambda m, x: (m.lin(x), m.lin(x).sum())),
            (torch.randn(2, 3),),
            trace_joint=True,
            output_loss_index=1,
        ),
        "output 0 requires gradients",
    ),
    (
        "metadata_mutation",
        lambda: aot_export_module(
            Returns(lambda m, x: (x.t_().sum(),)), (torch.randn(2, 3),), trace_joint=False
        ),
        "metadata mutation",
    ),
    (
        "grad_input_data_mutation",
        lambda: aot_export_module(
            Returns(lambda m, x: (m.lin(x.mul_(2)).sum(),)),
            (torch.randn(2, 3, requires_grad=True),),
            trace_joint=True,
            output_loss_index=0,
        ),
        "requires gradients and received a data mutation",
    ),
    (
        "joint_parameter_mutation",
        lambda: aot_export_module(
            _frozen_bias_update(), (torch.randn(2, 3),), trace_joint=True, output_loss_index=0
        ),
        "parameter lin.bias was mutated, and trace_joint=True",
    ),
    (
        "joint_grad_parameter_mutation",
        lambda: aot_export_module(
            Returns(lambda m, x: (m.lin(x).sum() + m.lin.weight.mul_(2).sum(),)),
            (torch.randn(2, 3),),
            trace_joint=True,
            output_loss_index=0,
        ),
        "Found a graph input that requires gradients, and received a mutation",
    ),
    (
        "tensor_attribute_assigned",
        lambda: aot_export_module(
            AssignsAttribute(), (torch.randn(2, 3),), trace_joint=True, output_loss_index=0
        ),
        r"self\.cache was assigned during export",
    ),
]


@pytest.mark.parametrize("make_error", [e[1] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_each_restriction_raises_a_runtime_error(make_error: Callable[[], object]) -> None:
    message = {e[1]: e[2] for e in ERRORS}[make_error]
    with pytest.raises(RuntimeError, match=message):
        make_error()


def test_assigned_attribute_is_restored_and_error_is_also_a_value_error() -> None:
    mod = AssignsAttribute()
    with pytest.raises(TensorAttributeAssignedError) as info:
        aot_export_module(mod, (torch.randn(2, 3),), trace_joint=False)
    assert isinstance(info.value, ValueError) and isinstance(
        info.value, AOTExportError | RuntimeError
    )
    assert mod.cache is None and mod.calls == 0


def test_submodule_and_container_assignments_are_all_reported() -> None:
    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.history: list[torch.Tensor] = []
            self.note = "kept"

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.history.append(x * 2)
            self.note = "changed"
            return x.sum()

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Inner()

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
            return (self.inner(x),)

    mod = Outer()
    with pytest.raises(TensorAttributeAssignedError, match=r"self\.inner\.history\[0\]"):
        aot_export_module(mod, (torch.randn(3),), trace_joint=False)
    assert mod.inner.history == [] and mod.inner.note == "kept"




# ---- tied weights ------------------------------------------------------------------------


class TiedLM(nn.Module):
    """An Embedding and an output Linear sharing one weight (torch reaches it by two names)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 4)
        self.mid = nn.Linear(4, 4)
        self.head = nn.Linear(4, 7, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, ...]:
        logits = self.head(self.mid(self.emb(idx)).tanh())
        return nn.functional.cross_entropy(logits, target), logits.detach()


def _tied_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([1, 4, 6]), torch.tensor([2, 0, 5])


def test_tied_weights_are_lifted_once_per_name_like_torch() -> None:
    torch.manual_seed(0)
    mod, args = TiedLM(), _tied_inputs()
    assert len(list(mod.parameters())) == 3  # named_parameters() alone would lift it once
    gm, sig = aot_export_module(mod, args, trace_joint=False)
    tgm, tsig = _torch_export(mod, args, trace_joint=False)
    assert sig.parameters == ["emb.weight", "mid.weight", "mid.bias", "head.weight"]
    assert sig == _as_aotkit_signature(tsig)
    assert gm.code == tgm.code
    # each name has its own placeholder, used where that name is used
    placeholders = {sig.inputs_to_parameters.get(n.name): n for n in gm.graph.find_nodes(op="placeholder")}
    emb_w, head_w = placeholders["emb.weight"], placeholders["head.weight"]
    assert emb_w is not head_w
    assert [u.target for u in emb_w.users] == [torch.ops.aten.embedding.default]
    assert [u.target for u in head_w.users] == [torch.ops.aten.t.default]
    # run by hand on the real tensors: the shared weight is passed under both names
    with torch.no_grad():
        loss, logits = gm(*mod.parameters(), mod.head.weight, *args)
        eager_loss, eager_logits = mod(*args)
    torch.testing.assert_close(loss, eager_loss)
    torch.testing.assert_close(logits, eager_logits)


def test_tied_weights_joint_gives_one_partial_gradient_per_name() -> None:
    torch.manual_seed(0)
    mod, args = TiedLM(), _tied_inputs()
    gm, sig = aot_export_module(mod, args, trace_joint=True, output_loss_index=0)
    tgm, tsig = _torch_export(mod, args, trace_joint=True, output_loss_index=0)
    bw, tbw = sig.backward_signature, tsig.backward_signature
    assert bw is not None and tbw is not None
    assert sig.parameters == tsig.parameters and sig.inputs_to_parameters == tsig.inputs_to_parameters
    assert list(bw.gradients_to_parameters.values()) == list(tbw.gradients_to_parameters.values())
    assert list(bw.gradients_to_parameters.values()) == [
        "emb.weight", "mid.weight", "mid.bias", "head.weight"
    ]
    flat = [*(p.detach() for p in mod.parameters()), mod.head.weight.detach(), *args]
    ours = dict(zip([n.name for n in graph_outputs(gm)], gm(*flat), strict=True))
    theirs = dict(zip([n.name for n in graph_outputs(tgm)], tgm(*flat), strict=True))
    grads = {fqn: ours[name] for name, fqn in bw.gradients_to_parameters.items()}
    torch_grads = {fqn: theirs[name] for name, fqn in tbw.gradients_to_parameters.items()}
    for fqn in grads:
        torch.testing.assert_close(grads[fqn], torch_grads[fqn], msg=fqn)
    mod(*args)[0].backward()
    # the shared tensor's gradient is the sum of the gradients of its names
    assert mod.emb.weight.grad is not None
    torch.testing.assert_close(grads["emb.weight"] + grads["head.weight"], mod.emb.weight.grad)
    assert not torch.allclose(grads["emb.weight"], mod.emb.weight.grad)
    torch.testing.assert_close(grads["mid.weight"], mod.mid.weight.grad)
    torch.testing.assert_close(ours[bw.loss_output], theirs[tbw.loss_output])


class Multiplies(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        return ((x * y.sin() * self.w).sum(),)


def test_a_user_input_passed_twice_is_two_inputs_like_torch() -> None:
    torch.manual_seed(0)
    mod, x = Multiplies(), torch.randn(3, requires_grad=True)
    x_plain = x.detach()
    gm, sig = aot_export_module(mod, (x_plain, x_plain), trace_joint=False)
    tgm, tsig = _torch_export(mod, (x_plain, x_plain), trace_joint=False)
    assert gm.code == tgm.code
    assert sig == _as_aotkit_signature(tsig) and len(sig.user_inputs) == 2

    gm, sig = aot_export_module(mod, (x, x), trace_joint=True, output_loss_index=0)
    _, tsig = _torch_export(mod, (x, x), trace_joint=True, output_loss_index=0)
    bw, tbw = sig.backward_signature, tsig.backward_signature
    assert bw is not None and tbw is not None
    assert sig.user_inputs == tsig.user_inputs
    assert list(bw.gradients_to_user_inputs.values()) == list(tbw.gradients_to_user_inputs.values())
    outs = gm(mod.w.detach(), x.detach(), x.detach())
    results = dict(zip([n.name for n in graph_outputs(gm)], outs, strict=True))
    mod(x, x)[0].backward()
    # one gradient per position; together they make the tensor's gradient
    by_input = {inp: results[name] for name, inp in bw.gradients_to_user_inputs.items()}
    first, second = sig.user_inputs
    torch.testing.assert_close(by_input[first], (x.sin() * mod.w).detach())
    torch.testing.assert_close(by_input[first] + by_input[second], x.grad)


def test_mutated_repeated_inputs_are_rejected_like_torch() -> None:
    class TiedBuffer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Module(), nn.Module()
            shared = torch.zeros(3)
            self.a.register_buffer("count", shared)
            self.b.register_buffer("count", shared)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
            self.a.get_buffer("count").add_(1)
            return (x + self.b.get_buffer("count"),)

    class MutatesFirst(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
            x.add_(1)
            return (x * y,)

    x = torch.randn(3)
    before = x.clone()
    for export in (aot_export_module, torch_export):
        with pytest.raises(RuntimeError, match="Encountered duplicated inputs that are mutated"):
            export(TiedBuffer(), (torch.randn(3),), trace_joint=False)
        with pytest.raises(RuntimeError, match="Encountered duplicated inputs that are mutated"):
            export(MutatesFirst(), (x, x), trace_joint=False)
    torch.testing.assert_close(x, before)


# ---- mutations in an inference export ----------------------------------------------------


class UpdatesState(nn.Module):
    """Updates a parameter (under no_grad), a buffer and a user input, and reads them."""

    steps: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.scale = nn.Parameter(torch.ones(3))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor, acc: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            self.scale.mul_(0.5)
        self.steps.add_(1)
        acc.add_(x)
        return (self.lin(x) * self.scale + acc, self.steps * 2)


@pytest.mark.parametrize("pre_dispatch", [False, True], ids=["aten", "pre_dispatch"])
def test_inference_export_returns_updated_parameters_buffers_and_inputs(
    pre_dispatch: bool,
) -> None:
    torch.manual_seed(0)
    mod = UpdatesState()
    x, acc = torch.randn(2, 3), torch.randn(2, 3)
    gm, sig = aot_export_module(mod, (x, acc.clone()), trace_joint=False, pre_dispatch=pre_dispatch)
    tgm, tsig = _torch_export(
        mod, (x, acc.clone()), trace_joint=False, pre_dispatch=pre_dispatch
    )
    assert gm.code == tgm.code
    assert sig == _as_aotkit_signature(tsig)
    assert sig.parameters_to_mutate == {"mul": "scale"}
    assert list(sig.buffers_to_mutate.values()) == ["steps"]
    assert list(sig.user_inputs_to_mutate.values()) == ["arg5_1"]

    params, buffers = dict(mod.named_parameters()), dict(mod.named_buffers())
    inputs = {
        **{n: params[f].detach().clone() for n, f in sig.inputs_to_parameters.items()},
        **{n: buffers[f].clone() for n, f in sig.inputs_to_buffers.items()},
        **dict(zip(sig.user_inputs, [x, acc.clone()], strict=True)),
    }
    results = dict(zip([n.name for n in graph_outputs(gm)], gm(*inputs.values()), strict=True))
    eager_acc = acc.clone()
    eager_out = mod(x, eager_acc)
    for name, eager in zip(sig.user_outputs, eager_out, strict=True):
        torch.testing.assert_close(results[name], eager.detach())
    for name, fqn in sig.parameters_to_mutate.items():
        torch.testing.assert_close(results[name], params[fqn].detach(), msg=fqn)
    for name, fqn in sig.buffers_to_mutate.items():
        torch.testing.assert_close(results[name], buffers[fqn], msg=fqn)
    ((name, _),) = sig.user_inputs_to_mutate.items()
    torch.testing.assert_close(results[name], eager_acc)
    # the graph returns new values; the inputs it was given are untouched
    torch.testing.assert_close(inputs[sig.user_inputs[1]], acc)

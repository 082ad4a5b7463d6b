"""aot_module_simplified against torch's own, on a small table of modules."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import aotkit_frontends._aot_function as aotkit_aot_function
import pytest
import torch
import torch._functorch.aot_autograd as torch_aot
import torch.fx
import torch.nn as nn
from aotkit_backends import nop
from aotkit_frontends import aot_module_simplified
from aotkit_frontends._simplified import dynamo_metadata
from torch._dynamo.utils import GmWrapper
from torch._functorch.aot_autograd import aot_module_simplified as torch_simplified
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv


class TupleMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 6)
        self.b = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.a(x).tanh()
        return self.b(h), h.sum(1)


class ListOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        return [x @ self.w, (y * self.w).sum()]


class BufferAndInputMutation(nn.Module):
    steps: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x: torch.Tensor, acc: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.steps.add_(1)
        acc.add_(x.detach())
        return (self.lin(x) * self.steps, x.view(-1))


class BatchNormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.bn(self.conv(x)).relu(),)


class TiedWeights(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(4, 4, bias=False)
        self.dec = nn.Linear(4, 4, bias=False)
        self.dec.weight = self.enc.weight

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.dec(self.enc(x)),)


@dataclass(frozen=True)
class Case:
    name: str
    module: Callable[[], nn.Module]
    inputs: Callable[[], list[torch.Tensor]]


CASES = [
    Case("tuple_mlp", TupleMLP, lambda: [torch.randn(3, 4, requires_grad=True)]),
    Case("list_out", ListOut, lambda: [torch.randn(2, 4), torch.randn(4, 4)]),
    Case(
        "mutations",
        BufferAndInputMutation,
        lambda: [torch.randn(2, 4, requires_grad=True), torch.zeros(2, 4)],
    ),
    Case("batchnorm", BatchNormNet, lambda: [torch.randn(2, 2, 5, 5)]),
    Case("tied_weights", TiedWeights, lambda: [torch.randn(3, 4)]),
]


def _run(
    compile_fn: Callable[..., Any], case: Case, *, boxed: bool
) -> tuple[Any, list[torch.Tensor], list[torch.Tensor | None], list[torch.Tensor]]:
    torch.manual_seed(0)
    mod = case.module()
    example = case.inputs()
    forward = compile_fn(mod, example, nop)
    torch.manual_seed(1)
    args = case.inputs()
    out = forward(list(args)) if boxed else forward(*args)
    loss = sum(o.float().square().sum() for o in out if o.requires_grad)
    if isinstance(loss, torch.Tensor):
        torch.autograd.backward([loss])
    grads = [p.grad for p in mod.parameters()]
    return out, [a.detach() for a in args], grads, [b.clone() for b in mod.buffers()]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_torch(case: Case) -> None:
    out, args, grads, buffers = _run(aot_module_simplified, case, boxed=False)
    ref_out, ref_args, ref_grads, ref_buffers = _run(torch_simplified, case, boxed=False)
    assert len(out) == len(ref_out)
    for o, r in zip(out, ref_out, strict=True):
        torch.testing.assert_close(o, r)
    for a, r in zip(args, ref_args, strict=True):
        torch.testing.assert_close(a, r)  # input mutations were applied the same way
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)
    for b, r in zip(buffers, ref_buffers, strict=True):
        torch.testing.assert_close(b, r)


def test_keeps_the_module_output_container() -> None:
    x = torch.randn(3, 4)
    assert type(aot_module_simplified(TupleMLP(), [x], nop)(x)) is tuple
    assert (
        type(aot_module_simplified(ListOut(), [x[:2], x[:1].expand(4, 4)], nop)(x[:2], x[:1]))
        is list
    )


def test_forward_follows_torchs_calling_convention_and_exposes_module_methods() -> None:
    mod = TupleMLP()
    x = torch.randn(3, 4)
    forward = aot_module_simplified(mod, [x], nop)
    # like torch's: forward(*args) for a plain module ...
    assert not getattr(forward, "_boxed_call", False)
    torch.testing.assert_close(forward(x)[0], mod(x)[0])
    # ... and boxed for dynamo's GmWrapper (graphs whose inputs dynamo flattened)
    wrapped = GmWrapper(torch.fx.symbolic_trace(mod), lambda flat: flat)
    boxed = aot_module_simplified(wrapped, [x], nop)
    assert getattr(boxed, "_boxed_call", False) is True
    args = [x]
    boxed(args)
    assert args == [], "the boxed forward frees its argument list"
    assert dict(forward.named_parameters()) == dict(mod.named_parameters())  # type: ignore[attr-defined]
    assert list(forward.named_buffers()) == list(mod.named_buffers())  # type: ignore[attr-defined]
    mod.a.weight.grad = torch.ones_like(mod.a.weight)
    forward.zero_grad()  # type: ignore[attr-defined]
    assert mod.a.weight.grad is None


def test_non_sequence_output_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="returned a Tensor, but it must return a tuple or a list"):
        aot_module_simplified(nn.Linear(4, 4), [torch.randn(2, 4)], nop)


def test_reuses_the_fake_mode_and_shape_env_of_fake_inputs() -> None:
    mode = FakeTensorMode(shape_env=ShapeEnv())
    fake_x = mode.from_tensor(torch.randn(3, 4))
    seen: list[Any] = []

    def spy(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        seen.extend(example_inputs)
        return nop(gm, example_inputs)

    mod = TupleMLP()
    forward = aot_module_simplified(mod, [fake_x], spy)
    user_input = seen[-1]
    assert user_input.fake_mode is mode
    assert isinstance(user_input.shape[0], torch.SymInt), "sizes stay symbolic"
    for n in (2, 5):  # one graph serves every batch size
        x = torch.randn(n, 4)
        out = forward(x)
        torch.testing.assert_close(out[0], mod(x)[0])


def test_pre_grad_passes_rewrite_the_graph_first() -> None:
    gm = torch.fx.symbolic_trace(TupleMLP())

    def swap_tanh_for_relu(g: torch.fx.GraphModule, args: Any) -> torch.fx.GraphModule:
        for node in g.graph.nodes:
            if node.op == "call_method" and node.target == "tanh":
                node.target = "relu"
        g.recompile()
        return g

    x = torch.randn(3, 4)
    out = aot_module_simplified(gm, [x], nop, pre_grad_passes=swap_tanh_for_relu)(x)
    torch.testing.assert_close(out[1], cast(nn.Module, gm.a)(x).relu().sum(1))


def test_no_dynamo_metadata_without_dynamo() -> None:
    gm = torch.fx.symbolic_trace(TupleMLP())
    assert dynamo_metadata(gm, dict(gm.named_parameters()).keys(), 5) == (None, [])


def test_dynamo_metadata_from_a_dynamo_graph() -> None:
    recorded: list[tuple[Any, list[int]]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        names = {
            **dict(gm.named_parameters(remove_duplicate=False)),
            **dict(gm.named_buffers(remove_duplicate=False)),
        }
        recorded.append(dynamo_metadata(gm, names.keys(), len(names) + len(example_inputs)))
        forward = aot_module_simplified(gm, example_inputs, nop)
        return forward

    torch._dynamo.reset()
    mod = TupleMLP()
    x = torch.randn(3, 4)
    out = torch.compile(mod, backend=backend)(x)
    torch.testing.assert_close(out[0], mod(x)[0])
    ((sources, static),) = recorded
    assert sources is not None
    n_params = len(static)  # dynamo lifts nn.Module parameters as graph inputs; all static
    assert all(s is not None for s in sources)
    assert len(sources) >= 1 and n_params <= len(sources)
    torch._dynamo.reset()


# --- compile-time assumptions checked at run time (Note [Runtime checks of
# aot_module_simplified]); torch is the oracle for every message ---


@pytest.fixture
def fresh_graph_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """Restart torch's and aotkit's compilation ids at 0, so messages naming "graph N"
    compare equal."""
    monkeypatch.setattr(torch_aot, "AOT_COUNTER", itertools.count())
    monkeypatch.setattr(aotkit_aot_function, "_AOT_COUNTER", itertools.count())


class MutatesBoth(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        x.unsqueeze_(0)
        y.unsqueeze_(0)
        return (x + y,)


class Adds(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        return (x + y,)


# torch's and aotkit's aot_module_simplified, torch's first
SIMPLIFIED: tuple[Callable[..., Any], ...] = (torch_simplified, aot_module_simplified)


def _message_of(fn: Callable[..., Any], *args: Any) -> str:
    """The message of the AssertionError that ``fn(*args)`` raises."""
    with pytest.raises(AssertionError) as err:
        fn(*args)
    return str(err.value)


def _leaf_clone() -> torch.Tensor:
    return torch.randn(3, 3, requires_grad=True).clone()


@pytest.mark.parametrize("fake", [False, True], ids=["real", "fake"])
def test_a_duplicate_that_is_no_longer_one_raises_torchs_message(
    fresh_graph_ids: None, fake: bool
) -> None:
    x = _leaf_clone()
    example: tuple[Any, Any] = (x, x)
    if fake:
        fake_x = FakeTensorMode(shape_env=ShapeEnv()).from_tensor(x)
        example = (fake_x, fake_x)
    messages = []
    for compile_fn in SIMPLIFIED:
        compiled = compile_fn(MutatesBoth(), example, nop)
        a = _leaf_clone()
        compiled(a, a)  # the pattern it was compiled for
        b, c = _leaf_clone(), _leaf_clone()
        before = (b.shape, c.shape)
        messages.append(_message_of(compiled, b, c))
        assert (b.shape, c.shape) == before  # raised before touching the inputs
    assert messages[1] == messages[0]
    assert messages[1] == (
        "At compilation time, graph 0 was compiled under the assumption that input 1 would be "
        "a duplicate of input 0, but at runtime this was not the case.  This indicates a guard "
        "bug in AOTAutograd or Dynamo, please file a bug to PyTorch."
    )


def test_duplicates_are_numbered_like_torch(fresh_graph_ids: None) -> None:
    class MutatesAll(nn.Module):
        def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor]:
            for x in xs:
                x.mul_(2)
            return (sum(xs, torch.zeros(())),)

    a, b = torch.randn(2), torch.randn(2)
    messages = []
    for compile_fn in SIMPLIFIED:
        compiled = compile_fn(MutatesAll(), (a, a, b, b), nop)
        messages.append(_message_of(compiled, a, a, b, torch.randn(2)))
    # torch names the kept input by its position among the distinct inputs ("input 1")
    assert messages[1] == messages[0]
    assert "input 3 would be a duplicate of input 1," in messages[1]


def test_distinct_inputs_called_with_a_duplicate_run_like_torch() -> None:
    x, y = torch.randn(3), torch.randn(3)
    outs = []
    for compile_fn in SIMPLIFIED:
        compiled = compile_fn(Adds(), (x, y), nop)
        outs.append(compiled(x, x)[0])
    torch.testing.assert_close(outs[1], outs[0])
    torch.testing.assert_close(outs[1], x + x)


def test_an_unmutated_duplicate_is_checked_too() -> None:
    # torch treats an unmutated duplicate as two inputs; aotkit passes it once, so a call
    # with distinct tensors would compute with the first one twice: it raises instead.
    x = torch.randn(3)
    compiled = aot_module_simplified(Adds(), (x, x), nop)
    torch.testing.assert_close(compiled(x, x)[0], x + x)
    message = _message_of(compiled, x, torch.randn(3))
    assert "input 1 would be a duplicate of input 0, but at runtime" in message


def test_duplicate_inputs_are_guarded_for_dynamo() -> None:
    from aotkit_analysis import compute_input_layout
    from aotkit_frontends._runtime_asserts import register_duplicate_guards
    from torch._dynamo.source import LocalSource
    from torch._guards import DuplicateInputs, TracingContext, tracing

    x, y = torch.randn(2), torch.randn(2)
    layout = compute_input_layout([x, y, x])
    sources = [LocalSource("a"), LocalSource("b"), LocalSource("c")]
    context = TracingContext(FakeTensorMode())
    with tracing(context):
        register_duplicate_guards(layout, sources)
    assert context.guards_context.aotautograd_guards == [
        DuplicateInputs(LocalSource("a"), LocalSource("c"))
    ]


@pytest.mark.parametrize("fake", [False, True], ids=["real", "fake"])
def test_requires_grad_changes_raise_torchs_message_under_debug_assert(
    fresh_graph_ids: None, fake: bool
) -> None:
    with torch._functorch.config.patch(debug_assert=True):
        _check_requires_grad_messages(fake)


def _check_requires_grad_messages(fake: bool) -> None:
    x, y = torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    z = torch.randn(3, 3)
    example: tuple[Any, Any] = (x, z)
    if fake:
        mode = FakeTensorMode(shape_env=ShapeEnv())
        example = (mode.from_tensor(x), mode.from_tensor(z))
    messages = []
    for compile_fn in SIMPLIFIED:
        compiled = compile_fn(Adds(), example, nop)
        torch.testing.assert_close(compiled(x, z)[0], x + z)
        # requiring grad where it did not is fine the other way round
        compiled_xy = compile_fn(Adds(), (x, y), nop)
        torch.testing.assert_close(compiled_xy(x, z)[0], x + z)
        messages.append(_message_of(compiled, x, y))
    assert messages[1] == messages[0]
    assert messages[1] == (
        "At compilation time, graph 0 was compiled under the assumption that input 1 would "
        "not require grad, but at runtime this was not the case.  This indicates a guard bug "
        "in AOTAutograd or Dynamo, please file a bug to PyTorch."
    )


def test_requires_grad_is_checked_only_under_debug_assert() -> None:
    assert not torch._functorch.config.debug_assert
    x, y, z = (torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True),
               torch.randn(3, 3))
    grads = []
    for compile_fn in SIMPLIFIED:
        x.grad = y.grad = None
        compiled = compile_fn(Adds(), (x, z), nop)
        compiled(x, y)[0].sum().backward()  # like torch: no check, no gradient for y
        grads.append((x.grad, y.grad))
    assert grads[1][1] is None and grads[0][1] is None
    torch.testing.assert_close(grads[1][0], grads[0][0])


def test_a_fake_constant_in_the_joint_graph_raises_torchs_message() -> None:
    mode = FakeTensorMode()
    fake_x = mode.from_tensor(torch.randn(4, requires_grad=True))
    fake_z = mode.from_tensor(torch.randn(4))
    compiled: list[str] = []

    def compiler(gm: torch.fx.GraphModule, example: Any) -> Any:
        compiled.append("called")
        return nop(gm, example)

    class ClosesOverAFake(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
            return (x + fake_z,)

    messages = [
        _message_of(compile_fn, ClosesOverAFake(), (fake_x,), compiler)
        for compile_fn in SIMPLIFIED
    ]
    assert messages[1] == messages[0]
    assert messages[1].startswith("Unexpected fake buffer _tensor_constant0 ")
    assert compiled == []  # raised before any graph reached a compiler

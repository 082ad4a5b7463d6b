"""Programs eager runs where aotkit (and torch's AOTAutograd) used to raise (issue 35), each
compared with eager and, where it runs, with torch's AOTAutograd."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from aotkit import aot_function, nop
from torch._functorch.aot_autograd import aot_function as torch_aot_function

# ---- an autograd.Function whose backward raises (Note [Errors raised by a custom backward])


class NoBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        raise ValueError("NoBackward has no backward")


def _through_no_backward(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return NoBackward.apply(x).sum() + y.sum(), (y * 3).sum()


def _backward_raises_run(fn: Any) -> tuple[torch.Tensor | None, str]:
    """Call ``fn``, backpropagate the output that avoids the raising node (fine in eager),
    then the one that reaches it; the gradient of the first and the second's error."""
    x = torch.randn(3, requires_grad=True)
    y = torch.randn(3, requires_grad=True)
    reaches, avoids = fn(x, y)
    avoids.backward()
    grad = None if y.grad is None else y.grad.clone()
    with pytest.raises(ValueError) as info:
        reaches.backward()
    return grad, str(info.value)


def test_custom_backward_that_raises_only_when_reached() -> None:
    eager = _backward_raises_run(_through_no_backward)
    assert eager[0] is not None and eager[1] == "NoBackward has no backward"
    torch.testing.assert_close(eager[0], torch.full((3,), 3.0))
    got = _backward_raises_run(aot_function(_through_no_backward, nop))
    assert got[1] == eager[1] and got[0] is not None
    torch.testing.assert_close(got[0], eager[0])
    # torch's AOTAutograd raises at the call, where eager runs
    with pytest.raises(ValueError, match="NoBackward has no backward"):
        torch_aot_function(_through_no_backward, nop)(
            torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
        )


def test_custom_backward_error_keeps_a_local_class() -> None:
    class Unsupported(Exception):
        pass

    class Local(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x.sin()

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            raise Unsupported(f"no gradient for shape {tuple(grad.shape)}")

    def f(x: torch.Tensor) -> torch.Tensor:
        return Local.apply(x).sum()

    for fn in (f, aot_function(f, nop)):
        out = fn(torch.randn(2, 3, requires_grad=True))
        with pytest.raises(Unsupported, match=r"no gradient for shape \(2, 3\)"):
            out.backward()


def test_torch_errors_in_a_custom_backward_still_raise_at_compile_time() -> None:
    """A custom backward that cannot be traced, as opposed to one that raises itself, is
    not deferred: the error torch raises while tracing comes at the call (Note [Errors
    raised by a custom backward])."""

    class Branches(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            if grad.sum() > 0:  # data-dependent: fine in eager, not on fake tensors
                return grad * 2
            return grad

    def f(x: torch.Tensor) -> torch.Tensor:
        return Branches.apply(x).sum()

    x = torch.randn(3, requires_grad=True)
    f(x).backward()  # eager runs
    with pytest.raises(Exception) as info:
        aot_function(f, nop)(x)
    assert not isinstance(info.value, ValueError)


def test_custom_backward_error_from_the_disk_cache(disk_cache_on: Path) -> None:
    from aotkit_cache import cache_counters

    got = _backward_raises_run(aot_function(_through_no_backward, nop))
    assert cache_counters["trace"] == 1
    again = _backward_raises_run(aot_function(_through_no_backward, nop))
    assert cache_counters["hit"] == 1 and cache_counters["trace"] == 1
    assert again[1] == got[1] == "NoBackward has no backward"
    assert again[0] is not None and got[0] is not None
    torch.testing.assert_close(again[0], got[0])


# ---- a compiled function called inside another (Note [Compiled functions called while
# aotkit traces])


def _nested_pair() -> tuple[Any, Any]:
    def inner_fn(x: torch.Tensor) -> torch.Tensor:
        return x.sin() * 2

    def outer_fn(inner: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (inner(x @ w) + 1).cos().sum()

    return inner_fn, outer_fn


@pytest.mark.parametrize("inner_first", [False, True], ids=["fresh", "inner-compiled-first"])
def test_aot_function_inside_aot_function(inner_first: bool) -> None:
    inner_fn, outer_fn = _nested_pair()
    x = torch.randn(3, 4)
    w = torch.randn(4, 2, requires_grad=True)

    def run(inner: Any, compile: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        w.grad = None
        outer = functools.partial(outer_fn, inner)
        out = (outer if compile is None else compile(outer))(x, w)
        out.backward()
        assert w.grad is not None
        return out.detach(), w.grad.clone()

    eager = run(inner_fn)
    inner = aot_function(inner_fn, nop)
    if inner_first:  # a cached entry of the inner function exists; it is not used inside
        torch.testing.assert_close(inner(x @ w), inner_fn(x @ w))
    compiled_outer = aot_function(functools.partial(outer_fn, inner), nop)
    for _ in range(2):
        got = run(inner, lambda _: compiled_outer)
        torch.testing.assert_close(got, eager)
    assert len(compiled_outer._aotkit_cache.entries) == 1
    assert len(inner._aotkit_cache.entries) == (1 if inner_first else 0)
    # the inner function still compiles on its own, for real tensors
    torch.testing.assert_close(inner(x), inner_fn(x))
    assert len(inner._aotkit_cache.entries) >= 1
    # torch's AOTAutograd fails here
    with pytest.raises(RuntimeError, match="FunctionalTensor on its own"):
        run(torch_aot_function(inner_fn, nop), lambda f: torch_aot_function(f, nop))


def test_aot_module_inside_aot_module() -> None:
    from aotkit import aot_module

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())

    class Outer(torch.nn.Module):
        def __init__(self, block: torch.nn.Module) -> None:
            super().__init__()
            self.block = block
            self.head = torch.nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.block(x)).sum()

    import copy

    eager_model = Outer(copy.deepcopy(block))
    compiled_model = Outer(aot_module(copy.deepcopy(block), nop))
    compiled_model.load_state_dict(
        {k.replace("block.", "block.orig_module.", 1): v for k, v in eager_model.state_dict().items()}
    )
    outer = aot_module(compiled_model, nop)
    x = torch.randn(5, 4)
    eager_model(x).backward()
    outer(x).backward()
    for (n, p), (_, q) in zip(
        eager_model.named_parameters(), compiled_model.named_parameters(), strict=True
    ):
        assert q.grad is not None, n
        torch.testing.assert_close(q.grad, p.grad)


# ---- a global tensor mutated inside the function: lifted as an input (Note [Global tensors
# lifted as inputs])

_GLOBAL_BUFFER = torch.zeros(3)
_GLOBAL_SCALE = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)


def _adds_to_global(x: torch.Tensor) -> torch.Tensor:
    _GLOBAL_BUFFER.add_(x.detach())
    return x * 2


def _helper_writes(x: torch.Tensor) -> None:
    _GLOBAL_BUFFER.mul_(0.5).add_(x.detach().sin())


def _through_helper(x: torch.Tensor) -> torch.Tensor:
    _helper_writes(x)  # the helper writes the global: found through the callee
    return (x * _GLOBAL_SCALE).sum() + _GLOBAL_BUFFER.sum()


def _closure_state() -> Any:
    state = torch.ones(3)

    def step(x: torch.Tensor) -> torch.Tensor:
        state.mul_(2)
        return (x * state * _GLOBAL_SCALE).sum()

    return step


def _global_run(fn: Any, read: Any) -> list[torch.Tensor]:
    """Three calls: output, input and captured gradients, and the captured state after;
    ``_GLOBAL_BUFFER`` is rebound to a fresh tensor first."""
    global _GLOBAL_BUFFER
    _GLOBAL_BUFFER = torch.zeros(3)
    _GLOBAL_SCALE.grad = None
    got = []
    for k in range(3):
        x = torch.linspace(-1.0, 1.0, 3) + k
        x.requires_grad_()
        out = fn(x)
        out.sum().backward()
        got += [out.detach(), x.grad, read().clone()]
    scale = _GLOBAL_SCALE.grad
    return [*got, scale if scale is not None else torch.zeros(0)]


@pytest.mark.parametrize("case", ["mutated", "through_helper", "closure"])
def test_mutated_global_is_lifted(case: str) -> None:
    """eager's values, gradients (a global parameter's too) and the global after each
    call; the slot is read on every call, so a global rebound between runs is the one the
    compiled function reads and writes, never the first one."""
    if case == "closure":
        eager_fn, compiled_fn = _closure_state(), _closure_state()  # one state each
        eager = _global_run(eager_fn, lambda: eager_fn.__closure__[0].cell_contents)
        compiled = aot_function(compiled_fn, nop)
        got = _global_run(compiled, lambda: compiled_fn.__closure__[0].cell_contents)
        torch.testing.assert_close(got, eager)
        return
    fn = _adds_to_global if case == "mutated" else _through_helper
    eager = _global_run(fn, lambda: _GLOBAL_BUFFER)
    compiled = aot_function(fn, nop)
    for _ in range(2):  # the second run rebinds the global: no stale read or write
        torch.testing.assert_close(_global_run(compiled, lambda: _GLOBAL_BUFFER), eager)
    assert len(compiled._aotkit_cache.entries) == 1


def _reads_rebound(x: torch.Tensor) -> torch.Tensor:
    return x + _GLOBAL_BUFFER


def test_rebound_global_of_another_shape_compiles_again() -> None:
    global _GLOBAL_BUFFER
    compiled = aot_function(_reads_rebound, nop)
    for value in (torch.zeros(3), torch.arange(3.0), torch.ones(2, 3)):
        _GLOBAL_BUFFER = value
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x), _reads_rebound(x))
    assert len(compiled._aotkit_cache.entries) == 2  # the same shape reuses its graph


def _make_adder(value: float) -> Any:
    offset = torch.full((3,), value)

    def add(x: torch.Tensor) -> torch.Tensor:
        offset.add_(1)
        return x + offset

    return add


_ADDER = _make_adder(0.0)


def _calls_adder(x: torch.Tensor) -> torch.Tensor:
    return _ADDER(x) * 2


def test_rebound_function_holding_a_closure_tensor_is_found_again() -> None:
    """The slot was found through ``_ADDER``; rebinding it finds the new closure's cell
    and compiles again: never the old closure's tensor."""
    global _ADDER
    compiled = aot_function(_calls_adder, nop)
    for value in (0.0, 10.0, 10.0):
        _ADDER = _make_adder(value)
        eager = [_calls_adder(torch.ones(3)), _calls_adder(torch.ones(3))]
        _ADDER = _make_adder(value)
        got = [compiled(torch.ones(3)), compiled(torch.ones(3))]
        torch.testing.assert_close(got, eager)
        torch.testing.assert_close(_ADDER.__closure__[0].cell_contents, torch.full((3,), value + 2))


def test_mutated_global_torch_raises_its_internal_assert() -> None:
    x = torch.randn(3, requires_grad=True)
    # torch's AOTAutograd raises its internal assert as the error itself
    with pytest.raises(RuntimeError, match="INTERNAL ASSERT FAILED"):
        torch_aot_function(_adds_to_global, nop)(x)


def test_global_module_parameters_still_raise_naming_them() -> None:
    """A module reached through a global is not lifted (aot_module lifts modules): the
    error names it and the remedy."""
    from aotkit_capture import CapturedTensorError

    with pytest.raises(CapturedTensorError, match="aot_module") as info:
        aot_function(lambda x: _GLOBAL_LINEAR(x), nop)(torch.randn(2, 3))
    assert "INTERNAL ASSERT" not in str(info.value)
    assert "non-functional tensor" in str(info.value.__cause__) or info.value.__cause__


_GLOBAL_LINEAR = torch.nn.Linear(3, 3)


# ---- one loss from a plain output and a TwoTensor output (Note [Subclass gradients of
# plain outputs])


def _plain_and_two(
    x: torch.Tensor, y: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return (x * w).sin(), (y * 2).cos() + y.exp()


def _plain_and_two_sharing_w(
    x: torch.Tensor, y: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return (x * w).sin(), (y * 2).cos() * w


def _mixed_loss_run(fn: Any) -> list[torch.Tensor]:
    from torch.testing._internal.two_tensor import TwoTensor

    torch.manual_seed(0)
    x = torch.randn(3, requires_grad=True)
    y = TwoTensor(torch.randn(3), torch.randn(3)).requires_grad_()
    w = torch.randn(3, requires_grad=True)
    plain, two = fn(x, y, w)
    loss = plain.sum() + two.sum()
    assert type(loss).__name__ == "TwoTensor"
    loss.backward()
    grads = []
    for t in (x, y, w):
        assert t.grad is not None
        assert type(t.grad).__name__ == "TwoTensor"
        grads += [t.grad.a, t.grad.b]  # type: ignore[attr-defined]
    return grads


def test_loss_of_a_plain_and_a_two_tensor_output() -> None:
    eager = _mixed_loss_run(_plain_and_two)
    compiled = aot_function(_plain_and_two, nop)
    for _ in range(2):
        torch.testing.assert_close(_mixed_loss_run(compiled), eager)
    # torch's AOTAutograd raises its metadata guess error
    with pytest.raises(RuntimeError, match="__coerce_same_metadata_as_tangent__"):
        _mixed_loss_run(torch_aot_function(_plain_and_two, nop))


def test_loss_of_a_plain_and_a_two_tensor_output_sharing_an_input_raises() -> None:
    """``w`` feeds both outputs: its gradient sums a TwoTensor from the plain output's
    subclass gradient with one the graph builds from the TwoTensor output's inner tensors,
    which the desugared backward cannot give eager's form of. A clear error, not a nested
    TwoTensor (Note [Subclass gradients of plain outputs])."""
    eager = _mixed_loss_run(_plain_and_two_sharing_w)
    assert len(eager) == 6
    with pytest.raises(RuntimeError, match="nested differently than traced"):
        _mixed_loss_run(aot_function(_plain_and_two_sharing_w, nop))


# ---- selective activation checkpointing with dropout (Note [Selective checkpointing with
# in-place ops])


def _save_mm(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    if op is torch.ops.aten.mm.default:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _sac_region(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = torch.nn.functional.dropout(torch.mm(x, w).relu(), 0.5, training=True)
    return torch.mm(h, w).sin()


def _sac_dropout(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    context_fn = functools.partial(create_selective_checkpoint_contexts, _save_mm)
    out = checkpoint(_sac_region, x, w, use_reentrant=False, context_fn=context_fn)
    return out.sum()


def _sac_run(fn: Any, seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    x = torch.randn(4, 4)
    w = torch.randn(4, 4, requires_grad=True)
    out = fn(x, w)
    out.backward()
    assert w.grad is not None
    return [out.detach(), w.grad, torch.rand(2)]  # the generator after forward and backward


@pytest.mark.parametrize("partitioner", ["default", "min_cut"])
def test_selective_checkpoint_with_dropout(partitioner: str) -> None:
    from aotkit import get_partitioner

    compiled = aot_function(_sac_dropout, nop, partition_fn=get_partitioner(partitioner))
    for seed in (0, 1):
        torch.testing.assert_close(_sac_run(compiled, seed), _sac_run(_sac_dropout, seed))
    assert len(compiled._aotkit_cache.entries) == 1
    import torch.fx.traceback as fx_traceback

    assert "recompute" not in fx_traceback.current_meta  # nothing leaks into later traces
    # torch's AOTAutograd fails on this program (its default partitioner on the tags); its
    # failed trace leaves the checkpoint's tags in fx's current meta, restored here
    with fx_traceback.preserve_node_meta(fx_traceback.should_preserve_node_meta):
        with pytest.raises(TypeError, match="not supported between instances of 'NoneType'"):
            _sac_run(torch_aot_function(_sac_dropout, nop), 0)


# ---- Inductor's freezing reads what AOTAutograd leaves in the TracingContext (Note
# [Metadata in the TracingContext for Inductor's freezing])


class _FrozenWithSubclass(torch.nn.Module):
    def __init__(self) -> None:
        from torch.testing._internal.two_tensor import TwoTensor

        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(
            TwoTensor(torch.randn(3, 4), torch.randn(3, 4)), requires_grad=False
        )
        self.wt = torch.nn.Parameter(torch.randn(3, 4), requires_grad=False)
        self.register_buffer("calls", torch.zeros(3, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)  # a mutated buffer stays an input: not frozen
        picked = x.index_select(0, torch.tensor([0, 2, 1]))
        out: torch.Tensor = picked + self.w + self.wt * self.calls
        return out


def _frozen_run(model: torch.nn.Module, compile: bool) -> list[torch.Tensor]:
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    fn = torch.compile(model, backend="inductor", fullgraph=True) if compile else model
    got = []
    with torch.no_grad(), inductor_config.patch(freezing=True):
        for k in range(2):
            out = fn(torch.arange(12.0).reshape(3, 4) + k)
            got += [out.a, out.b]
    return [*got, model.calls.clone()]  # type: ignore[operator]


def test_inductor_freezing_with_subclass_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    """aotkit's aot_autograd under Inductor's compile_fx (torch.compile's backends routed to
    aotkit's, as torch's suite test_inductor_freezing_with_subclasses runs it)."""
    import aotkit
    import torch._dynamo.backends.common as dynamo_common
    from aotkit_backends import inductor_available

    if not inductor_available():
        pytest.skip("Inductor cannot compile here")
    eager = _frozen_run(_FrozenWithSubclass(), compile=False)
    torch.testing.assert_close(_frozen_run(_FrozenWithSubclass(), compile=True), eager)  # torch
    monkeypatch.setattr(dynamo_common, "aot_autograd", aotkit.aot_autograd)
    torch.testing.assert_close(_frozen_run(_FrozenWithSubclass(), compile=True), eager)


# ---- an effectful custom op inside torch.cond: tokens threaded through the branches (Note
# [Effect tokens through torch.cond])


def _effect_in_cond(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    from _effect_ops import log

    out: torch.Tensor = torch.cond(
        p, lambda x: log(x, "true") * x, lambda x: log(x, "false") - 1, (log(x, "before"),)
    )
    return log(out, "after").sum()


class _EffectInCond(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 3))

    def forward(self, x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return _effect_in_cond(x * self.w, p)


def _effect_cond_run(fn: Any, requires_grad: bool, pred: bool) -> list[Any]:
    """The side effects (forward, then backward) in order, the output and the gradient."""
    from _effect_ops import LOG

    torch.manual_seed(0)
    x = torch.randn(3, requires_grad=requires_grad)
    LOG.clear()
    out = fn(x, torch.tensor(pred))
    got: list[Any] = [list(LOG), out.detach()]
    if requires_grad:
        out.backward()
        got += [list(LOG), x.grad]
    return got


def _effect_cond_compiled(frontend: str) -> Any:
    from aotkit import aot_module

    if frontend == "aot_function":
        return aot_function(_effect_in_cond, nop)
    if frontend == "aot_module":
        return aot_module(_EffectInCond(), nop)
    torch._dynamo.reset()
    return torch.compile(_effect_in_cond, backend="aotkit_eager", fullgraph=True)


@pytest.mark.parametrize("frontend", ["aot_function", "aot_module", "aotkit_eager"])
@pytest.mark.parametrize("requires_grad", [False, True], ids=["inference", "training"])
def test_effectful_op_in_cond(requires_grad: bool, frontend: str) -> None:
    """Both branches, twice each from one compiled function: the side effects in eager's
    order (the branch's op runs again in the backward, as eager's cond recomputes the
    branch there), eager's output and gradient."""
    compiled = _effect_cond_compiled(frontend)
    eager_fn = _EffectInCond() if frontend == "aot_module" else _effect_in_cond
    for pred in (True, False, True):
        eager = _effect_cond_run(eager_fn, requires_grad, pred)
        assert eager[0] == ["before", "true" if pred else "false", "after"]
        got = _effect_cond_run(compiled, requires_grad, pred)
        assert got[0] == eager[0] and got[2:3] == eager[2:3]
        torch.testing.assert_close(got[1::2], eager[1::2])
    if frontend == "aot_function":
        assert len(compiled._aotkit_cache.entries) == 1  # one graph for both branches
        # torch's AOTAutograd fails on this program
        with pytest.raises(Exception):  # noqa: B017
            _effect_cond_run(torch_aot_function(_effect_in_cond, nop), requires_grad, True)


def test_effectful_op_in_cond_under_inductor_raises_a_clear_error() -> None:
    """Inductor lowers effect tokens to None, which cannot be a cond operand: a clear
    error before Inductor runs (Note [Unlifted tokens for Inductor])."""
    from _effect_ops import LOG
    from aotkit_backends import TokensThroughHigherOrderOpError, inductor_available

    if not inductor_available():
        pytest.skip("Inductor cannot compile here")
    torch._dynamo.reset()
    compiled = torch.compile(_effect_in_cond, backend="aotkit_inductor", fullgraph=True)
    LOG.clear()
    with pytest.raises(Exception, match="Remedy: compile this function with a non-Inductor") as info:
        compiled(torch.randn(3), torch.tensor(True))
    err: BaseException | None = info.value
    while err is not None and not isinstance(err, TokensThroughHigherOrderOpError):
        err = err.__cause__ or err.__context__
    assert err is not None
    assert LOG == []  # the graph never ran


def test_effectful_op_in_cond_outside_aotkit_is_torchs() -> None:
    """aotkit's cond rule defers to torch's outside aotkit's compilations: torch's
    AOTAutograd still fails as before once aotkit has compiled such a program."""
    from _effect_ops import LOG

    _effect_cond_run(aot_function(_effect_in_cond, nop), True, True)
    LOG.clear()
    with pytest.raises(AssertionError, match="FakeTensors"):
        torch_aot_function(_effect_in_cond, nop)(torch.randn(3), torch.tensor(True))

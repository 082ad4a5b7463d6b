"""Backward ops' fake kernels run their decomposition directly on meta during aotkit's joint
traces (Note [Decompositions run directly on meta]): each op of ``DIRECT_OPS`` gives the
outputs FakeTensorMode's own route gives on random configurations (every metadata field
compared), the graphs and training results are the same with and without the direct route,
the route is taken, and the hook is gone after the trace."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from typing import Any

import aotkit_tracing.core._direct_decompositions as direct_module
import aotkit_tracing.core._single_pass as single_pass_module
import aotkit_tracing.core._trace as trace_module
import pytest
import torch
import torch._dynamo
import torch.nn as nn
import torch.utils._pytree as pytree
from _small_models import fresh_dynamo  # noqa: F401  (autouse fixture)
from aotkit_capture import record_compilations
from aotkit_tracing.core._direct_decompositions import (
    DIRECT_OPS,
    direct_decompositions,
    run_directly,
)
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

aten = torch.ops.aten
FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
KINDS = ("contiguous", "channels_last", "channels_last_3d", "transposed", "permuted")
CONFIGS = 60


def _layout(rng: random.Random, shape: list[int], kind: str, dtype: torch.dtype) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype)
    if kind == "channels_last" and len(shape) == 4:
        return t.to(memory_format=torch.channels_last)
    if kind == "channels_last_3d" and len(shape) == 5:
        return t.to(memory_format=torch.channels_last_3d)
    if kind == "transposed":
        return t.transpose(0, -1).contiguous().transpose(0, -1)
    if kind == "permuted":
        perm = list(range(len(shape)))
        rng.shuffle(perm)
        inverse = [perm.index(i) for i in range(len(shape))]
        return torch.empty([shape[i] for i in perm], dtype=dtype).permute(inverse)
    return t


def _pointwise_extra(op: str, rng: random.Random) -> tuple[Any, ...]:
    return {
        "threshold_backward": (0.0,),
        "native_dropout_backward": (rng.choice([1.0, 2.0]),),
        "leaky_relu_backward": (0.01, rng.random() < 0.5),
        "softplus_backward": (1.0, 20.0),
    }.get(op, ())


POINTWISE = (
    "threshold_backward",
    "sigmoid_backward",
    "tanh_backward",
    "silu_backward",
    "hardswish_backward",
    "hardsigmoid_backward",
    "leaky_relu_backward",
    "softplus_backward",
    "native_dropout_backward",
)


def _cases(op: Any, rng: random.Random) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    name = op._opname
    for _ in range(CONFIGS):
        nd = rng.choice([2, 3, 4, 5])
        shape = [rng.choice([1, 2, 3, 5, 8]) for _ in range(nd)]
        c = shape[1]
        dt = rng.choice(FLOATS)
        wdt = rng.choice([dt, torch.float32])
        k1, k2 = rng.choice(KINDS), rng.choice(KINDS)
        g = _layout(rng, shape, k1, dt)
        if name == "native_batch_norm_backward":
            x = _layout(rng, shape, k2, dt)
            train = rng.random() < 0.6
            w = torch.empty(c, dtype=wdt) if rng.random() < 0.8 else None
            stats: list[torch.Tensor | None] = [torch.empty(c, dtype=wdt) for _ in range(4)]
            if not train and rng.random() < 0.3:
                stats[2] = stats[3] = None
            mask = [rng.random() < 0.8, rng.random() < 0.7, rng.random() < 0.7]
            yield (g, x, w, *stats, train, 1e-5, mask), {}
        elif name == "_native_batch_norm_legit_functional":
            # eval mode and half inputs are drawn too: the route must step aside for them
            train = rng.random() < 0.7
            w = torch.empty(c, dtype=wdt) if rng.random() < 0.8 else None
            b = torch.empty(c, dtype=wdt) if rng.random() < 0.8 else None
            stats = [torch.empty(c, dtype=wdt) for _ in range(2)]
            yield (_layout(rng, shape, k1, dt), w, b, *stats, train, 0.1, 1e-5), {}
        elif name == "native_layer_norm_backward":
            x = _layout(rng, shape, k2, dt)
            k = rng.randrange(1, nd + 1)
            normalized = shape[nd - k :]
            stat_dt = torch.float32 if dt in (torch.bfloat16, torch.float16) else dt
            mean = torch.empty(shape[: nd - k] + [1] * k, dtype=stat_dt)
            w = torch.empty(normalized, dtype=wdt) if rng.random() < 0.8 else None
            b = torch.empty(normalized, dtype=wdt) if rng.random() < 0.8 else None
            mask = [rng.random() < 0.8, rng.random() < 0.7, rng.random() < 0.7]
            yield (g, x, normalized, mean, torch.empty_like(mean), w, b, mask), {}
        elif name in ("_log_softmax_backward_data", "_softmax_backward_data"):
            out = _layout(rng, shape, k2, dt)
            yield (g, out, rng.randrange(nd), rng.choice([dt, torch.float32])), {}
        elif name == "gelu_backward":
            yield (g, _layout(rng, shape, k2, dt)), {"approximate": rng.choice(["none", "tanh"])}
        elif name == "nll_loss_backward":
            n = shape[0]
            x = torch.empty(n, c, dtype=dt)
            reduction = rng.choice([0, 1, 2])
            grad = torch.empty(n, dtype=dt) if reduction == 0 else torch.empty((), dtype=dt)
            w = torch.empty(c, dtype=dt) if rng.random() < 0.3 else None
            target = torch.empty(n, dtype=torch.long)
            yield (grad, x, target, w, reduction, -100, torch.empty((), dtype=dt)), {}
        elif name in POINTWISE:
            other = (
                torch.bool
                if name == "native_dropout_backward"
                else rng.choice([dt, dt, torch.float32])
            )
            x = _layout(rng, shape, k2, other)
            yield (g, x, *_pointwise_extra(name, rng)), {}
        else:
            raise AssertionError(f"no configurations for {op}: add them with the op")


def _facts(out: Any) -> list[Any]:
    return [
        None
        if t is None
        else (
            type(t),
            tuple(t.shape),
            t.stride(),
            t.storage_offset(),
            t.dtype,
            t.device,
            t.requires_grad,
            t.layout,
        )
        for t in (out if isinstance(out, (tuple, list)) else (out,))
    ]


# ops the direct route answers only for some arguments (the rest take the ordinary route)
CONDITIONAL = {aten._native_batch_norm_legit_functional.default}


@pytest.mark.parametrize("below_autograd", [False, True], ids=["autograd", "below_autograd"])
@pytest.mark.parametrize("op", sorted(DIRECT_OPS, key=str), ids=str)
def test_direct_route_gives_the_fake_routes_outputs(op: Any, below_autograd: bool) -> None:
    # below_autograd: autograd's keys excluded, as where functionalization calls the fake
    # kernels in the joint traces
    rng = random.Random(str(op))
    mode = FakeTensorMode()
    compared = declined = 0
    guard = torch._C._AutoDispatchBelowAutograd if below_autograd else contextlib.nullcontext
    for args, kwargs in _cases(op, rng):
        with mode:
            fargs, fkwargs = pytree.tree_map_only(torch.Tensor, mode.from_tensor, (args, kwargs))
        for t in pytree.tree_leaves((fargs, fkwargs)):
            if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and rng.random() < 0.5:
                t.requires_grad_(True)
        try:
            with guard():
                want = mode._dispatch_impl(op, (), fargs, fkwargs)
        except Exception as e:  # the direct route must then not answer either
            with guard():
                assert run_directly(mode, op, fargs, fkwargs) is NotImplemented, e
            continue
        with guard():
            got = run_directly(mode, op, fargs, fkwargs)
        if got is NotImplemented and op in CONDITIONAL:
            # it steps aside only off its branch-free arguments or where autograd ran
            # inside the decomposition (the fake route's outputs then require grad too)
            branch_free = direct_module._CONDITIONS[op](fargs, fkwargs)
            assert not branch_free or any(
                t.requires_grad for t in pytree.tree_leaves(want) if isinstance(t, torch.Tensor)
            ), (op, [getattr(a, "shape", a) for a in args])
            declined += 1
            continue
        assert got is not NotImplemented
        assert _facts(got) == _facts(want), (op, [getattr(a, "shape", a) for a in args])
        outs = got if isinstance(got, (tuple, list)) else (got,)
        assert all(
            isinstance(t, FakeTensor) and t.fake_mode is mode for t in outs if t is not None
        ), [type(t) for t in outs]
        compared += 1
    if op in CONDITIONAL and not below_autograd:
        assert compared + declined >= CONFIGS // 2, (compared, declined)
        assert compared >= 1, declined
    else:
        assert compared >= (CONFIGS // 5 if op in CONDITIONAL else CONFIGS // 2), compared


def test_batch_norm_routed_only_where_its_decomposition_does_not_branch() -> None:
    # See Note [The forward's batch norm directly on meta]
    op = aten._native_batch_norm_legit_functional.default
    mode = FakeTensorMode()

    def bn(dtype: torch.dtype, training: bool, grad: bool = False) -> Any:
        with mode:
            x = torch.empty(2, 3, 4, 4, dtype=dtype, requires_grad=grad)
            w, b, rm, rv = (torch.empty(3) for _ in range(4))
        with torch._C._AutoDispatchBelowAutograd():
            return run_directly(mode, op, (x, w, b, rm, rv, training, 0.1, 1e-5), {})

    got = bn(torch.float32, True)
    assert got is not NotImplemented
    assert [tuple(t.shape) for t in got] == [(2, 3, 4, 4), (3,), (3,), (3,), (3,)]
    assert not any(t.requires_grad for t in got)
    assert bn(torch.float64, True) is not NotImplemented
    assert bn(torch.float32, True, grad=True) is not NotImplemented  # autograd excluded
    assert bn(torch.float32, False) is NotImplemented  # eval: CPU gives (0,) statistics
    assert bn(torch.float16, True) is NotImplemented  # CPU casts the statistics to half
    assert bn(torch.bfloat16, True) is NotImplemented
    with mode:
        x = torch.empty(2, 3, 4, 4, requires_grad=True)
        w, b, rm, rv = (torch.empty(3, requires_grad=True) for _ in range(4))
    # autograd ran inside the decomposition (outputs require grad): the ordinary route
    assert run_directly(mode, op, (x, w, b, rm, rv, True, 0.1, 1e-5), {}) is NotImplemented


def test_ineligible_arguments_take_the_ordinary_route() -> None:
    mode = FakeTensorMode()
    other = FakeTensorMode()
    with mode:
        g = torch.empty(2, 3)
    with other:
        x = torch.empty(2, 3)
    op = aten.threshold_backward.default
    assert run_directly(mode, op, (g, x, 0.0), {}) is NotImplemented  # another mode's tensor
    assert run_directly(mode, aten.mul.Tensor, (g, g), {}) is NotImplemented  # not listed
    assert run_directly(mode, op, (g, g, 0.0), {}) is not NotImplemented
    mode.propagate_real_tensors = True  # what torch's config turns on
    assert run_directly(mode, op, (g, g, 0.0), {}) is NotImplemented
    mode.propagate_real_tensors = False
    with torch.device("meta"):
        m = torch.empty(2, 3)
    assert run_directly(mode, op, (g, m, 0.0), {}) is NotImplemented  # not a FakeTensor
    with mode:
        on_meta = torch.empty(2, 3, device="meta")
    assert run_directly(mode, op, (on_meta, on_meta, 0.0), {}) is NotImplemented  # not CPU


def test_the_hook_is_removed_and_not_nested() -> None:
    mode = FakeTensorMode()
    with direct_decompositions(mode):
        hooked = mode._dispatch_impl
        with direct_decompositions(mode):
            assert mode._dispatch_impl is hooked
        assert mode._dispatch_impl is hooked
    assert "_dispatch_impl" not in vars(mode)
    with pytest.raises(RuntimeError), direct_decompositions(mode):
        raise RuntimeError("boom")
    assert "_dispatch_impl" not in vars(mode)


def _convnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.Hardswish(),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 5),
        nn.LogSoftmax(dim=1),
    ).to(memory_format=torch.channels_last)


def _transformer() -> nn.Module:
    return nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.1, batch_first=True)


def _node_facts(gm: torch.fx.GraphModule) -> list[tuple[Any, ...]]:
    facts = []
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else (val,)
        facts.append(
            (
                n.name,
                n.op,
                str(n.target),
                tuple(sorted(n.meta)),
                tuple(
                    (v.shape, v.stride(), v.storage_offset(), v.dtype, v.requires_grad)
                    for v in vals
                    if isinstance(v, torch.Tensor)
                ),
                n.meta.get("partitioner_tag"),
            )
        )
    return facts


def _train(make: Callable[[], nn.Module], x: torch.Tensor, target: torch.Tensor) -> Any:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make().train()
    with record_compilations() as records:
        out = torch.compile(model, backend="aotkit_eager")(x)
        loss = nn.functional.nll_loss(out.flatten(1)[:, :5].log_softmax(1), target)
        loss.backward()
    grads = [p.grad for p in model.parameters()]
    return list(records), loss.detach(), grads, [b.clone() for b in model.buffers()]


@contextlib.contextmanager
def _counting() -> Iterator[list[Any]]:
    seen: list[Any] = []
    run = direct_module.run_directly

    def counted(mode: Any, func: Any, args: Any, kwargs: Any) -> Any:
        out = run(mode, func, args, kwargs)
        if out is not NotImplemented:
            seen.append(func)
        return out

    direct_module.run_directly = counted
    try:
        yield seen
    finally:
        direct_module.run_directly = run


@pytest.mark.parametrize(
    "make,x",
    [
        (_convnet, lambda: torch.randn(2, 3, 6, 6).to(memory_format=torch.channels_last)),
        (_transformer, lambda: torch.randn(2, 5, 8)),
    ],
    ids=["convnet", "transformer"],
)
def test_same_graphs_and_results_without_the_direct_route(
    make: Callable[[], nn.Module], x: Callable[[], torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    inp = x()
    target = torch.tensor([1, 3])
    with _counting() as seen:
        records, loss, grads, buffers = _train(make, inp, target)
    assert seen, "the direct route was never taken"
    if make is _convnet:  # See Note [The forward's batch norm directly on meta]
        assert aten._native_batch_norm_legit_functional.default in seen
    with monkeypatch.context() as m:
        for module in (single_pass_module, trace_module):
            m.setattr(module, "direct_decompositions", lambda mode: contextlib.nullcontext())
        plain, loss2, grads2, buffers2 = _train(make, inp, target)
    assert len(records) == len(plain) >= 1
    for a, b in zip(records, plain, strict=True):
        assert a.path == b.path
        for mod in ("joint_module", "fw_module", "bw_module"):
            ga, gb = getattr(a, mod, None), getattr(b, mod, None)
            assert (ga is None) == (gb is None), mod
            if ga is not None and gb is not None:
                assert ga.code == gb.code, mod
                assert _node_facts(ga) == _node_facts(gb), mod
    assert torch.equal(loss, loss2)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads2, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(buffers, buffers2, strict=True))

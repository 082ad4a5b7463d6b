"""The single pass's forward presents fake tensors with autograd's requires_grad flags so
FakeTensorMode's cache hits dynamo's entries (Note [Fake-cache keys of the single pass's
forward]): the same graphs, node meta and training results as without the flags, fewer
fake-kernel runs, and no flag left behind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aotkit_tracing.core._single_pass as single_pass_module
import pytest
import torch
import torch._dynamo
import torch.nn as nn
from _small_models import attention as _attention
from _small_models import convnet as _convnet
from _small_models import fresh_dynamo  # noqa: F401  (autouse fixture)
from _small_models import mlp as _mlp
from aotkit_capture import CompiledArtifacts, record_compilations
from aotkit_tracing.core._grad_flags import FlagRead, GradFlags
from torch._subclasses.fake_tensor import FakeTensorMode

MODELS: list[tuple[str, Callable[[], nn.Module], Callable[[], torch.Tensor]]] = [
    ("mlp", _mlp, lambda: torch.randn(4, 8)),
    ("convnet", _convnet, lambda: torch.randn(2, 3, 6, 6)),
    ("attention", _attention, lambda: torch.randn(2, 5, 8)),
]


def _node_facts(gm: torch.fx.GraphModule) -> list[tuple[Any, ...]]:
    facts = []
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else (val,)
        tm = n.meta.get("tensor_meta")
        tms = tm if isinstance(tm, (tuple, list)) else (tm,)
        facts.append(
            (
                n.name,
                n.op,
                str(n.target),
                tuple(
                    (v.shape, v.stride(), v.dtype, v.requires_grad)
                    for v in vals
                    if isinstance(v, torch.Tensor)
                ),
                tuple(getattr(t, "requires_grad", None) for t in tms),
                n.meta.get("partitioner_tag"),
            )
        )
    return facts


def _compile_and_train(
    make: Callable[[], nn.Module], x: torch.Tensor
) -> tuple[list[CompiledArtifacts], torch.Tensor, list[torch.Tensor], list[torch.Tensor], int]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make().train()
    misses = FakeTensorMode.cache_misses
    with record_compilations() as records:
        out = torch.compile(model, backend="aotkit_eager")(x)
        out.sum().backward()
    misses = FakeTensorMode.cache_misses - misses
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return list(records), out.detach(), grads, [b.clone() for b in model.buffers()], misses


@pytest.mark.parametrize("name,make,make_input", MODELS, ids=[m[0] for m in MODELS])
def test_flags_change_no_graph_and_no_result(
    name: str,
    make: Callable[[], nn.Module],
    make_input: Callable[[], torch.Tensor],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = make_input()
    records, out, grads, buffers, _ = _compile_and_train(make, x)
    assert [r.path for r in records] == ["single pass"], [r.path_reason for r in records]
    with monkeypatch.context() as m:
        m.setattr(single_pass_module, "GradFlags", lambda: None)
        plain, out2, grads2, buffers2, _ = _compile_and_train(make, x)
    assert [r.path for r in plain] == ["single pass"]
    for mod in ("joint_module", "fw_module", "bw_module"):
        a, b = getattr(records[0], mod, None), getattr(plain[0], mod, None)
        if a is None and b is None:
            continue
        assert a is not None and b is not None, mod
        assert a.code == b.code, mod
        assert _node_facts(a) == _node_facts(b), mod
    assert torch.equal(out, out2) and not out.requires_grad
    assert all(torch.equal(a, b) for a, b in zip(grads, grads2, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(buffers, buffers2, strict=True))


def test_flags_let_the_forward_hit_dynamos_fake_cache_entries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GELU and LayerNorm run Python decompositions in their fake kernels: dynamo ran them
    # on the same fake mode with autograd's flags; a key with the same flags hits
    x = torch.randn(4, 8)
    FakeTensorMode.cache_clear()
    *_, with_flags = _compile_and_train(_mlp, x)
    FakeTensorMode.cache_clear()
    with monkeypatch.context() as m:
        m.setattr(single_pass_module, "GradFlags", lambda: None)
        *_, without = _compile_and_train(_mlp, x)
    assert with_flags < without, (with_flags, without)


def test_no_flag_is_left_on_a_traced_value() -> None:
    # every flag set in the forward is cleared when the forward ends: the joint's values
    # and the forward outputs handed on carry the flags autograd's level had, not ours
    records, *_ = _compile_and_train(_mlp, torch.randn(4, 8))
    joint = records[0].joint_module
    assert joint is not None
    for n in joint.graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) and n.op != "placeholder":
            assert not val.requires_grad, n.name


def test_an_output_that_already_requires_grad_stops_the_flags() -> None:
    # a fake kernel that copied the flag onto its output (a reference implementation)
    # could have read it: the single pass is abandoned for the two-pass flow
    with FakeTensorMode():
        a = torch.empty(3, requires_grad=True)
        out = torch.empty(3)
        out.requires_grad = True
    flags = GradFlags()
    with pytest.raises(FlagRead):
        flags.after_op([a], out)


def test_flags_follow_grad_mode_and_dtype_and_are_cleared() -> None:
    with FakeTensorMode():
        a = torch.empty(3, requires_grad=True)
        b = torch.empty(3)
        f, i = torch.empty(3), torch.empty(3, dtype=torch.int64)
    flags = GradFlags()
    flags.after_op([b], f)
    assert not f.requires_grad  # no argument requires grad
    with torch.no_grad():
        flags.after_op([a], f)
    assert not f.requires_grad  # grad mode off
    flags.after_op([a, b], (f, i))
    assert f.requires_grad and not i.requires_grad
    flags.after_op([a], a)  # an op returning its argument leaves it alone
    flags.clear()
    assert not f.requires_grad and a.requires_grad


def test_backward_view_flags_change_no_graph_and_hit_more(monkeypatch: pytest.MonkeyPatch) -> None:
    # See Note [Fake-cache keys of the single pass's backward]: the attention model's
    # backward reshapes its gradients as the forward reshaped the activations
    x = torch.randn(2, 5, 8)
    FakeTensorMode.cache_clear()
    records, out, grads, buffers, with_flags = _compile_and_train(_attention, x)
    assert [r.path for r in records] == ["single pass"], [r.path_reason for r in records]
    FakeTensorMode.cache_clear()
    with monkeypatch.context() as m:
        m.setattr(single_pass_module, "BackwardViewFlags", lambda: None)
        plain, out2, grads2, buffers2, without = _compile_and_train(_attention, x)
    assert [r.path for r in plain] == ["single pass"]
    for mod in ("joint_module", "fw_module", "bw_module"):
        a, b = getattr(records[0], mod), getattr(plain[0], mod)
        assert a is not None and b is not None, mod
        assert a.code == b.code, mod
        assert _node_facts(a) == _node_facts(b), mod
    assert torch.equal(out, out2)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads2, strict=True))
    assert with_flags < without, (with_flags, without)


def _run_op(seen: list[bool]) -> Callable[..., Any]:
    def run(func: Any, args: Any, kwargs: Any) -> Any:
        seen.append(bool(args[0].requires_grad))
        # the layer runs below autograd, where a view takes no flag from its base
        with torch._C._AutoDispatchBelowADInplaceOrView():
            return func(*args, **kwargs)

    return run


def test_backward_view_flags_are_set_for_view_ops_only_and_cleared() -> None:
    from aotkit_tracing.core._grad_flags import BackwardViewFlags

    layer = BackwardViewFlags()
    seen: list[bool] = []
    with FakeTensorMode():
        f = torch.empty(3, 4)
        i = torch.empty(3, 4, dtype=torch.int64)
        v = layer(torch.ops.aten.view.default, (f, [12]), {}, _run_op(seen))
        layer(torch.ops.aten.mul.Tensor, (f, f), {}, _run_op(seen))
        layer(torch.ops.aten.view.default, (i, [12]), {}, _run_op(seen))
    assert seen == [True, False, False]
    assert not f.requires_grad and not v.requires_grad and not i.requires_grad


def test_backward_view_flags_stop_at_an_output_that_requires_grad() -> None:
    from aotkit_tracing.core._grad_flags import BackwardViewFlags

    with FakeTensorMode():
        f = torch.empty(3, 4)
        bad = torch.empty(12)
        bad.requires_grad = True
    with pytest.raises(FlagRead):
        BackwardViewFlags()(torch.ops.aten.view.default, (f, [12]), {}, lambda *a: bad)
    assert not f.requires_grad


def test_the_single_pass_puts_one_aotkit_mode_on_the_dispatch_stack() -> None:
    # See Note [One dispatch frame for aotkit's trace layers]: the op gate and the forward's
    # flags are layers of the RNG keying mode, not modes of their own
    import aotkit
    from aotkit_tracing.core._device_queries import OWN_MODES

    depths: list[int] = []

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        stack = [
            torch._C._get_dispatch_stack_at(i) for i in range(torch._C._len_torch_dispatch_stack())
        ]
        depths.append(sum(type(m) in OWN_MODES for m in stack))
        return (x @ w).relu().sum()

    with record_compilations() as records:
        fn = aotkit.aot_function(f, fw_compiler=aotkit.nop, bw_compiler=aotkit.nop)
        fn(torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)).backward()
    assert [r.path for r in records] == ["single pass"], [r.path_reason for r in records]
    assert depths == [1], depths

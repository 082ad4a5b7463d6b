"""aotkit's trace modes answer ``prim.device`` queries on fake tensors themselves (Note
[Device queries in the trace's dispatch modes]): the same graphs, node meta and results
as when the queries go down to FakeTensorMode, fewer queries reaching make_fx's proxy
mode, and a user's own dispatch mode still sees every query."""

from __future__ import annotations

import collections
from typing import Any

import aotkit
import aotkit_tracing._rng_replay as rng_module
import pytest
import torch
import torch._dynamo
import torch.nn as nn
from _small_models import fresh_dynamo  # noqa: F401  (autouse fixture)
from aotkit_capture import CompiledArtifacts, record_compilations
from torch.fx.experimental import proxy_tensor
from torch.utils._python_dispatch import TorchDispatchMode

PRIM_DEVICE = torch.ops.prim.device.default


def _model() -> nn.Module:
    # BatchNorm (kept running-stat updates), dropout (the RNG keying mode stays on in
    # the backward), GELU and LayerNorm
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.Flatten(),
        nn.Linear(4 * 36, 8),
        nn.GELU(),
        nn.Dropout(0.25),
        nn.LayerNorm(8),
    )


class _CountProxyDeviceQueries:
    def __init__(self) -> None:
        self.count = 0

    def __enter__(self) -> _CountProxyDeviceQueries:
        self._orig = proxy_tensor.ProxyTorchDispatchMode.__torch_dispatch__
        orig = self._orig

        def counted(mode: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is PRIM_DEVICE:
                self.count += 1
            return orig(mode, func, types, args, kwargs)

        proxy_tensor.ProxyTorchDispatchMode.__torch_dispatch__ = counted  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        proxy_tensor.ProxyTorchDispatchMode.__torch_dispatch__ = self._orig  # type: ignore[method-assign]


def _train(x: torch.Tensor) -> tuple[list[CompiledArtifacts], list[torch.Tensor], int]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _model().train()
    with _CountProxyDeviceQueries() as c, record_compilations() as records:
        out = torch.compile(model, backend="aotkit_eager")(x)
    out.pow(2).sum().backward()
    results = [out.detach(), *(p.grad for p in model.parameters()), *model.buffers()]
    return list(records), [r for r in results if r is not None], c.count


def _node_facts(gm: torch.fx.GraphModule) -> list[tuple[Any, ...]]:
    # module ids and autograd's sequence numbers differ from one model to the next: the
    # module paths and types, and the sequence numbers relative to the graph's first
    seq = [n.meta["seq_nr"] for n in gm.graph.nodes if "seq_nr" in n.meta]
    first = min(seq, default=0)
    facts = []
    for n in gm.graph.nodes:
        stack = n.meta.get("nn_module_stack")
        val = n.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else (val,)
        facts.append(
            (
                n.name,
                n.op,
                str(n.target),
                tuple(
                    (v.shape, v.stride(), v.dtype, v.device, v.requires_grad)
                    for v in vals
                    if isinstance(v, torch.Tensor)
                ),
                n.meta.get("stack_trace"),
                None if stack is None else [(p, str(t)) for p, t in stack.values()],
                n.meta["seq_nr"] - first if "seq_nr" in n.meta else None,
                n.meta.get("partitioner_tag"),
            )
        )
    return facts


def test_answered_queries_change_no_graph_and_no_result(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(2, 3, 6, 6)
    records, results, queries = _train(x)
    assert [r.path for r in records] == ["single pass"], [r.path_reason for r in records]
    with monkeypatch.context() as m:
        # aotkit's trace layers all answer in the keying mode's frame (See Note [One
        # dispatch frame for aotkit's trace layers])
        m.setattr(rng_module, "is_device_query", lambda func, args: False)
        plain, plain_results, plain_queries = _train(x)
    assert [r.path for r in plain] == ["single pass"]
    for mod in ("joint_module", "fw_module", "bw_module"):
        a, b = getattr(records[0], mod), getattr(plain[0], mod)
        assert a is not None and b is not None, mod
        assert a.code == b.code, mod
        assert _node_facts(a) == _node_facts(b), mod
    assert len(results) == len(plain_results)
    assert all(torch.equal(a, b) for a, b in zip(results, plain_results, strict=True))
    # the queries made above the proxy mode by aotkit's modes' callers no longer reach it
    assert plain_queries > 0
    assert queries < plain_queries, (queries, plain_queries)


class _DeviceQueryLog(TorchDispatchMode):  # type: ignore[no-untyped-call,misc]
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.seen: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        self.seen[str(func)] += 1
        return func(*args, **(kwargs or {}))


def test_a_users_dispatch_mode_still_sees_every_device_query(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a user's mode around the compile sits between aotkit's modes and the proxy mode:
    # aotkit's modes pass every query down to it, as without the shortcut
    def counts(shortcut: bool) -> int:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = _model().train()
        fn = aotkit.aot_module(model, fw_compiler=aotkit.nop, bw_compiler=aotkit.nop)
        log = _DeviceQueryLog()
        with monkeypatch.context() as m:
            if not shortcut:
                m.setattr(rng_module, "is_device_query", lambda func, args: False)
            with log:
                fn(torch.randn(2, 3, 6, 6))
        return log.seen[str(PRIM_DEVICE)]

    assert counts(shortcut=True) == counts(shortcut=False)

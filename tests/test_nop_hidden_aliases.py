"""nop's in-place additions must not write into memory an op's schema hides as an alias.

``aten._unsafe_view`` (what ``matmul`` of a 3-d input by a weight returns, so every
``nn.Linear`` on a sequence) shares its input's memory with a schema that promises a fresh
tensor. nop's graph function took it for graph-allocated memory and computed a last-use
``add`` on it as ``add_``: in a tanh-GELU after a Linear, the forward wrote
``x + 0.044715 * x**3`` into the Linear's ``addmm``, which the min-cut partitioner had saved
for the backward to recompute the GELU from. aotkit_eager trained albert, gpt_neo, gptj, phi
and mobilebert (zoo_wide) with wrong gradients, silently.
See Note [In-place accumulation in graph functions] in aotkit_backends.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch._dynamo
import torch.nn as nn
from aotkit import aot_function, nop
from aotkit_backends import graph_function
from aotkit_partitioners import min_cut_rematerialization_partition
from functorch.compile import min_cut_rematerialization_partition as torch_min_cut
from torch._functorch.aot_autograd import aot_function as torch_aot_function
from torch._functorch.compilers import nop as torch_nop
from torch.fx.experimental.proxy_tensor import make_fx


def _tanh_gelu(h: torch.Tensor) -> torch.Tensor:
    return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))


class _LinearGelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(_tanh_gelu(self.a(x))).pow(2).sum()


def _grads(backend: str | None) -> list[torch.Tensor]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = _LinearGelu()
    x = torch.randn(2, 8, 16)
    fn = m if backend is None else torch.compile(m, backend=backend)
    fn(x).backward()
    return [p.grad for p in m.parameters()]  # type: ignore[misc]


def test_linear_then_tanh_gelu_trains_like_eager_through_aotkit_eager() -> None:
    eager = _grads(None)
    theirs = _grads("aot_eager")
    ours = _grads("aotkit_eager")
    for e, t, o in zip(eager, theirs, ours, strict=True):
        assert torch.equal(e, t)  # torch's aot_eager is bitwise here
        assert torch.equal(e, o)


@pytest.mark.parametrize("partition", ["aotkit", "torch"])
def test_min_cut_backward_through_nop_matches_eager(partition: str) -> None:
    torch.manual_seed(0)
    w1, b1 = torch.randn(32, 16, requires_grad=True), torch.randn(32, requires_grad=True)
    x = torch.randn(2, 8, 16)

    def f(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor) -> torch.Tensor:
        return _tanh_gelu(torch.nn.functional.linear(x, w1, b1)).sin().sum()

    f(x, w1, b1).backward()
    ref = [w1.grad.clone(), b1.grad.clone()]  # type: ignore[union-attr]
    w1.grad = b1.grad = None
    pf = min_cut_rematerialization_partition if partition == "aotkit" else torch_min_cut
    aot_function(f, nop, partition_fn=pf)(x, w1, b1).backward()
    got = [w1.grad, b1.grad]
    w1.grad = b1.grad = None
    torch_aot_function(f, torch_nop, partition_fn=torch_min_cut)(x, w1, b1).backward()
    theirs = [w1.grad, b1.grad]
    for r, o, t in zip(ref, got, theirs, strict=True):
        assert torch.equal(r, t)
        assert torch.equal(r, o)


def _unsafe_view_then_add(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    v = torch.ops.aten._unsafe_view(x, [6])
    return torch.ops.aten.add(v, y), x.sum()


def _unsafe_split_then_add(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a, _ = torch.ops.aten.unsafe_split(x, 3)
    return torch.ops.aten.add(a, y), x.sum()


def _fresh_unsafe_view_then_add(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # a fresh tensor seen through _unsafe_view whose root (the mm) is saved: an output
    m = torch.ops.aten.mm(x, x.t())
    v = torch.ops.aten._unsafe_view(m, [4])
    return torch.ops.aten.add(v, y), m


@pytest.mark.parametrize(
    ("fn", "shapes"),
    [
        (_unsafe_view_then_add, [(2, 3), (6,)]),
        (_unsafe_split_then_add, [(6,), (3,)]),
        (_fresh_unsafe_view_then_add, [(2, 3), (4,)]),
    ],
    ids=["unsafe_view_of_input", "unsafe_split_of_input", "unsafe_view_of_output"],
)
def test_graph_function_never_adds_into_a_hidden_alias(fn, shapes) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    args = [torch.randn(s) for s in shapes]
    gm = make_fx(fn)(*args)
    assert any(n.op == "call_function" and n.target is torch.ops.aten.add.Tensor for n in gm.graph.nodes)
    expected = gm(*[a.clone() for a in args])
    gf = graph_function(gm)
    assert gf is not None
    before = [a.clone() for a in args]
    with torch.no_grad():  # the graph function adds in place only with grad mode off
        got = gf(*args)
    for a, b in zip(args, before, strict=True):
        assert torch.equal(a, b)  # no input written
    for e, g in zip(expected, got, strict=True):
        assert torch.equal(e, g)  # no output written


@pytest.mark.parametrize(
    ("fn", "shapes"),
    [
        (_unsafe_view_then_add, [(2, 3), (6,)]),
        (_fresh_unsafe_view_then_add, [(2, 3), (4,)]),
    ],
    ids=["unsafe_view_of_input", "unsafe_view_of_output"],
)
def test_run_time_check_catches_an_alias_the_schemas_hide(fn, shapes, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Backstop for the static analysis: with the list of ops that alias despite their
    # schema emptied (as if a new such op appeared), the storage check at run time still
    # keeps the addition out of place. See Note [In-place accumulation in graph functions].
    from aotkit_backends import _buffer_reuse

    monkeypatch.setattr(_buffer_reuse, "aliases_despite_schema", lambda op: False)
    monkeypatch.setattr(_buffer_reuse, "_SCHEMA_FACTS", {})
    torch.manual_seed(0)
    args = [torch.randn(s) for s in shapes]
    gm = make_fx(fn)(*args)
    nodes = list(gm.graph.nodes)
    assert _buffer_reuse.in_place_adds(nodes)  # the static analysis is fooled
    expected = gm(*[a.clone() for a in args])
    gf = graph_function(gm)
    assert gf is not None
    assert "_add_reusing(" in gf._aotkit_source  # type: ignore[attr-defined]
    before = [a.clone() for a in args]
    with torch.no_grad():
        got = gf(*args)
    for a, b in zip(args, before, strict=True):
        assert torch.equal(a, b)
    for e, g in zip(expected, got, strict=True):
        assert torch.equal(e, g)


@pytest.mark.parametrize("alpha", [None, 2])
def test_a_fresh_sole_tensor_is_still_added_in_place(monkeypatch, alpha) -> None:  # type: ignore[no-untyped-def]
    # the check does not turn the optimisation off: a graph-allocated value nobody else
    # holds is still added into in place, and a view of a fresh value is not. A plain
    # ``add(a, b)`` picks through ``add_reusing``, one with ``alpha=`` through a
    # conditional expression (See Note [In-place accumulation in graph functions])
    from aotkit_backends import _buffer_reuse, _fast_graph
    from aotkit_backends._buffer_reuse import sole_owner

    calls: list[int] = []
    real_add_ = _fast_graph._ADD_IN_PLACE

    def spy(self: torch.Tensor, *a, **k):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real_add_(self, *a, **k)

    monkeypatch.setattr(_fast_graph, "_ADD_IN_PLACE", spy)
    monkeypatch.setattr(_buffer_reuse, "_ADD_IN_PLACE", spy)
    kwargs = {} if alpha is None else {"alpha": alpha}

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.add(torch.ops.aten.mul(x, 2), y, **kwargs)

    x, y = torch.randn(4), torch.randn(4)
    gf = graph_function(make_fx(f)(x, y))
    assert gf is not None
    source = gf._aotkit_source  # type: ignore[attr-defined]
    assert ("_add_reusing(" in source) == (alpha is None)
    assert ("_sole_owner(" in source) == (alpha is not None)
    with torch.no_grad():
        out = gf(x, y)
    assert torch.equal(out, x * 2 + y * (alpha or 1))
    assert calls == [1]
    # with grad mode on the line adds out of place
    out = gf(x, y)
    assert torch.equal(out, x * 2 + y * (alpha or 1))
    assert calls == [1]
    assert sole_owner(torch.randn(3))
    base = torch.randn(3)
    view = base[:2]
    assert not sole_owner(base) and not sole_owner(view)

"""Aliased inputs, one of them written, whose layout changes between calls: eager, aotkit
and torch's AOTAutograd compared call by call (outputs, the buffer the inputs view,
gradients). See Note [Symbolic geometry of aliased members] in aotkit_capture and Note
[Runtime checks of the input layout] in aotkit_frontends.

Two families (issue 35):
* two overlapping row windows of one buffer, the first written, under
  ``torch.compile(dynamic=True)``: the next sizes got the first size's geometry (a (4, 3)
  output where eager gives (5, 3), the buffer written in the wrong rows). torch is right
  here and serves as the oracle besides eager.
* windows whose overlap changes between calls (offset 1, then 2), or inputs that stop or
  start overlapping, under plain torch.compile: the graph compiled for the first layout
  ran for the next one. torch's AOTAutograd gets these wrong too (dynamo guards neither
  the overlap nor, with static shapes, the storage offset), so eager is the oracle.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch
import torch._dynamo
from _aliasing import EAGER_FALLBACK, Inputs, assert_same, observe
from aotkit_backends import inductor_available, inductor_unavailable_reason, nop
from aotkit_frontends import aot_function, aot_module_simplified, register_dynamo_backends


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    register_dynamo_backends()
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled(backend: str, dynamic: bool | None) -> Callable[[Callable[..., Any]], Any]:
    def wrap(f: Callable[..., Any]) -> Any:
        if backend == "aot_function":
            return aot_function(f, nop, dynamic=bool(dynamic))
        return torch.compile(f, backend=backend, dynamic=dynamic, fullgraph=True)

    return wrap


# ---- 1. overlapping row windows, sizes changing, the first window written --------------


def write_first_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a.mul_(2)
    return a + b


def row_windows(grad: bool, sizes: Sequence[int] = (3, 4, 5, 6)) -> Callable[[int], Inputs]:
    """``buf[:n], buf[1:]`` of a (n + 1, 3) buffer (a non-leaf of a leaf that requires grad
    when ``grad``)."""

    def make(k: int) -> Inputs:
        n = sizes[k]
        data = torch.arange(float((n + 1) * 3)).reshape(n + 1, 3)
        if not grad:
            return [data], [], (data[:n], data[1:])
        leaf = data.clone().requires_grad_()
        buf = leaf * 1.0
        return [buf], [leaf], (buf[:n], buf[1:])

    return make


@pytest.mark.parametrize("grad", [False, True], ids=["values", "grads"])
@pytest.mark.parametrize(
    ("backend", "dynamic"),
    [("aotkit_eager", True), ("aotkit_eager", None), ("aotkit_eager", False),
     ("aot_function", True), ("aot_function", False)],
)
def test_overlapping_windows_of_changing_size(
    backend: str, dynamic: bool | None, grad: bool, caplog: pytest.LogCaptureFixture
) -> None:
    make = row_windows(grad)
    expected = observe(write_first_add, make, 4)
    torch._dynamo.reset()
    oracle = observe(compiled("aot_eager", dynamic)(write_first_add), make, 4)
    assert_same(expected, oracle, "torch aot_eager")
    torch._dynamo.reset()
    caplog.set_level(logging.INFO, logger="aotkit.cache.recompiles")
    got = observe(compiled(backend, dynamic)(write_first_add), make, 4)
    assert_same(expected, got, backend)
    if backend == "aotkit_eager" and dynamic:
        # the graph follows the sizes: no call needed the eager fallback
        assert EAGER_FALLBACK not in caplog.text


def test_dynamic_graph_regenerates_members_symbolically() -> None:
    """The graph dynamo reuses for other sizes takes the members' sizes as inputs."""
    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return nop(gm, example_inputs)

    from aotkit_frontends import aot_autograd

    g = torch.compile(write_first_add, backend=aot_autograd(fw_compiler=keep), dynamic=True)
    observe(g, row_windows(False, (3, 4, 5)), 3)
    assert graphs
    strided = [n for n in graphs[-1].graph.nodes if n.target is torch.ops.aten.as_strided.default]
    assert strided
    for node in strided:
        size = node.args[1]
        assert any(isinstance(s, torch.fx.Node) for s in size), node.format_node()


@pytest.mark.slow
@pytest.mark.skipif(not inductor_available(), reason=str(inductor_unavailable_reason()))
def test_aotkit_inductor_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._inductor import config

    monkeypatch.setenv("AOTKIT_CACHE", "0")
    with config.patch(fx_graph_cache=False):
        make = row_windows(False, (3, 4, 5))
        expected = observe(write_first_add, make, 3)
        got = observe(compiled("aotkit_inductor", True)(write_first_add), make, 3)
        assert_same(expected, got, "aotkit_inductor dynamic")
        torch._dynamo.reset()
        make2 = shifted_windows(False, (1, 2))
        expected = observe(write_first_mul, make2, 2)
        got = observe(compiled("aotkit_inductor", False)(write_first_mul), make2, 2)
        assert_same(expected, got, "aotkit_inductor static")


# ---- 2. the overlap changes between calls ----------------------------------------------


def write_first_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a.add_(1)
    return a * b


def shifted_windows(grad: bool, offsets: Sequence[int]) -> Callable[[int], Inputs]:
    """``buf[0:4], buf[off:off + 4]`` of one buffer of 10."""

    def make(k: int) -> Inputs:
        off = offsets[k]
        data = torch.arange(10.0)
        if not grad:
            return [data], [], (data[0:4], data[off:off + 4])
        leaf = data.clone().requires_grad_()
        buf = leaf * 1.0
        return [buf], [leaf], (buf[0:4], buf[off:off + 4])

    return make


def patterns(kinds: Sequence[str]) -> Callable[[int], Inputs]:
    """Two windows of 4 that overlap, share a storage without overlapping, or lie in two
    buffers, as ``kinds`` says per call."""

    def make(k: int) -> Inputs:
        kind = kinds[k]
        one, two = torch.arange(10.0), torch.arange(10.0) + 100
        if kind == "overlap":
            return [one], [], (one[0:4], one[1:5])
        if kind == "disjoint":
            return [one], [], (one[0:4], one[5:9])
        assert kind == "distinct"
        return [one, two], [], (one[0:4], two[1:5])

    return make


@pytest.mark.parametrize(
    ("backend", "dynamic"),
    [("aotkit_eager", False), ("aotkit_eager", True), ("aot_function", False),
     ("aot_function", True)],
)
@pytest.mark.parametrize(
    ("offsets", "grad"),
    [((1, 2, 3, 1), False), ((1, 2, 3, 1), True), ((1, 0, 2), False), ((1, 0, 2), True),
     ((0, 1, 6, 2), False)],
    ids=str,
)
def test_shifting_overlap(
    backend: str, dynamic: bool, grad: bool, offsets: Sequence[int]
) -> None:
    # offset 6 with grads: see test_disjoint_windows_with_grad
    make = shifted_windows(grad, offsets)
    expected = observe(write_first_mul, make, len(offsets))
    got = observe(compiled(backend, dynamic)(write_first_mul), make, len(offsets))
    assert_same(expected, got, backend)


def write_first_mul_late(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = a * b
    a.add_(1)
    return out


@pytest.mark.parametrize("backend", ["aot_function", "aotkit_eager"])
def test_disjoint_windows_with_grad(backend: str) -> None:
    """Two windows of one storage that do not overlap, the first written, with grads: they
    take no synthetic base (Note [Inputs that share a storage without overlapping]), and
    the write bumps the version counter the second shares after the forward saved it. The
    backward raised "modified by an inplace operation" where eager runs; now eager's values
    (See Note [Saved inputs on a written storage] in aotkit_runtime). torch's AOTAutograd
    raises in the backward."""
    make = shifted_windows(True, (6, 5, 6))
    expected = observe(write_first_mul, make, 3)
    torch._dynamo.reset()
    oracle = observe(compiled("aot_eager", False)(write_first_mul), make, 3, catch=True)
    assert oracle[0][0] == "raised" and "inplace operation" in oracle[0][2]
    torch._dynamo.reset()
    got = observe(compiled(backend, False)(write_first_mul), make, 3)
    assert_same(expected, got, backend)


def test_disjoint_windows_written_after_the_call_raise_as_eager() -> None:
    """The saved window's storage written after the call: eager's backward raises, and so
    does aotkit's (the version expected is the one after the call's own writes); a window
    saved before the function's write raises in eager and in aotkit alike."""
    g = aot_function(write_first_mul, nop)
    for fn in (write_first_mul, g):
        leaf = torch.arange(10.0).requires_grad_()
        buf = leaf * 1.0
        out = fn(buf[0:4], buf[6:10])
        buf[8].mul_(3)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()
    h = aot_function(write_first_mul_late, nop)
    for fn in (write_first_mul_late, h):
        leaf = torch.arange(10.0).requires_grad_()
        buf = leaf * 1.0
        out = fn(buf[0:4], buf[6:10])
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


@pytest.mark.parametrize("backend", ["aotkit_eager", "aot_function"])
@pytest.mark.parametrize(
    "kinds",
    [("distinct", "overlap"), ("overlap", "distinct", "overlap"), ("disjoint", "overlap"),
     ("overlap", "disjoint"), ("distinct", "disjoint", "distinct")],
    ids="-".join,
)
def test_overlap_appears_or_goes(backend: str, kinds: Sequence[str]) -> None:
    make = patterns(kinds)
    expected = observe(write_first_mul, make, len(kinds))
    got = observe(compiled(backend, False)(write_first_mul), make, len(kinds))
    assert_same(expected, got, backend)


def test_changed_offset_compiles_a_graph_for_its_layout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The second call (offset 2) does not fit the graph compiled for offset 1: it compiles
    a graph for its layout, with the reason logged; the third (offset 1 again) runs the
    first graph, the fourth (offset 2) the second, compiled once. See Note [Graphs for
    other input layouts]."""
    graph_calls: list[int] = []
    compiles: list[int] = []

    def counting(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        compiles.append(1)

        def run(*args: Any) -> Any:
            graph_calls.append(1)
            return gm(*args)

        return run

    caplog.set_level(logging.INFO, logger="aotkit.cache.recompiles")
    from aotkit_frontends import aot_autograd

    g = torch.compile(write_first_mul, backend=aot_autograd(fw_compiler=counting))
    make = shifted_windows(False, (1, 2, 1, 2))
    expected = observe(write_first_mul, make, 4)
    got = observe(g, make, 4)
    assert_same(expected, got, "aotkit counting")
    assert len(compiles) == 2
    assert len(graph_calls) == 4
    assert EAGER_FALLBACK not in caplog.text
    assert "compiles a graph for this call's input layout" in caplog.text
    assert "offset 1" in caplog.text and "offset 2" in caplog.text


@pytest.mark.parametrize("grad", [False, True], ids=["values", "grads"])
def test_more_layouts_than_the_limit_run_eagerly(
    grad: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Past MAX_LAYOUT_GRAPHS layouts, a new one runs eagerly (eager's values), logged;
    layouts with graphs keep them."""
    from aotkit_frontends._layout_graphs import MAX_LAYOUT_GRAPHS

    caplog.set_level(logging.INFO, logger="aotkit.cache.recompiles")
    offsets = (*range(1, MAX_LAYOUT_GRAPHS + 3), 2)

    def make(k: int) -> Inputs:
        data = torch.arange(16.0)
        leaves = [data.requires_grad_()] if grad else []
        buf = data * 1.0 if grad else data
        return [buf], leaves, (buf[0:4], buf[offsets[k]:offsets[k] + 4])

    expected = observe(write_first_mul, make, len(offsets))
    got = observe(compiled("aotkit_eager", False)(write_first_mul), make, len(offsets))
    assert_same(expected, got, "aotkit_eager")
    assert EAGER_FALLBACK in caplog.text
    assert f"{MAX_LAYOUT_GRAPHS} layouts already have graphs" in caplog.text


def test_aot_module_simplified_direct_call() -> None:
    """Without dynamo: compiled for one layout, called with others."""

    class M(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor]:
            return (write_first_mul(a, b),)

    buf = torch.arange(10.0)
    fwd = aot_module_simplified(M(), (buf[0:4], buf[1:5]), nop)
    for kind in ("overlap", "distinct", "disjoint"):
        for off in (1, 2):
            one, two = torch.arange(10.0), torch.arange(10.0) + 100
            eone, etwo = one.clone(), two.clone()
            src, esrc = (two, etwo) if kind == "distinct" else (one, eone)
            start = off + (4 if kind == "disjoint" else 0)
            (out,) = fwd(one[0:4], src[start:start + 4])
            expected = write_first_mul(eone[0:4], esrc[start:start + 4])
            torch.testing.assert_close(out, expected)
            torch.testing.assert_close(one, eone)
            torch.testing.assert_close(two, etwo)


# ---- the check's cost -------------------------------------------------------------------


def test_no_check_without_input_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph that writes no input gets no layout check; one that writes a buffer (as
    BatchNorm's running stats) checks storages only, never the full layout, while nothing
    overlaps the written input."""
    import aotkit_frontends._layout_check as layout_check

    full: list[int] = []
    real = layout_check.compute_input_layout

    def counting(*args: Any, **kwargs: Any) -> Any:
        full.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(layout_check, "compute_input_layout", counting)
    made: list[Any] = []
    real_check = layout_check.layout_check

    def keep(*args: Any, **kwargs: Any) -> Any:
        made.append(real_check(*args, **kwargs))
        return made[-1]

    import aotkit_frontends._simplified as simplified

    monkeypatch.setattr(simplified, "layout_check", keep)

    def reads(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y

    g = torch.compile(reads, backend="aotkit_eager")
    x = torch.randn(8)
    g(x[0:4], x[2:6])
    assert made == [None]

    torch._dynamo.reset()
    bn = torch.nn.BatchNorm1d(4)
    reference = copy.deepcopy(bn)
    h = torch.compile(bn, backend="aotkit_eager")
    for _ in range(3):
        inp = torch.randn(5, 4)
        torch.testing.assert_close(h(inp), reference(inp))
    torch.testing.assert_close(bn.running_mean, reference.running_mean)
    torch.testing.assert_close(bn.running_var, reference.running_var)
    assert made[-1] is not None
    assert not full


def test_aot_module_simplified_distinct_then_duplicate(caplog: pytest.LogCaptureFixture) -> None:
    """Compiled for two distinct tensors, the first written; called with one tensor twice:
    eager's answer (the write seen through the second argument), the reason logged."""

    class M(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor]:
            return (write_first_mul(a, b),)

    caplog.set_level(logging.INFO, logger="aotkit.cache.recompiles")
    fwd = aot_module_simplified(M(), (torch.arange(4.0), torch.arange(4.0)), nop)
    x, ex = torch.arange(4.0), torch.arange(4.0)
    (out,) = fwd(x, x)
    torch.testing.assert_close(out, write_first_mul(ex, ex))
    torch.testing.assert_close(x, ex)
    assert "input 1 is input 0" in caplog.text

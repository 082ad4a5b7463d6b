"""graph_function runs a graph's ATen ops through their cheapest Python calls, and nothing
else changes: same overloads in the same order, same outputs. See Note [Graph functions]."""

from __future__ import annotations

import ast
import math
import operator
import traceback
import weakref
from typing import Any

import pytest
import torch
import torch.fx
from aotkit_backends import graph_function, nop
from aotkit_backends._fast_graph import _NN, _TENSOR_METHODS, _VARIABLE_FUNCTIONS, binding_for
from aotkit_schemas import unboxed_entry
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


# TorchDispatchMode carries no annotations in torch.
class Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call,misc]
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: list[Any] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def _run_both(gm: torch.fx.GraphModule, *args: Any) -> tuple[Any, Any]:
    fn = graph_function(gm)
    assert fn is not None
    with Recorder() as seen_ref:
        ref = gm(*args)
    with Recorder() as seen_fast:
        got = fn(*args)
    assert seen_fast.ops == seen_ref.ops
    assert len(seen_ref.ops) > 0
    return ref, got


def _assert_same(ref: Any, got: Any) -> None:
    assert type(ref) is type(got)
    for r, g in zip(ref, got, strict=True):
        if isinstance(r, torch.Tensor):
            assert (r.shape, r.stride(), r.dtype) == (g.shape, g.stride(), g.dtype)
            torch.testing.assert_close(g, r, rtol=0, atol=0, equal_nan=True)
        else:
            assert r == g


def test_every_listed_binding_exists() -> None:
    for names in (_VARIABLE_FUNCTIONS, _NN, _TENSOR_METHODS):
        for qualified in names.split():
            name, overload = qualified.split(".")
            assert binding_for(getattr(getattr(aten, name), overload)) is not None, qualified


def test_known_overloads_run_through_their_bindings() -> None:
    gm = make_fx(lambda x: [x.sin() + 1])(torch.randn(4))
    fn = graph_function(gm)
    assert fn is not None
    callees = list(fn.__globals__.values())
    assert any(c is torch._C._VariableFunctions.sin for c in callees)
    assert any(c is torch._C._VariableFunctions.add for c in callees)
    x = torch.randn(4)
    _assert_same(*_run_both(gm, x))


def test_many_ops_dispatch_the_same_overloads() -> None:
    def f(x: torch.Tensor, w: torch.Tensor, idx: torch.Tensor) -> list[torch.Tensor]:
        a = torch.nn.functional.gelu(x @ w, approximate="tanh")
        b = a.view(2, 8).t().contiguous().sum(0, keepdim=True)
        c, d = torch.split(a.flatten(), [3, 13])
        e = torch.add(x, x, alpha=2.5).to(torch.float64)
        g = x.index_select(0, idx) * math.inf
        h = torch.where(x > 0, x, -x).amax(dim=1)
        return [a, b, c, d, e, g, h, x.new_zeros(3), torch.ones(2, dtype=torch.int32)]

    args = (torch.randn(4, 4), torch.randn(4, 4), torch.tensor([1, 0, 3]))
    gm = make_fx(f)(*args)
    _assert_same(*_run_both(gm, *args))


def test_arguments_the_binding_would_read_differently_use_the_raw_handle() -> None:
    # torch.clone names its first argument ``input``; a graph may pass ``self=`` by keyword
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output((graph.call_function(aten.clone.default, (), {"self": x}),))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    fn = graph_function(gm)
    assert fn is not None
    assert any(c is aten.clone.default._op for c in fn.__globals__.values())
    t = torch.randn(2)
    with Recorder() as seen:
        (out,) = fn(t)
    assert seen.ops == [aten.clone.default]
    assert torch.equal(out, t) and out is not t


def test_tensor_constants_and_odd_arguments() -> None:
    c = torch.arange(4.0)
    gm = make_fx(lambda x: [x + c, x * float("nan"), x.to(torch.float16)])(torch.randn(4))
    assert any(n.op == "get_attr" for n in gm.graph.nodes)
    _assert_same(*_run_both(gm, torch.randn(4)))


def test_dead_values_are_dropped() -> None:
    gm = make_fx(lambda x: [x.sin().cos().exp()])(torch.randn(3))
    fn = graph_function(gm)
    assert fn is not None
    refs: list[weakref.ref[torch.Tensor]] = []

    class KeepRefs(TorchDispatchMode):  # type: ignore[no-untyped-call,misc]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            refs.append(weakref.ref(out))
            return out

    x = torch.randn(3)
    with KeepRefs():  # type: ignore[no-untyped-call]
        (out,) = fn(x)
    # the sin and cos results are gone once the function returns; only the output lives
    assert [r() is not None for r in refs] == [False, False, True]
    assert refs[2]() is out


def test_graphs_it_does_not_handle_keep_gm() -> None:
    inner = torch.nn.Linear(2, 2)
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(inner))
    assert any(n.op == "call_module" for n in gm.graph.nodes)
    assert graph_function(gm) is None
    compiled = nop(gm, [])
    assert unboxed_entry(compiled) == gm.forward
    x = torch.randn(1, 2)
    torch.testing.assert_close(compiled([x]), inner(x))

    with_pytree = make_fx(lambda d: [d["a"] + 1])({"a": torch.randn(2)})
    assert graph_function(with_pytree) is None


def test_nop_runs_the_graph_function() -> None:
    gm = make_fx(lambda x: [x.sin() + 1])(torch.randn(4))
    compiled = nop(gm, [])
    direct = unboxed_entry(compiled)
    assert direct is not None and direct.__name__ == "aotkit_graph_function"
    x = torch.randn(4)
    args = [x]
    torch.testing.assert_close(compiled(args)[0], x.sin() + 1)
    assert args == [x]  # nop does not clear the list


def test_errors_point_at_the_generated_line() -> None:
    gm = make_fx(lambda x, y: [x @ y])(torch.randn(2, 3), torch.randn(3, 2))
    fn = graph_function(gm)
    assert fn is not None
    with pytest.raises(RuntimeError) as info:
        fn(torch.randn(2, 3), torch.randn(2, 2))
    text = "".join(traceback.format_exception(info.value))
    assert "aotkit graph function" in text and "_f" in text


# ---- Note [In-place accumulation in graph functions] -------------------------------------


def _ops_run(gm: torch.fx.GraphModule, *args: Any, grad: bool) -> tuple[list[Any], Any]:
    fn = graph_function(gm)
    assert fn is not None
    with torch.set_grad_enabled(grad), Recorder() as seen:
        out = fn(*args)
    return seen.ops, out


def test_a_dead_fresh_operand_is_added_into_without_grad() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        return [x.sin() + y, x.cos() + 1]

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    gm = make_fx(f)(x, y)
    ops, out = _ops_run(gm, x, y, grad=False)
    assert ops.count(aten.add_.Tensor) == 2 and aten.add.Tensor not in ops
    ref = gm(x, y)
    for o, r in zip(out, ref, strict=True):
        assert torch.equal(o, r) and o.stride() == r.stride()
    ops, _ = _ops_run(gm, x, y, grad=True)
    assert ops.count(aten.add.Tensor) == 2 and aten.add_.Tensor not in ops


@pytest.mark.parametrize(
    ("name", "program", "args"),
    [
        ("operand is an input", lambda x, y: [x + y], (torch.randn(3), torch.randn(3))),
        ("a view of the operand lives on", lambda x, y: (lambda s: [s + y, s.t()])(x.sin()), (torch.randn(2, 2), torch.randn(2, 2))),
        ("the operand is returned", lambda x, y: (lambda s: [s + y, s])(x.sin()), (torch.randn(3), torch.randn(3))),
        ("the operand broadcasts", lambda x, y: [x.sin() + y], (torch.randn(1, 3), torch.randn(2, 3))),
        ("type promotion", lambda x, y: [x.sin() + y], (torch.randn(3), torch.randn(3, dtype=torch.float64))),
        ("other operand is a view of it", lambda x: (lambda s: [s + s.t()])(x.sin()), (torch.randn(3, 3),)),
        ("operand is a view of an input", lambda x, y: [x.view(3) + y], (torch.randn(3), torch.randn(3))),
        ("operand overlaps itself", lambda x, y: [x.sin().expand(2, 3) + y.expand(2, 3)], (torch.randn(3), torch.randn(3))),
    ],
)
def test_additions_that_must_stay_out_of_place(name: str, program: Any, args: Any) -> None:
    gm = make_fx(program)(*args)
    ops, out = _ops_run(gm, *args, grad=False)
    assert aten.add_.Tensor not in ops, name
    _assert_same(gm(*args), out)


def test_views_and_split_outputs_are_tracked() -> None:
    # a + b where a = split(fresh)[0]: a's memory is shared with the other split output,
    # which is used later
    def f(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        a, b = torch.split(x.sin(), 2)
        return [a + y, b * 2]

    args = (torch.randn(4), torch.randn(2))
    gm = make_fx(f)(*args)
    ops, out = _ops_run(gm, *args, grad=False)
    assert aten.add_.Tensor not in ops
    _assert_same(gm(*args), out)


def test_graphs_with_calls_of_unknown_aliasing_keep_every_addition() -> None:
    # operator.iadd on a tensor aliases its first operand; nothing is added in place
    graph = torch.fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    s = graph.call_function(aten.sin.default, (x,))
    alias = graph.call_function(operator.iadd, (s, y))
    total = graph.call_function(aten.add.Tensor, (s, y))
    graph.output((total, alias))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    t, u = torch.randn(3), torch.randn(3)
    for node, val in zip(gm.graph.nodes, [t, u, t.sin(), t.sin(), t.sin()], strict=False):
        node.meta["val"] = val
    ops, out = _ops_run(gm, t, u, grad=False)
    assert ops == [aten.sin.default, aten.add_.Tensor, aten.add.Tensor]  # the add_ is iadd's
    _assert_same(gm(t, u), out)


def test_a_stealing_graph_function_drops_each_input_at_its_last_use() -> None:
    gm = make_fx(lambda a, b: [a.sin() * 2 + b])(torch.randn(3), torch.randn(3))
    fn = graph_function(gm, steal_args=True)
    assert fn is not None
    a, b = torch.randn(3), torch.randn(3)
    expected = gm(a, b)
    ref_a = weakref.ref(a)
    alive_at_add: list[bool] = []

    class Watch(TorchDispatchMode):  # type: ignore[no-untyped-call,misc]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is aten.add.Tensor:
                alive_at_add.append(ref_a() is not None)
            return func(*args, **(kwargs or {}))

    args = [a, b]
    del a
    with Watch():  # type: ignore[no-untyped-call]
        out = fn(args)
    assert args == []
    assert alive_at_add == [False]  # ``a`` was freed after sin, before the addition
    _assert_same(expected, out)


def test_nop_offers_a_stealing_entry_only_for_graph_functions() -> None:
    from aotkit_schemas import stealing_entry

    gm = make_fx(lambda x: [x.sin() + 1])(torch.randn(4))
    steal = stealing_entry(nop(gm, []))
    assert steal is not None
    x = torch.randn(4)
    args = [x]
    torch.testing.assert_close(steal(args)[0], x.sin() + 1)
    assert args == []
    module_graph = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    assert stealing_entry(nop(module_graph, [])) is None


def _stored_locals(source: str) -> set[str]:
    """The locals a graph function's body stores to (the unpacking of ``args`` aside)."""
    fn = ast.parse(source).body[0]
    assert isinstance(fn, ast.FunctionDef)
    out: set[str] = set()
    for stmt in fn.body:
        if isinstance(stmt, ast.Assign) and not (
            isinstance(stmt.value, ast.Name) and stmt.value.id == "args"
        ):
            for target in stmt.targets:
                out.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return out


def test_a_value_made_where_another_dies_takes_its_local() -> None:
    # See Note [Graph functions]: fewer statements for compile(), values freed as early
    gm = make_fx(lambda x, y: [((x.sin() + y).cos() * 2).exp()])(torch.randn(3), torch.randn(3))
    fn = graph_function(gm, steal_args=True)
    assert fn is not None
    source: str = fn._aotkit_source  # type: ignore[attr-defined]
    assert "= None" in source  # y, dying beside the sin result, is dropped by name
    assert source.count(" = None") == 1
    assert _stored_locals(source) - {"_no_grad"} == {"_v0", "_v1"}  # x's and y's locals
    x, y = torch.randn(3), torch.randn(3)
    _assert_same(gm(x, y), fn([x, y]))


def test_inputs_are_dropped_only_by_a_stealing_graph_function() -> None:
    # See Note [Graph functions]: without steal_args the caller's arguments hold every
    # input until the call returns, so the generated code does not drop their locals
    gm = make_fx(lambda a, b: [(a.sin() * b).cos()])(torch.randn(3), torch.randn(3))
    plain = graph_function(gm)
    stealing = graph_function(gm, steal_args=True)
    assert plain is not None and stealing is not None
    plain_source: str = plain._aotkit_source  # type: ignore[attr-defined]
    stealing_source: str = stealing._aotkit_source  # type: ignore[attr-defined]
    # the inputs' locals are _v0 and _v1; a local is dropped by ``= None`` or by storing
    # the value made at its last use into it
    assert _stored_locals(plain_source) == {"_v2"}  # the sin result's, reused
    assert {"_v0", "_v1"} <= _stored_locals(stealing_source)
    assert "_v2 = _f1(_v0)" in plain_source and "_v2 = _f2(_v2, _v1)" in plain_source
    a, b = torch.randn(3), torch.randn(3)
    _assert_same(gm(a, b), plain(a, b))
    _assert_same(gm(a, b), stealing([a, b]))



def _appending(x: torch.Tensor, items: list[int]) -> torch.Tensor:
    items.append(1)  # changes its list argument: each call must get a fresh one
    return x * len(items)


def test_constant_lists_are_built_once_for_aten_calls_only() -> None:
    """See Note [Graph functions]: constant lists an ATen binding or raw handle gets are
    globals of the function, one per distinct value; any other callee gets a fresh literal
    per call."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    total = graph.call_function(aten.sum.dim_IntList, (x, [0]))
    peak = graph.call_function(aten.amax.default, (x, [0]))
    grown = graph.call_function(_appending, (x, [1, 2]))
    graph.output([total, peak, grown])
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    fn = graph_function(gm)
    assert fn is not None
    source: str = fn._aotkit_source  # type: ignore[attr-defined]
    body = source.split("return")[0]
    assert body.count("[") == 1 and "[1, 2]" in body  # only the Python function's
    constants = [v for k, v in fn.__globals__.items() if k.startswith("_k")]
    assert constants == [[0]]  # one list for both ATen calls
    t = torch.randn(3, 4)
    first, again = fn(t), fn(t)
    _assert_same(first, again)  # _appending got a fresh [1, 2] on each call
    _assert_same(gm(t), first)
    assert torch.equal(first[2], t * 3) and constants == [[0]]


def test_constants_of_other_types_are_other_constants() -> None:
    from aotkit_backends._fast_graph import _Emitter

    emit = _Emitter(torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph()))
    ints, bools = emit.constant(list, [1, 0]), emit.constant(list, [True, False])
    assert ints and bools and ints != bools
    assert emit.constant(list, [1, 0]) == ints and emit.constant(tuple, (1, 0)) not in (ints, None)
    assert emit.globals[bools] == [True, False] and type(emit.globals[bools][0]) is bool
    assert emit.constant(list, [1.5, 2]) is not None
    # not constants: strings, non-finite floats, nested lists, None
    for items in (["a"], [float("inf")], [[1]], [None]):
        assert emit.constant(list, items) is None

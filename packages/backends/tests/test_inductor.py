"""inductor_compiler: TorchInductor on CPU through compile_fx_inner."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from aotkit_backends import (
    InductorUnavailableError,
    inductor_available,
    inductor_compiler,
    inductor_unavailable_reason,
    is_boxed,
    make_inductor_compiler,
)
from aotkit_backends import _inductor as inductor_module
from torch.fx.experimental.proxy_tensor import make_fx

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not inductor_available(), reason=str(inductor_unavailable_reason())),
]


def test_compiles_a_graph_that_needs_decompositions() -> None:
    # aten.t is decomposed by Inductor's table; see Note [Why inductor_compiler re-traces]
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    gm = make_fx(lambda a, b: [a.t() @ b, (a + b).relu().sum(0)])(x, y)
    code_before = gm.code
    compiled = inductor_compiler(gm, [x, y])
    assert gm.code == code_before, "the caller's graph must not change"
    assert is_boxed(compiled)
    args = [x, y]
    out = compiled(args)
    assert args == [], "Inductor's compiled graphs free their inputs early"
    assert isinstance(out, list)
    torch.testing.assert_close(out[0], x.t() @ y)
    torch.testing.assert_close(out[1], (x + y).relu().sum(0))


def test_keeps_a_single_output_unwrapped() -> None:
    x = torch.randn(4)
    gm = make_fx(lambda a: a.cos() * 2)(x)
    out = inductor_compiler(gm, [x])([x])
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, x.cos() * 2)


def test_keeps_nested_output_structure() -> None:
    x = torch.randn(4)
    gm = make_fx(lambda a: (a + 1, [a * 2, None]))(x)
    out = inductor_compiler(gm, [x])([x])
    assert isinstance(out, tuple) and isinstance(out[1], list) and out[1][1] is None
    torch.testing.assert_close(out[1][0], x * 2)


def test_inputs_that_require_grad() -> None:
    x = torch.randn(4, requires_grad=True)
    gm = make_fx(lambda a: [a.exp()])(x.detach())
    out = inductor_compiler(gm, [x])([x.detach()])
    torch.testing.assert_close(out[0], x.detach().exp())


def test_reports_a_missing_toolchain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inductor_module, "_cpu_toolchain_problem", lambda: "no C++ compiler")
    gm = make_fx(lambda a: [a + 1])(torch.ones(1))
    assert not inductor_available("cpu")
    with pytest.raises(InductorUnavailableError, match="no C"):
        inductor_compiler(gm, [torch.ones(1)])


def test_a_graph_already_lowered_is_copied_not_retraced(monkeypatch: pytest.MonkeyPatch) -> None:
    # See Note [Why inductor_compiler re-traces]: a graph traced with Inductor's table and
    # returning a flat list (with None, as backward graphs do) is copied, never re-traced,
    # and the caller's graph is left as it was
    from torch._inductor.decomposition import select_decomp_table

    x, y = torch.randn(3, 4), torch.randn(4, 5)
    gm = make_fx(
        lambda a, b: [(a @ b).relu(), None, a.sum(1)], decomposition_table=select_decomp_table()
    )(x, y)
    code_before = gm.code

    def no_retrace(*args: object, **kwargs: object) -> None:
        raise AssertionError("re-traced a graph that was already lowered")

    monkeypatch.setattr(inductor_module, "make_fx", no_retrace)
    out = make_inductor_compiler(retrace=False)(gm, [x, y])([x, y])
    assert gm.code == code_before, "the caller's graph must not change"
    assert isinstance(out, list) and len(out) == 3 and out[1] is None
    torch.testing.assert_close(out[0], (x @ y).relu())
    torch.testing.assert_close(out[2], x.sum(1))


def test_a_graph_inductor_refuses_as_traced_is_retraced() -> None:
    # retrace=False on a graph that still holds an op of Inductor's table (aten.t): Inductor
    # refuses the copy ("both a fallback and a decomp"), and the re-trace compiles it
    x = torch.randn(3, 3)
    gm = make_fx(lambda a: [a.t().relu()])(x)
    out = make_inductor_compiler(retrace=False)(gm, [x])([x])
    torch.testing.assert_close(out[0], x.t().relu())


# See Note [Inductor's graph roles]


def _recording_inner(
    monkeypatch: pytest.MonkeyPatch,
) -> list[tuple[torch.fx.GraphModule, dict[str, Any]]]:
    import torch._inductor.compile_fx as compile_fx

    calls: list[tuple[torch.fx.GraphModule, dict[str, Any]]] = []
    real = compile_fx.compile_fx_inner

    def record(gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        calls.append((gm, dict(kwargs)))
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(compile_fx, "compile_fx_inner", record)
    return calls


def test_the_copy_inductor_compiles_has_no_detach_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # See Note [Inductor's copy has no detach nodes]: a detach read by an op, one returned
    # as an output next to its input, and a detach of a detach; the caller's graph keeps
    # them, Inductor's copy reads their inputs, and the values are eager's
    from torch._inductor.decomposition import select_decomp_table

    def f(a: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
        t = a.tanh()
        d = t.detach()
        return [d * b, d.detach(), t, (a @ b).relu().detach()]

    x, y = torch.randn(4, 4), torch.randn(4, 4)
    # make_fx records no detach outside the Python mode: the nodes are added by hand, as
    # aotkit's saved-output detaches are
    gm = make_fx(
        lambda a, b: [a.tanh() * b, a.tanh(), a.tanh(), (a @ b).relu()],
        decomposition_table=select_decomp_table(),
    )(x, y)
    detach = torch.ops.aten.detach.default
    graph = gm.graph

    def add_detach(source: torch.fx.Node) -> torch.fx.Node:
        with graph.inserting_after(source):
            node = graph.call_function(detach, (source,))
        node.meta["val"] = source.meta["val"].detach()
        return node

    tanh, mul, relu = (
        graph.find_nodes(op="call_function", target=t)[0]
        for t in (
            torch.ops.aten.tanh.default,
            torch.ops.aten.mul.Tensor,
            torch.ops.aten.relu.default,
        )
    )
    d = add_detach(tanh)
    mul.replace_input_with(tanh, d)
    dd = add_detach(d)
    output = graph.find_nodes(op="output")[0]
    output.args = ([mul, dd, tanh, add_detach(relu)],)
    graph.eliminate_dead_code()
    gm.recompile()
    assert len(graph.find_nodes(op="call_function", target=detach)) == 3
    code_before = gm.code
    calls = _recording_inner(monkeypatch)
    out = make_inductor_compiler(retrace=False, role="backward")(gm, [x, y])([x, y])
    assert gm.code == code_before, "the caller's graph must not change"
    assert len(calls) == 1
    assert not calls[0][0].graph.find_nodes(op="call_function", target=detach)
    expected = f(x, y)
    assert len(out) == len(expected)
    for got, want in zip(out, expected, strict=True):
        # float tolerances, not bitwise: Inductor's vectorized tanh may differ from ATen's
        # by an ulp on some inputs (seen in CI: 1 of 16 elements, 1.2e-07); what this test
        # checks is the detach handling, not the kernels' rounding
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()


def test_joint_graph_passes_remove_no_ops() -> None:
    from aotkit_backends import inductor_joint_graph_passes
    from torch._inductor.decomposition import select_decomp_table

    x = torch.randn(4, 4)
    gm = make_fx(
        lambda a: [(a * 1).reshape(4, 4).relu()], decomposition_table=select_decomp_table()
    )(x)
    before = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    out = inductor_joint_graph_passes(gm, [x])
    after = [n.target for n in out.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.mul.Tensor in before and torch.ops.aten.mul.Tensor not in after
    assert after == [torch.ops.aten.relu.default]
    torch.testing.assert_close(out(x)[0], x.relu())


@pytest.mark.parametrize("role", ["forward", "backward", "inference"])
def test_graph_roles(monkeypatch: pytest.MonkeyPatch, role: str) -> None:
    from aotkit_backends import mark_user_visible_outputs
    from torch._inductor.decomposition import select_decomp_table

    calls = _recording_inner(monkeypatch)
    x, t = torch.randn(4, 4), torch.randn(4, 4)

    def fw(a: torch.Tensor) -> list[torch.Tensor]:
        return [(a * 1).sin(), a.cos()]  # a user output, then a "saved" value

    def bw(saved: torch.Tensor, tangents_1: torch.Tensor) -> list[torch.Tensor]:
        return [saved * tangents_1]

    fn, args = (bw, [x, t]) if role == "backward" else (fw, [x])
    gm = make_fx(fn, decomposition_table=select_decomp_table())(*args)
    if role == "backward":
        ph = gm.graph.find_nodes(op="placeholder")
        ph[0].name, ph[1].name = "saved_1", "tangents_1"
        gm.recompile()
    if role == "forward":
        mark_user_visible_outputs(gm, 1)
    out = make_inductor_compiler(retrace=False, role=role)(gm, args)(list(args))  # type: ignore[arg-type]
    torch.testing.assert_close(out, fn(*args))
    ((compiled_gm, kwargs),) = calls
    output = compiled_gm.graph.find_nodes(op="output")[0]
    targets = [n.target for n in compiled_gm.graph.nodes if n.op == "call_function"]
    if role == "forward":
        assert kwargs == {"is_inference": False}
        assert output.meta["user_visible_output_idxs"] == [0]
        assert torch.ops.aten.mul.Tensor in targets  # no joint passes here: the partition's
    elif role == "inference":
        assert kwargs == {"is_inference": True}
        assert output.meta["user_visible_output_idxs"] == [0, 1]
        assert torch.ops.aten.mul.Tensor not in targets  # joint passes removed ``* 1``
    else:
        assert kwargs == {"is_backward": True, "static_input_idxs": [0]}
        assert output.meta["user_visible_output_idxs"] == [0]

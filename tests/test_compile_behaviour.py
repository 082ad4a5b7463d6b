"""Behaviour around compilation that is not a differential comparison: errors that explain
themselves, when compilation happens, and calls that fail half-way.

Every corpus case already checks graph purity and compile counts (see
Note [What the differential harness compares]); these tests cover what the corpus can't.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from aotkit_frontends import AOTCompileError, UnsupportedOutputError, aot_function
from torch._functorch import aot_autograd as torch_aot


def nop(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
    return gm


class Counting:
    """A nop compiler that counts the graphs it receives."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        self.graphs.append(gm)
        return gm


# ---- errors that name their cause ----------------------------------------------------


def test_data_dependent_control_flow_is_an_aot_compile_error_with_a_remedy() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x - 1

    with pytest.raises(AOTCompileError) as info:
        aot_function(f, nop)(torch.randn(4, requires_grad=True))
    message = str(info.value)
    assert "data-dependent" in message
    assert "if x.sum() > 0" in message  # the cause, in the user's terms
    assert "torch.where" in message and "torch.cond" in message  # the remedies


def test_item_is_an_aot_compile_error() -> None:
    with pytest.raises(AOTCompileError, match="item"):
        aot_function(lambda x: x * x.max().item(), nop)(torch.randn(3))


class Opaque:
    pass


@pytest.mark.parametrize(
    ("leaf", "type_name"),
    [(Opaque(), "Opaque"), (object(), "builtins.object"), (lambda: 0, "function")],
)
def test_unsupported_output_leaf_names_its_type_and_place(leaf: Any, type_name: str) -> None:
    def f(x: torch.Tensor) -> Any:
        return {"ok": x * 2, "bad": [x + 1, leaf]}

    with pytest.raises(UnsupportedOutputError) as info:
        aot_function(f, nop)(torch.randn(3, requires_grad=True))
    message = str(info.value)
    assert type_name in message
    assert "['bad'][1]" in message


def test_double_backward_differentiates_the_gradient_again() -> None:
    # See Note [Higher-order gradients through compiled code]; what can't recompute raises:
    # tests/test_higher_order.py
    f = aot_function(lambda x: (x**3).sum(), nop)
    x = torch.randn(3, requires_grad=True)
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    torch.testing.assert_close(g, 3 * x.detach() ** 2)
    g.sum().backward()
    torch.testing.assert_close(x.grad, 6 * x.detach())


# ---- when compilation happens --------------------------------------------------------


def test_new_shapes_compile_once_more_and_old_shapes_reuse_their_graphs() -> None:
    fw, bw, inf = Counting(), Counting(), Counting()
    f = aot_function(lambda x: x.sin() * 2, fw, bw, inference_compiler=inf)
    for shape in [(3,), (3,), (5,), (3,), (5,)]:
        f(torch.randn(shape, requires_grad=True)).sum().backward()
    assert (len(fw.graphs), len(bw.graphs), len(inf.graphs)) == (2, 2, 0)
    with torch.no_grad():
        f(torch.randn(3, requires_grad=True))
        f(torch.randn(3, requires_grad=True))
    assert (len(fw.graphs), len(bw.graphs), len(inf.graphs)) == (2, 2, 1)


# ---- a call that fails leaves its inputs alone ---------------------------------------
# See Note [Runtime epilogue order]: mutations are applied only after the compiled graph
# ran to completion. Eager, which mutates as it goes, is not the reference here.


def _mutate_then_index(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    x.add_(1)
    return x[idx] * 2


def _mutate_then_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x.mul_(3)
    return x @ w


Aot = Callable[..., Any]


@pytest.mark.parametrize("aot", [aot_function, torch_aot.aot_function], ids=["aotkit", "torch"])
def test_runtime_error_in_the_graph_leaves_inputs_unmutated(aot: Aot) -> None:
    f = aot(_mutate_then_index, nop)
    x = torch.randn(4)
    f(x, torch.tensor([0, 3]))  # compiles and works
    before = x.clone()
    with pytest.raises(IndexError):
        f(x, torch.tensor([0, 9]))  # same shapes, no recompile; fails inside the graph
    torch.testing.assert_close(x, before, rtol=0, atol=0)


@pytest.mark.parametrize("aot", [aot_function, torch_aot.aot_function], ids=["aotkit", "torch"])
def test_shape_error_on_a_second_call_leaves_inputs_unmutated(aot: Aot) -> None:
    f = aot(_mutate_then_matmul, nop)
    f(torch.randn(2, 3), torch.randn(3, 4))
    x, w = torch.randn(2, 3), torch.randn(5, 4)
    before = x.clone()
    with pytest.raises(RuntimeError):
        f(x, w)
    torch.testing.assert_close(x, before, rtol=0, atol=0)


def test_a_compiled_forward_that_fails_at_run_time_leaves_inputs_unmutated() -> None:
    calls = {"n": 0}

    def flaky(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        def run(*args: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("backend failure")
            return gm(*args)

        return run

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.add_(y)
        return x * y

    g = aot_function(f, flaky)
    y = torch.randn(3, requires_grad=True)
    g(torch.randn(3), y)
    x = torch.randn(3)
    before = x.clone()
    with pytest.raises(RuntimeError, match="backend failure"):
        g(x, y)
    torch.testing.assert_close(x, before, rtol=0, atol=0)
    assert not x.requires_grad


# ---- lazy GraphModules for compilers that read only the graph ---------------------------


def test_graphs_for_aotkit_nop_are_built_lazily_and_others_are_not() -> None:
    # See Note [Compilers that read only the graph] in aotkit_schemas
    from aotkit_backends import nop as aotkit_nop
    from torch.fx._lazy_graph_module import _LazyGraphModule

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin().cos()

    x = torch.randn(4, requires_grad=True)
    lazy = aot_function(f, aotkit_nop)
    lazy(x).sum().backward()
    eager_grad = x.grad
    x.grad = None
    plain = aot_function(f, nop)
    plain(x).sum().backward()
    assert x.grad is not None and eager_grad is not None and torch.equal(x.grad, eager_grad)
    (lazy_art,) = lazy._aotkit_cache.artifacts  # type: ignore[attr-defined]
    (plain_art,) = plain._aotkit_cache.artifacts  # type: ignore[attr-defined]
    assert isinstance(lazy_art.fw_module, _LazyGraphModule)
    assert isinstance(lazy_art.bw_module, _LazyGraphModule)
    assert not isinstance(plain_art.fw_module, _LazyGraphModule)
    # nothing observable changes: the code is generated when asked for
    assert lazy_art.fw_module.code == plain_art.fw_module.code
    assert lazy_art.bw_module.code == plain_art.bw_module.code

    with torch.no_grad():
        inference = aot_function(f, aotkit_nop)
        out = inference(x)
    (inf_art,) = inference._aotkit_cache.artifacts  # type: ignore[attr-defined]
    assert isinstance(inf_art.inference_module, _LazyGraphModule)
    assert torch.equal(out, f(x).detach())
    assert torch.equal(inf_art.inference_module(x)[0], out)


def test_backward_frees_saved_activations_while_it_runs() -> None:
    # See Note [Boxed calling convention]: the runtime hands a stealing backward the only
    # references to the saved tensors (the autograd node's are released first)
    import sys

    from aotkit_backends import nop as aotkit_nop
    from aotkit_schemas import mark_stealing_entry, stealing_entry

    seen: dict[str, Any] = {}

    def bw_compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        boxed = aotkit_nop(gm, example_inputs)
        inner = stealing_entry(boxed)
        assert inner is not None

        def checking(args: list[Any]) -> Any:
            # a tensor only this list refers to: the list's reference and getrefcount's own
            seen["only_in_list"] = sum(sys.getrefcount(args[i]) == 2 for i in range(len(args)))
            seen["n"] = len(args)
            return inner(args)

        mark_stealing_entry(boxed, lambda: checking)
        return boxed

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin().exp().cos().tanh().sum()

    x = torch.randn(5, requires_grad=True)
    compiled = aot_function(f, aotkit_nop, bw_compiler)
    compiled(x).backward()
    # every saved intermediate is referred to by the list alone; ``x`` (saved for sin) and
    # the tangent are also held by the caller and autograd
    assert seen["only_in_list"] >= 2 and seen["only_in_list"] == seen["n"] - 2, seen
    x_ref = x.detach().clone().requires_grad_()
    f(x_ref).backward()
    assert x.grad is not None and torch.allclose(x.grad, x_ref.grad)  # type: ignore[arg-type]

    # with retain_graph the node keeps its saved tensors, and a second backward works
    x.grad = None
    out = compiled(x)
    out.backward(retain_graph=True)
    out.backward()
    assert torch.allclose(x.grad, 2 * x_ref.grad)  # type: ignore[arg-type]

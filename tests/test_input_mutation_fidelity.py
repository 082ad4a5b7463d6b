"""Input mutations that torch's own AOTAutograd suite pins down: ``set_`` on inputs (See
Note [set_ on an input]), mutations a custom backward makes to forward inputs, and the
graphs handed to the compiler when such mutations stay in the graph.

Each case runs eagerly and through aotkit (and, where torch supports it, through torch's
AOTAutograd) and compares values, input states and gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aotkit
import functorch.compile as torch_compile
import pytest
import torch


def _graph_cell(cell: list[torch.fx.GraphModule]) -> Callable[..., Any]:
    def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        cell.append(gm)
        return aotkit.nop(gm, example_inputs)

    return compiler


def _set_then_mutate_other(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        a.set_(b)
        b.mul_(2)
    return a + b


def test_set_under_no_grad_stays_in_the_training_graph_as_set() -> None:
    def inputs() -> list[torch.Tensor]:
        return [torch.ones(3, 3, requires_grad=True).add(1), torch.ones(3, 3, requires_grad=True).add(2)]

    ref = inputs()
    ref_out = _set_then_mutate_other(*ref)
    graphs: list[torch.fx.GraphModule] = []
    got = inputs()
    out = aotkit.aot_function(
        _set_then_mutate_other, _graph_cell(graphs), keep_inference_input_mutations=True
    )(*got)
    torch.testing.assert_close(out, ref_out)
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r)
    targets = [n.target for n in graphs[0].graph.nodes]
    # the swap and the write stay in the graph, so the forward returns only the user output
    assert torch.ops.aten.set_.source_Tensor in targets
    assert torch.ops.aten.copy_.default in targets
    assert len(graphs[0].graph.find_nodes(op="output")[0].args[0]) == 1


def test_set_followed_by_a_mutation_autograd_records_raises_like_torch() -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            a.set_(b)
        a.mul_(2)
        return a + b

    def inputs() -> list[torch.Tensor]:
        return [torch.ones(3, requires_grad=True).add(1), torch.ones(3, requires_grad=True).add(1)]

    for keep in (True, False):
        with pytest.raises(AssertionError, match="other mutations that we cannot") as err:
            aotkit.aot_function(f, aotkit.nop, keep_inference_input_mutations=keep)(*inputs())
        assert "torch.no_grad()" in str(err.value)
        with pytest.raises(AssertionError, match="other mutations that we cannot"):
            torch_compile.aot_function(f, torch_compile.nop, keep_inference_input_mutations=keep)(
                *inputs()
            )


def test_set_alone_out_of_graph_still_matches_eager() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.set_(y * 2)
        return x + 1

    ref = [torch.arange(3.0), torch.arange(3.0) + 5]
    got = [t.clone() for t in ref]
    ref_out = f(*ref)
    out = aotkit.aot_function(f, aotkit.nop)(*got)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(got[0], ref[0])


def test_storage_resize_then_set_on_a_leaf_that_requires_grad() -> None:
    def f(a: torch.Tensor) -> None:
        with torch.no_grad():
            torch.ops.inductor.resize_storage_bytes_(a, 0)
            a.set_(torch.ones(2))

    ref = torch.zeros(8, requires_grad=True)
    f(ref)
    got = torch.zeros(8, requires_grad=True)
    aotkit.aot_function(f, aotkit.nop, keep_inference_input_mutations=True)(got)
    torch.testing.assert_close(got.detach(), ref.detach())
    assert got.shape == ref.shape == (2,)

"""Dynamic shapes: one compilation for many sizes, symints saved for backward, and guards.

Every program here runs eagerly and through ``aot_function``/``aot_module`` with
``dynamic=True`` on a sequence of sizes; outputs, input gradients (and parameter
gradients), mutated inputs and output aliasing must match eager, and the number of
compilations must be exactly what Note [Shape guards] predicts.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn as nn
from aotkit_backends import nop
from aotkit_frontends import aot_function, aot_module
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._functorch import aot_autograd as torch_aot

# ---- harness -------------------------------------------------------------------------


class CountingCompiler:
    """A nop compiler that counts the graphs it receives, by kind."""

    def __init__(self) -> None:
        self.graphs: list[tuple[str, torch.fx.GraphModule]] = []

    def kind(self, name: str) -> Callable[..., Any]:
        def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
            self.graphs.append((name, gm))
            return nop(gm, example_inputs)

        return compile_graph

    @property
    def compilations(self) -> int:
        """One per traced entry: a training entry compiles fw+bw, inference one graph."""
        return sum(1 for k, _ in self.graphs if k in ("fw", "inference"))

    def aot_function(self, fn: Callable[..., Any], **kw: Any) -> Callable[..., Any]:
        return aot_function(
            fn, self.kind("fw"), self.kind("bw"), inference_compiler=self.kind("inference"),
            dynamic=True, **kw,
        )


def _clone(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return a.detach().clone().requires_grad_(a.requires_grad)
    return a


def _leaves(x: Any) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _backward(outs: Any) -> None:
    diff = [o for o in _leaves(outs) if o.requires_grad]
    if diff:
        torch.autograd.backward(diff, [torch.ones_like(o) for o in diff])


def check_call(
    compiled: Callable[..., Any],
    eager: Callable[..., Any],
    args: Sequence[Any],
    *,
    grad_of: Sequence[torch.Tensor] = (),
    ref_grad_of: Sequence[torch.Tensor] = (),
) -> None:
    """Run both on copies of ``args``; compare outputs, aliasing, mutations and grads."""
    mine, ref = [_clone(a) for a in args], [_clone(a) for a in args]
    got, want = compiled(*mine), eager(*ref)
    for g, w in zip(_leaves(got), _leaves(want), strict=True):
        assert g.shape == w.shape and g.stride() == w.stride()
        torch.testing.assert_close(g, w)
        assert g._is_view() == w._is_view()
    for a, g, w in zip(args, mine, ref, strict=True):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(g, w)  # input mutations
            assert g.shape == w.shape
    _backward(got)
    _backward(want)
    for g, w in zip(mine, ref, strict=True):
        if isinstance(g, torch.Tensor) and g.requires_grad and g.is_leaf:
            torch.testing.assert_close(g.grad, w.grad)
    for g, w in zip(grad_of, ref_grad_of, strict=True):
        torch.testing.assert_close(g.grad, w.grad, rtol=1e-4, atol=1e-5)


# ---- functions that compile once for every size ---------------------------------------


@dataclass(frozen=True)
class OnceCase:
    """``program`` compiles once for all ``sizes``; ``inputs(n)`` builds its arguments."""

    name: str
    program: Callable[..., Any]
    inputs: Callable[[int], tuple[Any, ...]]
    sizes: tuple[int, ...] = (2, 3, 7, 16, 33, 64)


def _rand(*shape: int, grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape, requires_grad=grad)


def flatten_rows_then_mean(x: torch.Tensor) -> torch.Tensor:
    return x.view(x.shape[0], -1).sum() / x.shape[0]


def reshape_chain(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b, c, d = x.shape
    y = x.reshape(b * c, d).t().contiguous().view(d, b, c).permute(1, 2, 0)
    return y.flatten(1).softmax(-1), x.new_ones(b, 2) * y.mean()


def symbolic_output_shapes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    half = x[: x.shape[0] // 2]
    rows = torch.arange(x.shape[0], dtype=x.dtype).unsqueeze(1)
    return torch.cat([x, half.exp()]), x * rows


def int_argument(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.repeat(n, 1) * n + x.shape[0]


def mutates_dynamic_input(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.add_(1)
    return x * y


def mutates_input_with_grad(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.mul_(y)
    return x.sum(1)


def aliased_outputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return x.view(-1), x[: x.shape[0] // 2], x * 2


ONCE_CASES = [
    OnceCase("flatten_rows_then_mean", flatten_rows_then_mean, lambda n: (_rand(n, 3, 4),)),
    OnceCase("reshape_chain", reshape_chain, lambda n: (_rand(n, 3, 5),)),
    OnceCase(
        "symbolic_output_shapes", symbolic_output_shapes, lambda n: (_rand(n, 3),),
        sizes=(4, 6, 9, 33),  # n // 2 >= 2: no size-1 slice
    ),
    OnceCase("int_argument", int_argument, lambda n: (_rand(n, 3), n + 2), sizes=(2, 3, 7)),
    OnceCase(
        "mutates_dynamic_input", mutates_dynamic_input,
        lambda n: (torch.randn(n, 3), _rand(n, 3)),
    ),
    OnceCase(
        "aliased_outputs", aliased_outputs, lambda n: (_rand(n, 3),), sizes=(4, 6, 9, 33)
    ),
]


@pytest.mark.parametrize("case", ONCE_CASES, ids=lambda c: c.name)
def test_one_compilation_for_all_sizes(case: OnceCase) -> None:
    counter = CountingCompiler()
    compiled = counter.aot_function(case.program)
    for n in case.sizes:
        torch.manual_seed(n)
        check_call(compiled, case.program, case.inputs(n))
    assert counter.compilations == 1, [gm.code for _, gm in counter.graphs]
    assert len(compiled._aotkit_cache.entries) == 1  # type: ignore[attr-defined]


def test_input_mutation_of_non_leaf_with_grad() -> None:
    """x.add_ on a dynamic non-leaf input that requires grad: gradients flow through it."""
    counter = CountingCompiler()
    compiled = counter.aot_function(mutates_input_with_grad)
    for n in (3, 5, 12):
        leaf, y = _rand(n, 3), _rand(n, 3)
        ref_leaf, ref_y = _clone(leaf), _clone(y)
        x, ref_x = leaf * 1, ref_leaf * 1
        compiled(x, y).sum().backward()
        mutates_input_with_grad(ref_x, ref_y).sum().backward()
        torch.testing.assert_close(x, ref_x)
        torch.testing.assert_close(leaf.grad, ref_leaf.grad)
        torch.testing.assert_close(y.grad, ref_y.grad)
    assert counter.compilations == 1


# ---- modules --------------------------------------------------------------------------


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 8))


def _encoder_layer() -> nn.Module:
    return nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)


@pytest.mark.parametrize(
    ("make", "input_shape"),
    [(_mlp, (16,)), (_encoder_layer, (5, 16))],
    ids=["mlp", "transformer_encoder_layer"],
)
def test_module_compiles_once_for_all_batch_sizes(
    make: Callable[[], nn.Module], input_shape: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    mod = make()
    ref = copy.deepcopy(mod)
    counter = CountingCompiler()
    compiled = aot_module(
        mod, counter.kind("fw"), counter.kind("bw"),
        inference_compiler=counter.kind("inference"), dynamic=True,
    )
    for n in (2, 3, 7, 16, 33, 64):
        mod.zero_grad()
        ref.zero_grad()
        x = torch.randn(n, *input_shape, requires_grad=True)
        check_call(
            compiled, ref, (x,), grad_of=list(mod.parameters()), ref_grad_of=list(ref.parameters())
        )
    assert counter.compilations == 1
    # the parameters kept static shapes; the batch is a symbol
    fw = next(gm for k, gm in counter.graphs if k == "fw")
    vals = [n.meta["val"] for n in fw.graph.find_nodes(op="placeholder")]
    n_params = len(list(mod.parameters()))
    assert all(isinstance(s, int) for v in vals[:n_params] for s in v.shape)
    assert isinstance(vals[n_params].shape[0], torch.SymInt)


# ---- saved symints ----------------------------------------------------------------------


def test_backward_that_needs_only_sizes_saves_symints() -> None:
    counter = CountingCompiler()
    compiled = counter.aot_function(flatten_rows_then_mean)
    for n in (4, 9):
        check_call(compiled, flatten_rows_then_mean, (_rand(n, 3, 2),))
    [artifacts] = compiled._aotkit_cache.artifacts  # type: ignore[attr-defined]
    partition = artifacts.partition
    assert partition.saved_tensor_names == ()
    assert partition.num_saved_symints >= 1
    fw, bw = (gm for _, gm in counter.graphs)
    assert any(n.target == torch.ops.aten.sym_size.int for n in fw.graph.nodes)
    bw_vals = [n.meta["val"] for n in bw.graph.find_nodes(op="placeholder")]
    assert all(isinstance(v, torch.SymInt) for v in bw_vals[: partition.num_saved_symints])


# ---- guards: specialization retraces ----------------------------------------------------


def branches_on_batch(x: torch.Tensor) -> torch.Tensor:
    if x.shape[0] > 4:
        return (x * 2).sum(0)
    return (x.sin() + 1).sum(0)


def test_branch_on_size_retraces_for_the_other_side() -> None:
    counter = CountingCompiler()
    compiled = counter.aot_function(branches_on_batch)
    for n in (8, 3, 6, 2, 5, 4, 64):
        check_call(compiled, branches_on_batch, (_rand(n, 3),))
    assert counter.compilations == 2
    cache = compiled._aotkit_cache  # type: ignore[attr-defined]
    big, small = (entry[2].guard for entry in cache.entries)
    assert big([torch.randn(9, 3)]) and not big([torch.randn(4, 3)])
    assert small([torch.randn(4, 3)]) and not small([torch.randn(5, 3)])
    assert big.failures([torch.randn(3, 3)]) == ["5 <= L['t0'].size()[0]"]


@pytest.mark.parametrize("sizes", [(8, 1, 8, 1), (1, 8, 1, 5)], ids=["n_first", "one_first"])
def test_size_one_never_shares_a_graph_with_size_n(sizes: tuple[int, ...]) -> None:
    """ShapeEnv specializes sizes 0 and 1: the batch-1 graph has 1 baked in."""

    def mean_over_batch(x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], -1).mean(0) * x.shape[0]

    counter = CountingCompiler()
    compiled = counter.aot_function(mean_over_batch)
    for n in sizes:
        check_call(compiled, mean_over_batch, (_rand(n, 2, 3),))
    assert counter.compilations == 2


def test_size_specialized_during_tracing_is_guarded() -> None:
    """``view(8, ...)`` pins the batch to 8: other batches retrace instead of failing."""

    def pinned(x: torch.Tensor) -> torch.Tensor:
        return x.view(8, -1).sum(1) if x.shape[0] == 8 else x.sum(1)

    counter = CountingCompiler()
    compiled = counter.aot_function(pinned)
    for n in (8, 5, 8, 6):
        check_call(compiled, pinned, (_rand(n, 3),))
    assert counter.compilations == 2


def test_int_argument_used_for_control_flow_is_specialized() -> None:
    def unrolled(x: torch.Tensor, n: int) -> torch.Tensor:
        for _ in range(n):
            x = x.sin()
        return x

    counter = CountingCompiler()
    compiled = counter.aot_function(unrolled)
    for n in (2, 3, 2, 3):
        check_call(compiled, unrolled, (_rand(4, 3), n))
    assert counter.compilations == 2


def test_non_contiguous_input_retraces() -> None:
    """Strides are guarded too: a transposed input never runs the contiguous graph."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.view(-1) * 2 if x.is_contiguous() else x.reshape(-1)

    counter = CountingCompiler()
    compiled = counter.aot_function(f)
    for x in (_rand(4, 3), _rand(3, 5).detach().t().requires_grad_(), _rand(6, 3)):
        check_call(compiled, f, (x,))
    assert counter.compilations == 2


def test_static_path_is_unchanged() -> None:
    counter = CountingCompiler()
    compiled = aot_function(flatten_rows_then_mean, counter.kind("fw"), counter.kind("bw"))
    for n in (2, 3, 2):
        check_call(compiled, flatten_rows_then_mean, (_rand(n, 4),))
    assert counter.compilations == 2
    assert all(e[2].guard is None for e in compiled._aotkit_cache.entries)  # type: ignore[attr-defined]


def test_guards_added_by_the_compiler_are_kept() -> None:
    """A compiler may specialize too (inductor bounds reduction sizes, for example): guards
    are collected after the compilers ran, so the entry is guarded by those as well."""

    def small_batches_only(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        x = next(a for a in example_inputs if isinstance(a, torch.Tensor) and a.dim() == 3)
        bool(x.shape[0] < 100)  # records the guard s0 < 100 (or s0 >= 100)
        return nop(gm, example_inputs)

    compiled = aot_function(flatten_rows_then_mean, small_batches_only, nop, dynamic=True)
    for n in (3, 8, 150, 5, 200):
        check_call(compiled, flatten_rows_then_mean, (_rand(n, 3, 4),))
    assert len(compiled._aotkit_cache.entries) == 2  # type: ignore[attr-defined]


# ---- property: any sequence of sizes -----------------------------------------------------


def _size_class(n: int) -> str:
    # sizes 0 and 1 are specialized; the branch splits the rest at 4
    return str(n) if n < 2 else ("small" if n <= 4 else "big")


def _classified(x: torch.Tensor) -> torch.Tensor:
    y = x.reshape(x.shape[0], x.shape[1] * x.shape[2])
    if x.shape[0] > 4:
        return y.cos() * x.shape[0]
    return y.sin().sum(0, keepdim=True).expand(x.shape[0], -1) + 1


_PROPERTY_COUNTER = CountingCompiler()
_PROPERTY_FN = _PROPERTY_COUNTER.aot_function(_classified)
_PROPERTY_SEEN: set[str] = set()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=6))
def test_compilations_follow_size_classes(sizes: list[int]) -> None:
    """One entry per size class ever seen, whatever the order; every result matches."""
    for n in sizes:
        _PROPERTY_SEEN.add(_size_class(n))
        check_call(_PROPERTY_FN, _classified, (_rand(n, 2, 3),))
        assert _PROPERTY_COUNTER.compilations == len(_PROPERTY_SEEN)


# ---- against torch's aot_function(dynamic=True) ---------------------------------------------


@pytest.mark.parametrize(
    "case", [c for c in ONCE_CASES if c.name in ("flatten_rows_then_mean", "reshape_chain")],
    ids=lambda c: c.name,
)
def test_matches_torch_dynamic(case: OnceCase) -> None:
    ours = aot_function(case.program, nop, dynamic=True)
    theirs = torch_aot.aot_function(
        case.program, torch_aot.make_boxed_compiler(lambda gm, _: gm), dynamic=True
    )
    for n in case.sizes[:4]:
        torch.manual_seed(n)
        args = case.inputs(n)
        check_call(ours, theirs, args)

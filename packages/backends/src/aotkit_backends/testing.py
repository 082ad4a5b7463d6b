"""A conformance suite for graph compilers (needs pytest: the ``testing`` extra).

Subclass ``CompilerConformance`` in a test module, provide a ``compiler`` fixture, and
every check below runs against your compiler::

    import pytest
    from .testing import CompilerConformance
    from aotkit_schemas import Compiler, is_boxed

    class TestMyCompiler(CompilerConformance):
        @pytest.fixture
        def compiler(self) -> Compiler:
            return my_compiler

Each case in ``CONFORMANCE_CASES`` is a small function traced to an ATen graph with
``make_fx``, the way AOTAutograd hands graphs to a compiler: flat tensor inputs, a flat
list of outputs. The suite checks that the compiled graph

* follows the ``aotkit_schemas.Compiler`` protocol and returns a boxed callable
  (Note [Boxed calling convention] in ``aotkit_schemas``);
* reproduces the graph's own outputs on real inputs (same count, dtypes, shapes, values),
  whether the compiler was given real or fake example inputs;
* does not mutate its inputs, neither while compiling nor while running.

Set ``rtol``/``atol`` on the subclass for a compiler that reorders floating-point work, and
``skip_cases`` (case name -> reason) for a case the compiler does not support yet.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import pytest
import torch
import torch.fx
from aotkit_schemas import Compiler, is_boxed
from torch.fx.experimental.proxy_tensor import make_fx

ExampleInputKind = Literal["real", "fake"]


@dataclass(frozen=True)
class ConformanceCase:
    """A named program and a factory for its (real) inputs."""

    name: str
    # returns a flat list of tensors (or None), like an AOTAutograd graph
    fn: Callable[..., list[torch.Tensor | None]]
    make_inputs: Callable[[torch.Generator], list[torch.Tensor]]


def _pointwise(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor | None]:
    return [torch.sin(x) * y + 1.0, torch.relu(x - y), torch.where(x > 0, x, y)]


def _matmul(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor | None]:
    return [x @ w, torch.addmm(b, x, w)]


def _reductions(x: torch.Tensor) -> list[torch.Tensor | None]:
    return [
        x.sum(),
        x.mean(dim=0),
        x.amax(dim=1, keepdim=True),
        x.var(dim=1),
        x.argmax(dim=1),
    ]


def _multiple_outputs(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor | None]:
    s = x + y
    return [s, x * y, (x - y).abs().sum(dim=0), s.to(torch.float64), x.clone()]


def _view_outputs(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor | None]:
    # views of inputs and of intermediates, as AOTAutograd graphs return them
    return [x.t(), x[1], x.view(-1), (x + y).view(2, -1), x.unsqueeze(0).expand(3, -1, -1)]


def _indexing(x: torch.Tensor, idx: torch.Tensor) -> list[torch.Tensor | None]:
    return [x.index_select(0, idx), idx * 2, torch.gather(x, 1, idx.unsqueeze(1))]


def _backward_like(
    x: torch.Tensor, y: torch.Tensor, unused: torch.Tensor
) -> list[torch.Tensor | None]:
    # backward graphs return None for inputs that need no gradient and may ignore inputs
    return [x * 2.0, None, y.neg()]


def _rand(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


CONFORMANCE_CASES: tuple[ConformanceCase, ...] = (
    ConformanceCase("pointwise", _pointwise, lambda g: [_rand(g, 4, 5), _rand(g, 4, 5)]),
    ConformanceCase("matmul", _matmul, lambda g: [_rand(g, 3, 4), _rand(g, 4, 5), _rand(g, 5)]),
    ConformanceCase("reductions", _reductions, lambda g: [_rand(g, 6, 7)]),
    ConformanceCase(
        "multiple_outputs", _multiple_outputs, lambda g: [_rand(g, 4, 3), _rand(g, 4, 3)]
    ),
    ConformanceCase("view_outputs", _view_outputs, lambda g: [_rand(g, 4, 4), _rand(g, 4, 4)]),
    ConformanceCase(
        "indexing",
        _indexing,
        lambda g: [_rand(g, 5, 3), torch.randint(0, 3, (5,), generator=g)],
    ),
    ConformanceCase(
        "backward_like", _backward_like, lambda g: [_rand(g, 3), _rand(g, 3), _rand(g, 2)]
    ),
)


@dataclass(frozen=True)
class TracedCase:
    """A case traced to a graph, with what the compiler is given and what it must return."""

    gm: torch.fx.GraphModule
    # what the compiler receives: the real inputs, or the fake tensors on the placeholders
    example_inputs: list[Any]
    inputs: list[torch.Tensor]
    # the graph's own outputs on ``inputs``, computed before any compiler saw the graph
    expected: list[Any]


def make_inputs(case: ConformanceCase) -> list[torch.Tensor]:
    """The case's inputs, the same on every call."""
    return case.make_inputs(torch.Generator().manual_seed(0))


def trace_case(case: ConformanceCase, kind: ExampleInputKind) -> TracedCase:
    """Trace ``case.fn`` with ``make_fx`` and run the graph once for the expected outputs."""
    inputs = make_inputs(case)
    if kind == "real":
        gm = make_fx(case.fn)(*inputs)
        example_inputs: list[Any] = list(inputs)
    else:
        gm = make_fx(case.fn, tracing_mode="fake")(*inputs)
        example_inputs = [node.meta["val"] for node in gm.graph.find_nodes(op="placeholder")]
    expected = as_output_list(gm(*[x.clone() for x in inputs]))
    return TracedCase(gm=gm, example_inputs=example_inputs, inputs=inputs, expected=expected)


def call_compiled(compiled: Callable[..., Any], inputs: Sequence[Any]) -> Any:
    """Call a compiled graph the way a runtime does: boxed if it says so, else unpacked."""
    return compiled(list(inputs)) if is_boxed(compiled) else compiled(*inputs)


def as_output_list(out: Any) -> list[Any]:
    """A graph's outputs as a list, whether it returned a list, a tuple or one value."""
    return list(out) if isinstance(out, (list, tuple)) else [out]


@dataclass(frozen=True)
class _InputSnapshot:
    values: torch.Tensor
    size: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    version: int

    @classmethod
    def of(cls, x: torch.Tensor) -> _InputSnapshot:
        return cls(
            values=x.detach().clone(),
            size=tuple(x.size()),
            stride=tuple(x.stride()),
            storage_offset=int(x.storage_offset()),
            version=x._version,
        )

    def assert_unchanged(self, x: torch.Tensor, what: str) -> None:
        now = _InputSnapshot.of(x)
        assert (now.size, now.stride, now.storage_offset) == (
            self.size,
            self.stride,
            self.storage_offset,
        ), f"{what}: the metadata (size, stride, offset) of an input changed"
        assert now.version == self.version, f"{what}: an input was mutated in place"
        assert torch.equal(now.values, self.values), f"{what}: the values of an input changed"


_CASE_IDS = [case.name for case in CONFORMANCE_CASES]


class CompilerConformance:
    """Checks every graph compiler must pass. Subclass it and provide a ``compiler`` fixture."""

    # tolerances for torch.testing.assert_close; None means the dtype's default
    rtol: ClassVar[float | None] = None
    atol: ClassVar[float | None] = None
    # case name -> reason, for cases this compiler is known not to support
    skip_cases: ClassVar[Mapping[str, str]] = {}

    @pytest.fixture
    def compiler(self) -> Compiler:
        pytest.fail("a CompilerConformance subclass must define a `compiler` fixture")

    @pytest.fixture(params=CONFORMANCE_CASES, ids=_CASE_IDS)
    def conformance_case(self, request: pytest.FixtureRequest) -> ConformanceCase:
        case: ConformanceCase = request.param
        if case.name in self.skip_cases:
            pytest.skip(self.skip_cases[case.name])
        return case

    def assert_outputs_match(self, actual: Any, expected: Sequence[Any], what: str) -> None:
        actual_list = as_output_list(actual)
        assert len(actual_list) == len(expected), (
            f"{what}: the graph returns {len(expected)} values, the compiled graph "
            f"{len(actual_list)}"
        )
        for i, (a, e) in enumerate(zip(actual_list, expected, strict=True)):
            if isinstance(e, torch.Tensor):
                assert isinstance(a, torch.Tensor), f"{what}: output {i} is not a tensor"
                self.assert_tensors_close(a, e, f"{what}: output {i}")
            else:
                assert a == e, f"{what}: output {i} is {a!r}, expected {e!r}"

    def assert_tensors_close(self, actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
        torch.testing.assert_close(
            actual,
            expected,
            rtol=self.rtol,
            atol=self.atol,
            equal_nan=True,
            msg=lambda message: f"{what} differs: {message}",
        )

    def test_is_a_compiler(self, compiler: Compiler) -> None:
        assert isinstance(compiler, Compiler), "a compiler is called as compiler(gm, inputs)"

    @pytest.mark.parametrize("kind", ["real", "fake"])
    def test_reproduces_graph_outputs(
        self, compiler: Compiler, conformance_case: ConformanceCase, kind: ExampleInputKind
    ) -> None:
        traced = trace_case(conformance_case, kind)
        compiled = compiler(traced.gm, traced.example_inputs)
        out = call_compiled(compiled, traced.inputs)
        self.assert_outputs_match(out, traced.expected, f"{kind} example inputs")

    def test_boxed_calling_convention(
        self, compiler: Compiler, conformance_case: ConformanceCase
    ) -> None:
        # See Note [Boxed calling convention] in aotkit_schemas.
        traced = trace_case(conformance_case, "real")
        compiled = compiler(traced.gm, traced.example_inputs)
        assert is_boxed(compiled), "the compiled graph must carry _boxed_call = True"

        args = list(traced.inputs)
        out = compiled(args)
        assert out is not args, "the compiled graph returned its argument list"
        assert args == [] or (
            len(args) == len(traced.inputs)
            and all(a is x for a, x in zip(args, traced.inputs, strict=True))
        ), "the compiled graph may clear its argument list but must not otherwise change it"
        args.clear()  # the caller's right; the outputs must not depend on the list
        self.assert_outputs_match(out, traced.expected, "first call")

        again = compiled(list(traced.inputs))
        self.assert_outputs_match(again, traced.expected, "second call")

    def test_does_not_mutate_inputs(
        self, compiler: Compiler, conformance_case: ConformanceCase
    ) -> None:
        traced = trace_case(conformance_case, "real")
        before = [_InputSnapshot.of(x) for x in traced.inputs]

        compiled = compiler(traced.gm, traced.example_inputs)
        for snapshot, x in zip(before, traced.inputs, strict=True):
            snapshot.assert_unchanged(x, "while compiling")

        call_compiled(compiled, traced.inputs)
        for snapshot, x in zip(before, traced.inputs, strict=True):
            snapshot.assert_unchanged(x, "while running")

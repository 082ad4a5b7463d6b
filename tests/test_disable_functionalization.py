"""``disable_functionalization=True``: in-place ops stay in the graphs where they ran, as in
torch (See Note [Tracing without functionalization] in aotkit_tracing).

Each program runs eagerly, through aotkit and through torch's AOTAutograd with the flag;
values, inputs after the call and gradients are compared with eager, and every graph the
compilers receive with torch's, text for text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aotkit
import functorch.compile as torch_compile
import pytest
import torch
from aotkit_capture import AOTCompileError


def _run(
    api: Any, f: Callable[..., Any], make_inputs: Callable[[], list[torch.Tensor]], **kw: Any
) -> tuple[Any, ...]:
    graphs: dict[str, list[str]] = {}

    def compiler(name: str) -> Any:
        def compile_graph(gm: torch.fx.GraphModule, _: Any) -> Any:
            graphs.setdefault(name, []).append(gm.code.strip())
            return api.make_boxed_func(gm.forward)

        return compile_graph

    inputs = make_inputs()
    fn = f
    if api is not None:
        fn = api.aot_function(
            f,
            compiler("fw"),
            compiler("bw"),
            inference_compiler=compiler("inf"),
            partition_fn=api.default_partition,
            disable_functionalization=True,
            **kw,
        )
    out = fn(*inputs)
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    grads = []
    if any(o.requires_grad for o in outs):
        sum(o.sum() for o in outs if o.requires_grad).backward()  # type: ignore[union-attr]
        grads = [i.grad for i in inputs]
    after = [i.detach().clone() for i in inputs]
    return [o.detach() for o in outs], after, grads, graphs


def _three_ways(
    f: Callable[..., Any],
    make_inputs: Callable[[], list[torch.Tensor]],
    same_graphs: bool = True,
    **kw: Any,
) -> None:
    ref = _run(None, f, make_inputs)
    ours = _run(aotkit, f, make_inputs, **kw)
    theirs = _run(torch_compile, f, make_inputs, **kw)
    for got in (ours, theirs):
        for part in range(3):
            for a, b in zip(got[part], ref[part], strict=True):
                torch.testing.assert_close(a, b)
    if same_graphs:
        assert ours[3] == theirs[3]
    assert ours[3]  # a graph was compiled


class _FwBwMutation(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        torch._foreach_mul_([b], [2])  # input mutation
        x = b + 1
        torch._foreach_mul_([x], [3])  # intermediate mutation
        ctx.save_for_backward(x)
        return x * a

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (x,) = ctx.saved_tensors
        torch._foreach_mul_([x], [4])  # backward mutation of a saved activation
        return grad * x, grad * x


def _fw_bw(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _FwBwMutation.apply(a, b).sin_().clone()  # type: ignore[no-any-return]


def _inputs(b_requires_grad: bool = False) -> Callable[[], list[torch.Tensor]]:
    return lambda: [torch.ones(3, 3, requires_grad=True), torch.ones(3, 3, requires_grad=b_requires_grad)]


def test_forward_and_backward_mutations_stay_in_place() -> None:
    _three_ways(_fw_bw, _inputs(), keep_inference_input_mutations=True)


def test_in_place_ops_kept_without_keep_inference_input_mutations() -> None:
    """``b``'s mutation goes through the runtime epilogue, and the graph returns ``b``
    itself (written in place). torch then copies ``b`` onto itself, bumping its version,
    and the backward, which saved ``b``, raises "modified by an inplace operation"; eager
    works, and so does aotkit (the self-copy is skipped). The graphs are torch's."""

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        b.add_(1)
        y = a * b
        y.relu_()
        return y.clone()

    ref = _run(None, f, _inputs())
    ours = _run(aotkit, f, _inputs())
    for part in range(3):
        for x, y in zip(ours[part], ref[part], strict=True):
            torch.testing.assert_close(x, y)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _run(torch_compile, f, _inputs())
    torch_graphs: dict[str, list[str]] = {}

    def capture(gm: torch.fx.GraphModule, _: Any) -> Any:
        torch_graphs.setdefault("fw", []).append(gm.code.strip())
        return torch_compile.make_boxed_func(gm.forward)

    g = torch_compile.aot_function(
        f, capture, partition_fn=torch_compile.default_partition, disable_functionalization=True
    )
    g(*_inputs()())  # the forward only: torch's backward raises
    assert ours[3]["fw"] == torch_graphs["fw"]


def test_inference_graph_keeps_in_place_ops() -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        b.mul_(2)
        y = a + b
        y.sin_()
        return y

    with torch.no_grad():
        _three_ways(f, _inputs(), keep_inference_input_mutations=True)


def test_the_flag_is_part_of_the_disk_cache_key(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same program compiled with and without the flag gives different graphs, never one
    restored for the other."""
    monkeypatch.setenv("AOTKIT_CACHE_DIR", str(tmp_path))
    texts = []
    for flag in (False, True, False):
        seen: list[str] = []

        def fw(gm: torch.fx.GraphModule, _: Any, seen: list[str] = seen) -> Any:
            seen.append(gm.code)
            return gm

        g = aotkit.aot_function(
            _fw_bw, fw, fw, keep_inference_input_mutations=True, disable_functionalization=flag
        )
        g(*_inputs()())
        texts.append(any("aten._foreach_mul_." in c for c in seen))
    assert texts == [False, True, False]


def _well_conditioned() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 4, generator=g) + 4 * torch.eye(4)
    b = torch.randn(4, 2, generator=g)
    return [a.requires_grad_(True), b.requires_grad_(True)]


@pytest.mark.parametrize(
    ("op", "same_training_graphs"),
    [
        (lambda a, b: torch.linalg.inv(a), True),
        (lambda a, b: torch.linalg.solve(a, b), True),
        (lambda a, b: torch.linalg.matrix_power(a, -2), True),
        (lambda a, b: torch.linalg.lu_factor(a)[0], True),
        # torch's default_partition also copies the check, and the mm and cholesky it
        # reads, into the backward graph: the check runs twice per step. aotkit runs it
        # once, in the forward, where eager runs it.
        (lambda a, b: torch.linalg.cholesky(a @ a.mT), False),
    ],
    ids=["inv", "solve", "matrix_power", "lu_factor", "cholesky"],
)
def test_linalg_solvers_keep_their_error_check(
    op: Callable[..., Any], same_training_graphs: bool
) -> None:
    """Every ``torch.linalg`` solver runs ``aten._linalg_check_errors``, an effectful op
    (torch 2.15). Without functionalization it is traced as a plain call and kept in the
    forward graph, as torch does; aotkit used to refuse these programs. Values, gradients
    and graphs are compared with eager and torch (the test_aot_autograd_disable_
    functionalization_exhaustive OpInfo tests of linalg.{cholesky, inv, lu_factor,
    matrix_power, solve, tensorinv, tensorsolve})."""
    _three_ways(op, _well_conditioned, same_training_graphs, keep_inference_input_mutations=True)
    with torch.no_grad():  # inference graphs: torch's, node for node
        _three_ways(op, _well_conditioned, keep_inference_input_mutations=True)


@pytest.mark.parametrize("grad", [True, False])
def test_linalg_error_on_a_singular_matrix_is_raised_as_in_eager(grad: bool) -> None:
    """The kept check raises eager's error at run time, not a matrix of inf in silence."""
    g = aotkit.aot_function(
        torch.linalg.inv, aotkit.nop, partition_fn=aotkit.default_partition,
        disable_functionalization=True,
    )
    g(torch.eye(3, requires_grad=grad))
    singular = torch.zeros(3, 3, requires_grad=grad)
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        torch.linalg.inv(singular)
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        g(singular)


def test_effectful_op_runs_once_per_call_as_in_eager(capfd: pytest.CaptureFixture[str]) -> None:
    """An effectful op with no result (``aten._print``) stays in the forward graph, where it
    ran, and runs once per call as in eager. (torch's default_partition copies it into the
    backward graph as well, so one call and its backward print twice: not followed.)"""

    def f(x: torch.Tensor) -> torch.Tensor:
        torch.ops.aten._print("effect")
        return x * 2

    def step(fn: Callable[..., Any]) -> str:
        capfd.readouterr()
        x = torch.ones(2, requires_grad=True)
        fn(x).sum().backward()
        assert x.grad is not None
        torch.testing.assert_close(x.grad, torch.full((2,), 2.0))
        return capfd.readouterr().out

    eager = step(f)
    assert eager.count("effect") == 1
    g = aotkit.aot_function(
        f, aotkit.nop, partition_fn=aotkit.default_partition, disable_functionalization=True
    )
    for _ in range(2):  # the first call compiles, the second reuses the graphs
        assert step(g) == eager


def test_subclass_inputs_are_refused_with_the_remedy() -> None:
    from torch.testing._internal.two_tensor import TwoTensor

    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    x = TwoTensor(torch.ones(2), torch.ones(2)).requires_grad_(True)
    with pytest.raises(AOTCompileError, match="disable_functionalization at False"):
        aotkit.aot_function(f, aotkit.nop, disable_functionalization=True)(x)

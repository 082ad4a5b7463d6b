"""Effect tokens (Note [Effect tokens]): effectful ops run once per call, in program
order, in the forward and in the backward, through aot_function, torch.compile
(aotkit_eager, aotkit_inductor) and export. Compared with eager and with torch's
AOTAutograd: outputs, gradients, the side-effect log, graph text and export signatures.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from _effect_ops import LOG, log
from aotkit import (
    aot_export_joint_simple,
    aot_export_module,
    aot_function,
    aot_module,
    make_boxed_func,
    nop,
)
from aotkit_backends import inductor_available, inductor_compiler
from aotkit_backends._tokens import unlift_tokens
from aotkit_capture import AOTExportError, record_compilations
from aotkit_partitioners import (
    default_partition,
    memory_budget_partition,
    min_cut_rematerialization_partition,
)
from torch._functorch.aot_autograd import aot_export_joint_simple as torch_export_joint_simple
from torch._functorch.aot_autograd import aot_export_module as torch_export_module
from torch._higher_order_ops.effects import with_effects
from torch._library.effects import EffectType


class LoggedBackward(torch.autograd.Function):
    """``x * 2`` whose backward calls the effectful op."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return log(x, "fw") * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return log(g, "bw") * 2


def two_logs(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    a = log(x.sin() @ w, "a")
    b = log(a.cos(), "b")
    return (a * b).sum(0)


def logged_backward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    a = log(x @ w, "a")
    return LoggedBackward.apply(a.sin()).cos()


def interleaved(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    a = torch.ops.aotkit_effects_test.tick(x)
    b = log(w, "w")  # independent of ``a``: only the token orders the two
    c = torch.ops.aotkit_effects_test.tick(b)
    torch.ops.aten._print("interleaved")
    return (a @ c).sum(1)


def _cond_on(pred: bool) -> Callable[..., torch.Tensor]:
    def cond_branches(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        a = log(x @ w, "a")
        out = torch.cond(
            torch.tensor(pred),
            lambda a, w: log(a, "true").sin() * w[0],
            lambda a, w: torch.ops.aotkit_effects_test.tick(a) - w[1],
            (a, w),
        )
        return log(out, "after").sum(1)

    return cond_branches


def nested_cond(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    def inner(a: torch.Tensor) -> torch.Tensor:
        return torch.cond(a.sum() > -1e9, lambda a: log(a, "inner") * a, lambda a: a * 2, (a,))

    out = torch.cond(torch.tensor(True), lambda a: inner(log(a, "outer")), lambda a: a.cos(), (x @ w,))
    return out.sum(1)


FUNCTIONS: dict[str, tuple[Callable[..., torch.Tensor], list[str], list[str]]] = {
    # name: (function, forward log, backward log)
    "two_logs": (two_logs, ["a", "b"], []),
    "interleaved": (interleaved, ["tick", "w", "tick"], []),
    "logged_backward": (logged_backward, ["a", "fw"], ["bw"]),
    # eager's cond recomputes the taken branch in its backward: Note [Effect tokens
    # through torch.cond]
    "cond_true": (_cond_on(True), ["a", "true", "after"], ["true"]),
    "cond_false": (_cond_on(False), ["a", "tick", "after"], ["tick"]),
    "nested_cond": (nested_cond, ["outer", "inner"], ["outer", "inner", "inner"]),
}
# torch's AOTAutograd fails on these (effect tokens are not threaded through cond)
TORCH_FAILS = frozenset({"cond_true", "cond_false", "nested_cond"})


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(4, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)


def _run(fn: Callable[..., torch.Tensor], calls: int = 2) -> tuple[list[Any], list[list[str]]]:
    """Call ``fn`` ``calls`` times, each with a backward; every call's output, grads and
    log (forward part, then backward part)."""
    results: list[Any] = []
    logs: list[list[str]] = []
    for _ in range(calls):
        x, w = _inputs()
        LOG.clear()
        out = fn(x, w)
        fw_log = list(LOG)
        LOG.clear()
        out.sum().backward()
        logs.append(fw_log + ["|"] + list(LOG))
        results.append((out.detach(), x.grad, w.grad))
    return results, logs


def _assert_same(a: list[Any], b: list[Any]) -> None:
    for ra, rb in zip(a, b, strict=True):
        for ta, tb in zip(ra, rb, strict=True):
            torch.testing.assert_close(ta, tb)


def _torch_aot_function(fn: Callable[..., Any], **kw: Any) -> Callable[..., Any]:
    from functorch.compile import aot_function as torch_aot_function

    return torch_aot_function(fn, **kw)  # type: ignore[no-any-return]


def _boxed(gm: torch.fx.GraphModule, example: Any) -> Any:
    return make_boxed_func(gm.forward)


PARTITIONERS = {
    "default": default_partition,
    "min_cut": min_cut_rematerialization_partition,
    "budget_0": memory_budget_partition(0.0),
}


@pytest.mark.parametrize("partitioner", list(PARTITIONERS))
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_effectful_op_order_and_once_per_call(name: str, partitioner: str) -> None:
    fn, fw_log, bw_log = FUNCTIONS[name]
    eager, eager_logs = _run(fn)
    assert eager_logs == [[*fw_log, "|", *bw_log]] * 2
    compiled = aot_function(
        fn,
        nop,
        partition_fn=PARTITIONERS[partitioner],  # type: ignore[arg-type]
    )
    ours, our_logs = _run(compiled)
    torch_compiled = _torch_aot_function(fn, fw_compiler=_boxed, bw_compiler=_boxed)
    if name in TORCH_FAILS:
        with pytest.raises(Exception):  # noqa: B017
            _run(torch_compiled)
        assert our_logs == eager_logs
        _assert_same(ours, eager)
        return
    theirs, their_logs = _run(torch_compiled)
    # every effectful op once per call, in program order, forward ones in the forward
    assert our_logs == eager_logs == their_logs
    _assert_same(ours, eager)
    _assert_same(ours, theirs)


def _graphs(fn: Callable[..., Any], aot: Callable[..., Any]) -> tuple[str, str]:
    codes: list[str] = []

    def compiler(gm: torch.fx.GraphModule, example: Any) -> Any:
        codes.append(gm.code)
        return make_boxed_func(gm.forward)

    compiled = aot(fn, fw_compiler=compiler, bw_compiler=compiler)
    x, w = _inputs()
    compiled(x, w).sum().backward()
    return codes[0], codes[1]


def test_graphs_thread_tokens_as_torch() -> None:
    """The forward takes the token as ``primals_1`` and returns it first; the backward
    takes ``tangents_token`` last and returns its token last: torch's graphs, op for op."""
    ours = _graphs(logged_backward, aot_function)
    theirs = _graphs(logged_backward, _torch_aot_function)
    assert ours == theirs
    fw, bw = ours
    assert "def forward(self, primals_1, primals_2, primals_3)" in fw
    assert "with_effects(primals_1, torch.ops.aotkit_effects_test.log.default" in fw
    assert "tangents_token)" in bw.splitlines()[3] or "tangents_token):" in bw


def test_metadata_records_tokens() -> None:
    with record_compilations() as rec:
        x, w = _inputs()
        aot_function(logged_backward, nop)(x, w).sum().backward()
    (art,) = rec
    assert list(art.meta.tokens) == [EffectType.ORDERED]
    assert art.meta.num_backward_tokens == 1
    assert art.fw_module is not None and art.bw_module is not None
    # tokens never reach the user: the autograd.Function saw the token-free forward
    placeholders = [n.name for n in art.fw_module.graph.find_nodes(op="placeholder")]
    assert placeholders[0] == "primals_1"
    assert sum(n.target is with_effects for n in art.fw_module.graph.nodes) == 2
    assert sum(n.target is with_effects for n in art.bw_module.graph.nodes) == 1
    # See Note [Why a graph took the path it took]: the native paths decline
    assert art.path == "python"
    assert art.path_reason is not None and "aotkit_effects_test.log" in art.path_reason


def test_outputs_are_user_outputs_only() -> None:
    x, w = _inputs()
    out = aot_function(lambda x, w: (log(x, "o"), x @ w), nop)(x, w)
    assert isinstance(out, tuple) and len(out) == 2
    assert out[0].shape == x.shape and out[1].shape == (4, 3)


@pytest.mark.parametrize("mode", ["no_grad", "no_requires_grad"])
def test_inference(mode: str) -> None:
    x, w = _inputs()
    if mode == "no_requires_grad":
        x, w = x.detach(), w.detach()
    compiled = aot_function(two_logs, nop)
    for _ in range(2):
        LOG.clear()
        ctx = torch.no_grad() if mode == "no_grad" else contextlib.nullcontext()
        with ctx:
            out = compiled(x, w)
        assert LOG == ["a", "b"]
        LOG.clear()
        with ctx:
            ref = two_logs(x, w)
        torch.testing.assert_close(out, ref)
        assert not out.requires_grad


def test_inference_graph_as_torch() -> None:
    codes: list[str] = []

    def compiler(gm: torch.fx.GraphModule, example: Any) -> Any:
        codes.append(gm.code)
        return make_boxed_func(gm.forward)

    x, w = _inputs()
    with torch.no_grad():
        aot_function(two_logs, compiler)(x, w)
        _torch_aot_function(two_logs, fw_compiler=compiler)(x, w)
    assert codes[0] == codes[1]
    assert "def forward(self, arg0_1, arg1_1, arg2_1)" in codes[0]


def _print_twice(x: torch.Tensor) -> torch.Tensor:
    torch.ops.aten._print("hello")
    y = x.sin()
    torch.ops.aten._print("world")
    return y * 2


def _backends() -> list[Any]:
    skip = pytest.mark.skipif(not inductor_available(), reason="no inductor here")
    return ["aotkit_eager", pytest.param("aotkit_inductor", marks=skip)]


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("grad", [True, False])
def test_print_through_torch_compile(
    backend: str, grad: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(_print_twice, backend=backend)
    x = torch.randn(3, requires_grad=True)
    ctx = contextlib.nullcontext() if grad else torch.no_grad()
    with ctx:
        compiled(x)  # compiles (and runs once)
    capfd.readouterr()
    for _ in range(2):
        with ctx:
            out = compiled(x)
        if grad:
            out.sum().backward()
        assert capfd.readouterr().out == "hello\nworld\n"
        with ctx:
            ref = _print_twice(x)
        assert capfd.readouterr().out == "hello\nworld\n"
        torch.testing.assert_close(out, ref)
    if grad:
        # two backward calls accumulated
        torch.testing.assert_close(x.grad, torch.cos(x.detach()) * 2 * 2)


@pytest.mark.skipif(not inductor_available(), reason="no inductor here")
def test_inductor_compiler_forward_and_backward_effects() -> None:
    eager, eager_logs = _run(logged_backward)
    ours, our_logs = _run(aot_function(logged_backward, inductor_compiler))
    assert our_logs == eager_logs
    _assert_same(ours, eager)


def test_unlift_tokens_for_inductor() -> None:
    """See Note [Unlifted tokens for Inductor]."""
    with record_compilations() as rec:
        x, w = _inputs()
        aot_function(logged_backward, nop)(x, w).sum().backward()
    for gm in (rec[0].fw_module, rec[0].bw_module):
        assert gm is not None
        n_in = len(list(gm.graph.find_nodes(op="placeholder"))) - 1
        n_out = len(gm.graph.output_node().args[0]) - 1  # type: ignore[arg-type]
        unlifted = unlift_tokens(gm)
        assert unlifted is not None
        targets = [n.target for n in unlifted.gm.graph.nodes]
        assert torch.ops.prims._make_token.default in targets
        assert torch.ops.prims._sink_tokens.default in targets
        assert len(list(unlifted.gm.graph.find_nodes(op="placeholder"))) == n_in
        (outs,) = unlifted.gm.graph.output_node().args
        assert isinstance(outs, list | tuple) and len(outs) == n_out
        assert unlift_tokens(unlifted.gm) is None


class Logged(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.register_buffer("count", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        y = log(self.lin(x), "m")
        self.count.add_(1)
        torch.ops.aten._print("exported")
        return (y.sum(),)


_SIGNATURE_FIELDS = (
    "parameters",
    "buffers",
    "user_inputs",
    "user_outputs",
    "inputs_to_parameters",
    "inputs_to_buffers",
    "buffers_to_mutate",
    "parameters_to_mutate",
    "user_inputs_to_mutate",
    "in_spec",
    "out_spec",
    "backward_signature",
    "input_tokens",
    "output_tokens",
)


def test_export_module_signature_as_torch() -> None:
    args = (torch.randn(2, 3),)
    gm, sig = aot_export_module(Logged(), args, trace_joint=False)
    tgm, tsig = torch_export_module(Logged(), args, trace_joint=False)
    assert gm.code == tgm.code
    for f in _SIGNATURE_FIELDS:
        assert getattr(sig, f) == getattr(tsig, f), f
    assert sig.input_tokens == ["arg0_1"] and sig.output_tokens == ["getitem_2"]
    # the exported graph runs: tokens in, tokens out
    mod = Logged()
    LOG.clear()
    outs = gm(None, *mod.parameters(), *mod.buffers(), *args)
    assert LOG == ["m"] and len(outs) == 3


def test_export_joint_simple_as_torch() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor]:
        return (log(x, "j").sin(),)

    ours = aot_export_joint_simple(f, [torch.randn(2)], trace_joint=False)
    theirs = torch_export_joint_simple(f, [torch.randn(2)], trace_joint=False)
    assert ours.code == theirs.code


def test_joint_export_with_effects_raises() -> None:
    # torch 2.15 fails here too (an IndexError in its joint re-trace)
    with pytest.raises(AOTExportError, match="effectful ops .* in a joint export"):
        aot_export_module(Logged(), (torch.randn(2, 3),), trace_joint=True, output_loss_index=0)
    with pytest.raises(AOTExportError, match="effectful ops .* in a pre-dispatch export"):
        aot_export_module(Logged(), (torch.randn(2, 3),), trace_joint=False, pre_dispatch=True)


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    with contextlib.redirect_stdout(io.StringIO()):
        yield


@pytest.mark.parametrize("op", ["cholesky", "eigvals", "inv_ex"])
def test_linalg_error_checks(op: str) -> None:
    """linalg ops whose error checks are effectful (``_linalg_check_errors``)."""
    fns: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "cholesky": lambda a: torch.linalg.cholesky(a @ a.mT + torch.eye(3)),
        "eigvals": lambda a: torch.linalg.eigvals(a).abs(),
        "inv_ex": lambda a: torch.linalg.inv_ex(a).inverse,
    }
    fn = fns[op]
    a = torch.randn(3, 3, requires_grad=True)
    out, ref = aot_function(fn, nop)(a), fn(a)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(
        torch.autograd.grad(out.sum(), a)[0], torch.autograd.grad(ref.sum(), a)[0]
    )


def test_linalg_error_raises_as_eager() -> None:
    bad = -torch.eye(3)
    with pytest.raises(torch.linalg.LinAlgError) as eager:
        torch.linalg.cholesky(bad)
    with pytest.raises(torch.linalg.LinAlgError) as ours:
        aot_function(torch.linalg.cholesky, nop)(bad)
    assert str(ours.value) == str(eager.value)


def test_effect_in_checkpoint_recomputes_as_eager() -> None:
    """Eager's non-reentrant checkpoint runs its region again in the backward, effects
    included; aot_function's joint traces that recomputation, so the effect runs in the
    forward and again in the backward, as in eager. (torch's aot_function and every
    torch.compile backend run it once: the partitioner never recomputes ``with_effects``.)
    """
    import torch.utils.checkpoint as cp

    def f(x: torch.Tensor) -> torch.Tensor:
        return cp.checkpoint(lambda y: log(y.sin(), "ck").cos(), x, use_reentrant=False).sum()

    logs = []
    grads = []
    for fn in (f, aot_function(f, nop)):
        x = torch.randn(3, generator=torch.Generator().manual_seed(1), requires_grad=True)
        LOG.clear()
        out = fn(x)
        fw_log = list(LOG)
        out.backward()
        logs.append((fw_log, list(LOG)))
        grads.append(x.grad)
    assert logs[0] == logs[1] == (["ck"], ["ck", "ck"])
    torch.testing.assert_close(grads[0], grads[1])


def test_aot_module_with_buffer_mutation() -> None:
    """Effects next to a buffer mutation (the epilogue's copy) through aot_module."""
    torch.manual_seed(0)
    eager_mod = Logged()
    ours_mod = Logged()
    ours_mod.load_state_dict(eager_mod.state_dict())
    compiled = aot_module(ours_mod, nop)
    x = torch.randn(2, 3)
    for _ in range(2):
        for fn in (eager_mod, compiled):
            LOG.clear()
            (loss,) = fn(x)
            loss.backward()
            assert LOG == ["m"]
        torch.testing.assert_close(ours_mod.count, eager_mod.count)
        for p, q in zip(ours_mod.parameters(), eager_mod.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)


def test_torch_compile_graphs_as_torch() -> None:
    """Through dynamo, the graphs handed to the compilers equal torch's aot_autograd's."""
    from aotkit import aot_autograd
    from torch._dynamo.backends.common import aot_autograd as torch_aot_autograd

    texts = []
    for factory in (aot_autograd, torch_aot_autograd):
        codes: list[str] = []

        def compiler(gm: torch.fx.GraphModule, example: Any, codes: list[str] = codes) -> Any:
            codes.append(gm.code)
            return make_boxed_func(gm.forward)

        torch._dynamo.reset()
        x = torch.randn(3, requires_grad=True)
        with _silenced():
            backend = factory(fw_compiler=compiler, bw_compiler=compiler)
            torch.compile(_print_twice, backend=backend)(x).sum().backward()
        texts.append(codes)
    assert texts[0] == texts[1]
    assert "def forward(self, primals_1, primals_2)" in texts[0][0]

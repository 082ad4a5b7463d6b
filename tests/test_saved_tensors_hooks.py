"""Saved-tensors hooks (Note [Inlined saved-tensors hooks], Note [Inlined saved-tensors
hooks at run time]): GraphModule hooks inlined into the forward and backward graphs as
torch's AOTAutograd inlines them, in every filtering mode, with torch's graph text; plain
Python hooks applied by autograd at run time on the real saved tensors only; recompiling
when the hooks change; the disk cache refusing such compilations. Compared with eager
(under the same hooks) and torch's AOTAutograd: outputs, gradients and graph text.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch._functorch.config as functorch_config
from _autograd_functions import SaveInput
from aotkit import (
    aot_function,
    aot_module_simplified,
    get_saved_tensor_hook_context,
    make_boxed_func,
    nop,
)
from aotkit_cache.key._key import entry_key
from aotkit_schemas import Uncacheable
from torch._functorch.aot_autograd import aot_function as torch_aot_function
from torch.testing._internal.two_tensor import TwoTensor

hooks_ctx = torch.autograd.graph.saved_tensors_hooks
MODES = ("donated", "no_static", "all")

# what the traced hook functions saw: ("pack" | "unpack", context or None, real tensor?)
SEEN: list[tuple[str, Any, bool]] = []


def _record(kind: str, x: Any) -> None:
    real = type(x) is torch.Tensor
    SEEN.append((kind, None if real else get_saved_tensor_hook_context(), real))


@torch.fx.wrap
def _pack_fp8_wrap(x: torch.Tensor) -> Any:
    if not x.dtype.is_floating_point:
        return x
    _record("pack", x)
    return (x.dtype, x.to(torch.float8_e5m2))


@torch.fx.wrap
def _unpack_fp8_wrap(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    dtype, tensor = x
    _record("unpack", tensor)
    return tensor.to(dtype)


def pack_fp8(x: torch.Tensor) -> Any:
    return _pack_fp8_wrap(x)


def unpack_fp8(x: Any) -> torch.Tensor:
    return _unpack_fp8_wrap(x)


def pack_bf16(x: torch.Tensor) -> Any:
    return x.dtype, x.to(dtype=torch.bfloat16)


def unpack_bf16(packed: Any) -> torch.Tensor:
    dtype, x = packed
    return x.to(dtype)


def pack_mul2(x: torch.Tensor) -> Any:
    return x.dtype, x * 2


def unpack_mul2(packed: Any) -> torch.Tensor:
    dtype, x = packed
    return (x / 2).to(dtype)


def pack_sym(x: torch.Tensor) -> Any:
    return x.dtype, x.size(1), x.to(torch.bfloat16)


def unpack_sym(packed: Any) -> torch.Tensor:
    dtype, d1, x = packed
    return x.to(dtype) * (d1 // d1)


def pack_list(x: torch.Tensor) -> Any:
    return [x.to(torch.bfloat16), {"scale": x.abs().amax() + 1}]


def unpack_list(packed: Any) -> torch.Tensor:
    x, extra = packed
    return x.to(torch.float32) * (extra["scale"] / extra["scale"])


@torch.fx.wrap
def _two_tensor(x: torch.Tensor) -> Any:
    return TwoTensor(x, x)


def pack_two_tensor(x: torch.Tensor) -> Any:
    return _two_tensor(x)


def unpack_two_tensor(x: Any) -> torch.Tensor:
    return x.a


def pack_mutating(x: torch.Tensor) -> Any:
    x.add_(1)
    return x


def unpack_identity(x: torch.Tensor) -> torch.Tensor:
    return x


def to_gm(pack: Callable[..., Any], unpack: Callable[..., Any]) -> tuple[Any, Any]:
    return torch.fx.symbolic_trace(pack), torch.fx.symbolic_trace(unpack)


def mlp(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = (x @ w).relu()
    return (y.sin() * 2).cos()


def saf_relu(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x0 = x
    y = SaveInput.apply(x)
    return x0, torch.nn.functional.relu(y)


def _inputs() -> list[torch.Tensor]:
    # small powers of two: exact in bf16 and float8_e5m2, so eager, aotkit and torch agree
    x = torch.tensor([[1.0, 0.5, 2.0, 0.25], [0.5, 1.0, 0.25, 2.0], [2.0, 0.25, 1.0, 0.5]])
    w = torch.tensor([[0.5, 1.0, 0.25, 2.0, 1.0]] * 4)
    return [x.requires_grad_(), w.requires_grad_()]


@contextlib.contextmanager
def _mode(mode: str) -> Iterator[None]:
    with functorch_config.patch(saved_tensors_hooks_filtering_mode=mode):
        yield


def _codes() -> tuple[list[str], Callable[..., Any]]:
    codes: list[str] = []

    def compiler(gm: torch.fx.GraphModule, example: Any) -> Any:
        codes.append(gm.code.strip())
        return make_boxed_func(gm.forward)

    return codes, compiler


def _run(
    aot: Callable[..., Any], fn: Callable[..., Any], hooks: tuple[Any, Any] | None
) -> tuple[Any, list[Any], list[str]]:
    codes, compiler = _codes()
    args = [a.detach().clone().requires_grad_() for a in _inputs()]
    ctx = hooks_ctx(*hooks) if hooks is not None else contextlib.nullcontext()
    with ctx:
        compiled = aot(fn, compiler, compiler) if aot is not None else fn
        out = compiled(*args)
        outs = out if isinstance(out, tuple) else (out,)
        outs[-1].sum().backward()
    return [o.detach() for o in outs], [a.grad for a in args], codes


def _eager(fn: Callable[..., Any], hooks: tuple[Any, Any]) -> tuple[Any, list[Any]]:
    args = [a.detach().clone().requires_grad_() for a in _inputs()]
    with hooks_ctx(*hooks):
        out = fn(*args)
        outs = out if isinstance(out, tuple) else (out,)
        outs[-1].sum().backward()
    return [o.detach() for o in outs], [a.grad for a in args]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "pair",
    [
        (pack_bf16, unpack_bf16),
        (pack_fp8, unpack_fp8),
        (pack_mul2, unpack_mul2),
        (pack_list, unpack_list),
    ],
    ids=["bf16", "fp8", "mul2", "list"],
)
def test_graph_hooks_match_torch_and_eager(mode: str, pair: Any) -> None:
    hooks = to_gm(*pair)
    with _mode(mode):
        outs, grads, codes = _run(aot_function, mlp, hooks)
        t_outs, t_grads, t_codes = _run(torch_aot_function, mlp, hooks)
    e_outs, e_grads = _eager(mlp, hooks)
    assert codes == t_codes
    assert len(codes) == 2
    # the hooks are in the graphs: a packed value crosses from forward to backward
    assert "_hook_" in codes[0] and "_hook_" in codes[1]
    for a, t, e in zip([*outs, *grads], [*t_outs, *t_grads], [*e_outs, *e_grads], strict=True):
        assert torch.equal(a, t)
        torch.testing.assert_close(a, e, atol=1e-2, rtol=1e-2)


def test_filtering_modes_select_the_saved_values() -> None:
    hooks = to_gm(pack_bf16, unpack_bf16)
    fw: dict[str, str] = {}
    for mode in MODES:
        with _mode(mode):
            fw[mode] = _run(aot_function, mlp, hooks)[2][0]
    # donated: intermediates only; the inputs are saved as they are
    assert "primals_1_hook" not in fw["donated"] and "relu_hook_1" in fw["donated"]
    # aot_function has no static inputs: no_static hooks the inputs too
    assert "primals_1_hook_1" in fw["no_static"] and "relu_hook_1" in fw["no_static"]
    assert fw["no_static"] == fw["all"]


def test_donated_mode_without_donated_buffers_inlines_nothing() -> None:
    """relu saves its output, which is a user output: no donated buffer, nothing inlined,
    and (as torch) the hooks do not run at run time either."""
    hooks = to_gm(pack_fp8, unpack_fp8)

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.relu()

    for aot in (aot_function, torch_aot_function):
        codes, compiler = _codes()
        SEEN.clear()
        x = torch.randn(3, requires_grad=True)
        with _mode("donated"), hooks_ctx(*hooks):
            aot(f, compiler, compiler)(x).sum().backward()
        assert "_hook_" not in codes[0]
        assert not [s for s in SEEN if s[2]], aot  # never on real tensors
    assert torch.equal(x.grad, (x > 0).float())


class AF(torch.autograd.Function):
    """Saves a SymInt under dynamic shapes (torch's suite's AF)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.d1 = x.size(1)
        return x

    @staticmethod
    def backward(ctx: Any, gx: torch.Tensor) -> torch.Tensor:
        (saved,) = ctx.saved_tensors
        return gx + saved * ctx.d1


def mlp_af(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return AF.apply(2 * (x @ w).relu() + 1)


def _dynamic_run(aot: Any, fn: Callable[..., Any], hooks: Any) -> tuple[list[str], list[Any]]:
    codes, compiler = _codes()
    x, w = (a.detach().clone().requires_grad_() for a in _inputs())
    with hooks_ctx(*hooks):
        out = aot(fn, compiler, compiler, dynamic=True)(x, w)
        out.sum().backward()
    return codes, [out.detach(), x.grad, w.grad]


def test_symbolic_scalars_returned_by_pack_match_torch() -> None:
    hooks = to_gm(pack_sym, unpack_sym)
    with _mode("all"):
        codes, values = _dynamic_run(aot_function, mlp_af, hooks)
        t_codes, t_values = _dynamic_run(torch_aot_function, mlp_af, hooks)
    e_outs, e_grads = _eager(mlp_af, hooks)
    assert codes == t_codes
    # packed SymInts lead the backward's inputs, before the saved ones
    assert "sym_size_int" in codes[0] and "_hook_1" in codes[1].splitlines()[0]
    for a, t, e in zip(values, t_values, [*e_outs, *e_grads], strict=True):
        assert torch.equal(a, t)
        torch.testing.assert_close(a, e, atol=1e-2, rtol=1e-2)


def test_symbolic_scalars_without_saved_symints() -> None:
    """No SymInt saved by the program: torch 2.15 fails its own name check here (its
    anchor for packed SymInts is a replaced placeholder); aotkit keeps the convention."""
    hooks = to_gm(pack_sym, unpack_sym)
    with _mode("all"):
        codes, values = _dynamic_run(aot_function, mlp, hooks)
        with pytest.raises(AssertionError, match="fw_t_names == bw_t_names"):
            _dynamic_run(torch_aot_function, mlp, hooks)
    e_outs, e_grads = _eager(mlp, hooks)
    first_bw_line = codes[1].splitlines()[0]
    assert first_bw_line.startswith("def forward(self, primals_1_hook_1, primals_2_hook_1,")
    for a, e in zip(values, [*e_outs, *e_grads], strict=True):
        torch.testing.assert_close(a, e, atol=1e-2, rtol=1e-2)


def test_subclass_returned_by_pack_is_refused_with_torch_text() -> None:
    hooks = to_gm(pack_two_tensor, unpack_two_tensor)
    x = torch.randn(3, requires_grad=True)
    with _mode("all"), hooks_ctx(*hooks):
        with pytest.raises(NotImplementedError, match="Tensor subclasses in GraphModule saved"):
            aot_function(lambda t: t.sin(), nop)(x)
    assert x.grad is None


def test_mutating_hook_is_refused() -> None:
    hooks = to_gm(pack_mutating, unpack_identity)
    x = torch.randn(3, requires_grad=True)
    before = x.detach().clone()
    with _mode("all"), hooks_ctx(*hooks):
        with pytest.raises(Exception, match="Saved tensors hooks with inputs mutations"):
            aot_function(lambda t: t.sin(), nop)(x)
    assert torch.equal(x.detach(), before)


def test_hook_context_and_no_packing_at_run_time() -> None:
    """While traced, the hooks see the graphs and the saved node; at run time the inlined
    hooks never run as Python hooks (the saved values are not packed twice)."""
    hooks = to_gm(pack_fp8, unpack_fp8)
    SEEN.clear()
    assert get_saved_tensor_hook_context() is None
    with _mode("all"):
        outs, grads, codes = _run(aot_function, mlp, hooks)
    assert SEEN, "the hooks were traced"
    for kind, ctx, real in SEEN:
        assert not real, f"{kind} hook ran on a real tensor"
        assert ctx is not None
        assert ctx["_node"].graph is ctx["_fw_graph"]
        assert ctx["_bw_graph"] is not ctx["_fw_graph"]
        assert ctx.node.name in {n.name for n in ctx.fw_graph.nodes} | {ctx.node.name}
    assert get_saved_tensor_hook_context() is None
    # eager, by contrast, packs on real tensors
    SEEN.clear()
    _eager(mlp, hooks)
    assert SEEN and all(real for _, _, real in SEEN)


def test_python_hooks_run_at_run_time_only_as_in_eager() -> None:
    calls: list[tuple[str, type]] = []

    def pack(t: torch.Tensor) -> Any:
        calls.append(("pack", type(t)))
        return t * 2

    def unpack(t: torch.Tensor) -> torch.Tensor:
        calls.append(("unpack", type(t)))
        return t / 2

    e_outs, e_grads = _eager(mlp, (pack, unpack))
    counts = {}
    for aot in (aot_function, torch_aot_function):
        calls.clear()
        outs, grads, _ = _run(aot, mlp, (pack, unpack))
        assert calls and all(t is torch.Tensor for _, t in calls), calls
        counts[aot] = len(calls)
        for a, e in zip([*outs, *grads], [*e_outs, *e_grads], strict=True):
            torch.testing.assert_close(a, e)
    assert counts[aot_function] == counts[torch_aot_function]


def test_recompiles_when_graph_hooks_change() -> None:
    bf16 = to_gm(pack_bf16, unpack_bf16)
    mul2 = to_gm(pack_mul2, unpack_mul2)
    codes, compiler = _codes()
    g = aot_function(mlp, compiler, compiler)

    def call(hooks: Any) -> tuple[Any, Any]:
        args = [a.detach().clone().requires_grad_() for a in _inputs()]
        ctx = hooks_ctx(*hooks) if hooks is not None else contextlib.nullcontext()
        with ctx:
            out = g(*args)
            out.sum().backward()
        return out.detach(), args[0].grad

    def eager(hooks: Any) -> tuple[Any, Any]:
        if hooks is None:
            args = [a.detach().clone().requires_grad_() for a in _inputs()]
            out = mlp(*args)
            out.sum().backward()
            return out.detach(), args[0].grad
        outs, grads = _eager(mlp, hooks)
        return outs[0], grads[0]

    python_hooks = (lambda t: t * 4, lambda t: t / 4)
    with _mode("all"):
        for hooks, n_entries in (
            (None, 1),
            (bf16, 2),
            (mul2, 3),
            (bf16, 3),
            (None, 3),
            (python_hooks, 3),
        ):
            out, grad = call(hooks)
            ref_out, ref_grad = eager(hooks)
            torch.testing.assert_close(out, ref_out, atol=1e-2, rtol=1e-2)
            torch.testing.assert_close(grad, ref_grad, atol=1e-2, rtol=1e-2)
            assert len(g._aotkit_cache.entries) == n_entries  # type: ignore[attr-defined]
        # the filtering mode is part of the key
    with _mode("donated"):
        call(bf16)
    assert len(g._aotkit_cache.entries) == 4  # type: ignore[attr-defined]


class _TupleOut(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.lin(x).tanh(),)


def _simplified_module() -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    gm = torch.fx.symbolic_trace(_TupleOut())
    return gm, [torch.randn(3, 4, requires_grad=True)]


def test_aot_module_simplified_refuses_other_hooks_at_call_time() -> None:
    bf16 = to_gm(pack_bf16, unpack_bf16)
    mul2 = to_gm(pack_mul2, unpack_mul2)
    gm, args = _simplified_module()
    with _mode("all"), hooks_ctx(*bf16):
        compiled = aot_module_simplified(gm, args, nop)
        compiled(*args)[0].sum().backward()
    for hooks in (mul2, (lambda t: t, lambda t: t), None):
        ctx = hooks_ctx(*hooks) if hooks is not None else contextlib.nullcontext()
        with ctx, pytest.raises(RuntimeError, match="compiled under saved tensors hooks"):
            compiled(*args)
    # compiled without hooks: Python or GraphModule hooks at the call run as in eager
    plain = aot_module_simplified(gm, args, nop)
    calls: list[int] = []
    with hooks_ctx(lambda t: (calls.append(1), t)[1], lambda t: t):
        plain(*args)[0].sum().backward()
    assert calls


def test_torch_compile_donated_idxs_after_inlining(caplog: pytest.LogCaptureFixture) -> None:
    """torch's suite test_saved_tensors_hooks_donated_buffers, with aotkit_eager and
    torch's aot_eager side by side: the packed values become donated buffers."""
    hooks = to_gm(pack_fp8, unpack_fp8)
    logger = "torch._functorch._aot_autograd.graph_compile"
    lines: dict[str, list[str]] = {}
    results: dict[str, Any] = {}
    for backend in ("aotkit_eager", "aot_eager"):
        torch._dynamo.reset()
        for case, ctx in (("plain", contextlib.nullcontext()), ("hooks", hooks_ctx(*hooks))):
            inp = torch.rand([3, 3], generator=torch.Generator().manual_seed(0))
            inp.requires_grad_()
            caplog.clear()
            with (
                functorch_config.patch(donated_buffer=True),
                _mode("no_static"),
                ctx,
                caplog.at_level(logging.INFO, logger=logger),
            ):
                out = torch.compile(saf_relu, backend=backend, fullgraph=True, dynamic=False)(inp)
                out[1].sum().backward()
            lines[f"{backend}/{case}"] = [
                r.getMessage() for r in caplog.records if "bw_donated_idxs" in r.getMessage()
            ]
            results[f"{backend}/{case}"] = (out[1].detach(), inp.grad)
    torch._dynamo.reset()
    assert any("bw_donated_idxs=[]" in m for m in lines["aotkit_eager/plain"])
    assert any("bw_donated_idxs=[0, 1]" in m for m in lines["aotkit_eager/hooks"])
    assert any("bw_donated_idxs=[0, 1]" in m for m in lines["aot_eager/hooks"])
    for case in ("plain", "hooks"):
        for a, t in zip(results[f"aotkit_eager/{case}"], results[f"aot_eager/{case}"], strict=True):
            assert torch.equal(a, t)


def test_torch_compile_no_static_skips_parameters_as_torch() -> None:
    from aotkit import aot_autograd
    from torch._dynamo.backends.common import aot_autograd as torch_aot_autograd

    hooks = to_gm(pack_bf16, unpack_bf16)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    codes: dict[str, list[str]] = {}
    grads: dict[str, list[torch.Tensor]] = {}
    for name, factory in (("aotkit", aot_autograd), ("torch", torch_aot_autograd)):
        torch._dynamo.reset()
        seen, compiler = _codes()
        model.zero_grad()
        x = torch.ones(3, 4, requires_grad=True)
        with _mode("no_static"), hooks_ctx(*hooks):
            backend = factory(fw_compiler=compiler, bw_compiler=compiler)
            torch.compile(model, backend=backend, fullgraph=True, dynamic=False)(x).sum().backward()
        codes[name] = seen
        grads[name] = [x.grad, *(p.grad for p in model.parameters())]
    torch._dynamo.reset()
    assert codes["aotkit"] == codes["torch"]
    assert "primals_1_hook" not in codes["aotkit"][0]  # a parameter: static
    for a, t in zip(grads["aotkit"], grads["torch"], strict=True):
        assert torch.equal(a, t)


def test_disk_cache_refuses_graph_hooks() -> None:
    from aotkit_frontends._aot_function import make_config
    from aotkit_partitioners import default_partition

    cfg = make_config(nop, nop, default_partition, None, 0, False, None)
    args = [torch.randn(3, requires_grad=True)]
    entry_key("program", args, cfg)  # fine without hooks
    with hooks_ctx(lambda t: t, lambda t: t):
        entry_key("program", args, cfg)  # Python hooks run at call time: cacheable
    with hooks_ctx(*to_gm(pack_bf16, unpack_bf16)), pytest.raises(Uncacheable):
        entry_key("program", args, cfg)


def test_export_never_calls_the_callers_hooks() -> None:
    from aotkit import aot_export_module

    calls: list[type] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        calls.append(type(t))
        return t

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    x = torch.randn(2, 4)

    def loss_model() -> Any:
        class Loss(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.m = model

            def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
                return (self.m(x).sum(),)

        return Loss()

    plain, _ = aot_export_module(loss_model(), [x], trace_joint=True, output_loss_index=0)
    with hooks_ctx(pack, lambda t: t):
        hooked, _ = aot_export_module(loss_model(), [x], trace_joint=True, output_loss_index=0)
    assert not calls
    assert hooked.code == plain.code


def test_checkpoint_inside_under_python_hooks_as_eager() -> None:
    """The caller's hooks are hidden while compiling, not ignored wholesale: the traced
    non-reentrant checkpoint still recomputes, and the caller's hooks still run at call
    time on the real saved tensors."""
    import torch.utils.checkpoint as cp

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = cp.checkpoint(lambda y: (y @ w).sin().cos(), x, use_reentrant=False)
        return (h * x.sum()).sum()

    results = []
    for fn in (f, aot_function(f, nop)):
        calls: list[type] = []

        def pack(t: torch.Tensor, calls: list[type] = calls) -> torch.Tensor:
            calls.append(type(t))
            return t

        x, w = (a.detach().clone().requires_grad_() for a in _inputs())
        with hooks_ctx(pack, lambda t: t):
            fn(x, w).backward()
        assert calls and all(t is torch.Tensor for t in calls)
        results.append((x.grad, w.grad))
    for a, e in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(a, e)


def test_torch_compile_recompiles_when_graph_hooks_change() -> None:
    """dynamo guards on the innermost GraphModule hooks; aotkit_eager's graphs follow."""
    from torch._dynamo.testing import CompileCounterWithBackend

    bf16 = to_gm(pack_bf16, unpack_bf16)
    mul2 = to_gm(pack_mul2, unpack_mul2)
    python_hooks = (lambda t: t * 4, lambda t: t / 4)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aotkit_eager")
    compiled = torch.compile(mlp, backend=counter, fullgraph=True, dynamic=False)
    with _mode("all"):
        # Python hooks reuse the hook-free graph (they run at call time); bf16 again
        # reuses its own
        for hooks, frames in ((None, 1), (bf16, 2), (mul2, 3), (python_hooks, 3), (bf16, 3)):
            args = [a.detach().clone().requires_grad_() for a in _inputs()]
            ctx = hooks_ctx(*hooks) if hooks is not None else contextlib.nullcontext()
            with ctx:
                out = compiled(*args)
                out.sum().backward()
            if hooks is None:
                e_args = [a.detach().clone().requires_grad_() for a in _inputs()]
                ref = mlp(*e_args)
                ref.sum().backward()
                e_outs, e_grads = [ref.detach()], [a.grad for a in e_args]
            else:
                e_outs, e_grads = _eager(mlp, hooks)
            for a, e in zip(
                [out.detach(), *(a.grad for a in args)], [*e_outs, *e_grads], strict=True
            ):
                torch.testing.assert_close(a, e, atol=1e-2, rtol=1e-2)
            assert counter.frame_count == frames, hooks
    torch._dynamo.reset()


# hooks written against torch: they read torch's private hook context, as the suite's
# `_pack_fp8_wrap` does. See Note [Hooks and logs written against torch].
TORCH_SEEN: list[tuple[str, Any]] = []


def _torch_context() -> Any:
    import torch._functorch._aot_autograd.graph_compile as graph_compile

    return graph_compile._get_saved_tensor_hook_context()


@torch.fx.wrap
def _pack_torch_ctx_wrap(x: torch.Tensor) -> Any:
    if type(x) is not torch.Tensor:
        TORCH_SEEN.append(("pack", _torch_context()))
    return (x.dtype, x.to(torch.bfloat16))


@torch.fx.wrap
def _unpack_torch_ctx_wrap(x: Any) -> torch.Tensor:
    dtype, tensor = x
    if type(tensor) is not torch.Tensor:
        TORCH_SEEN.append(("unpack", _torch_context()))
    return tensor.to(dtype)


def pack_torch_ctx(x: torch.Tensor) -> Any:
    return _pack_torch_ctx_wrap(x)


def unpack_torch_ctx(x: Any) -> torch.Tensor:
    return _unpack_torch_ctx_wrap(x)


@pytest.mark.parametrize("preset", [False, True], ids=["unset", "preset"])
def test_hooks_reading_torchs_context_work_as_under_torch(preset: bool) -> None:
    """A GraphModule hook written against torch (it calls torch's private
    ``_get_saved_tensor_hook_context()``) sees, under aotkit, torch's dict shape with the
    graphs and the saved node of aotkit's compilation; torch's slot is put back after
    (deleted, or the value it held); outputs and grads match eager and torch."""
    import torch._functorch._aot_autograd.graph_compile as graph_compile

    hooks = to_gm(pack_torch_ctx, unpack_torch_ctx)
    slot = graph_compile._thread_local
    sentinel = {"_fw_graph": "outer", "_bw_graph": "outer", "_node": "outer"}
    if preset:
        slot.state = sentinel
    try:
        ref_outs, ref_grads = _eager(mlp, hooks)
        results = {}
        for name, aot in (("aotkit", aot_function), ("torch", torch_aot_function)):
            TORCH_SEEN.clear()
            with _mode("all"):
                outs, grads, codes = _run(aot, mlp, hooks)
            results[name] = [kind for kind, _ in TORCH_SEEN]
            assert TORCH_SEEN, f"{name}: the hooks were traced"
            for kind, ctx in TORCH_SEEN:
                assert type(ctx) is dict, (name, kind, ctx)
                assert set(ctx) == {"_fw_graph", "_bw_graph", "_node"}
                assert isinstance(ctx["_fw_graph"], torch.fx.Graph)
                assert isinstance(ctx["_bw_graph"], torch.fx.Graph)
                assert ctx["_fw_graph"] is not ctx["_bw_graph"]
                assert ctx["_node"].graph is ctx["_fw_graph"]
            assert any("torch.bfloat16" in c for c in codes), f"{name}: hooks inlined"
            for a, b in zip([*outs, *grads], [*ref_outs, *ref_grads], strict=True):
                assert torch.equal(a, b), name
            if preset:
                assert slot.state is sentinel, name
            else:
                assert not hasattr(slot, "state"), name
        assert results["aotkit"] == results["torch"]
    finally:
        if hasattr(slot, "state"):
            del slot.state


def test_aotkit_does_not_import_torchs_graph_compile() -> None:
    """aotkit mirrors its hook context into torch's module only if that module is already
    loaded; compiling with GraphModule hooks never imports it."""
    import subprocess
    import sys

    code = (
        "import sys, torch, aotkit\n"
        "def pack(x): return x.to(torch.bfloat16)\n"
        "def unpack(x): return x.to(torch.float32)\n"
        "hooks = torch.fx.symbolic_trace(pack), torch.fx.symbolic_trace(unpack)\n"
        "x = torch.randn(3, requires_grad=True)\n"
        "import torch._functorch.config as c\n"
        "with c.patch(saved_tensors_hooks_filtering_mode='all'), "
        "torch.autograd.graph.saved_tensors_hooks(*hooks):\n"
        "    aotkit.aot_function(lambda x: x.sin().cos(), aotkit.nop)(x).sum().backward()\n"
        "assert x.grad is not None\n"
        "print('torch._functorch._aot_autograd.graph_compile' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert out.stdout.strip() == "False", out.stdout + out.stderr

"""A compiled function that changes ``requires_grad`` of its inputs behaves as eager.
See Note [Inputs whose requires_grad the function changes].

Differential: each program runs in eager and through aotkit on fresh copies of the same
inputs; outputs (values, requires_grad, grad_fn, leaf-ness, view-ness), the inputs after
the call (values, flags, leaf-ness), the gradients after ``backward``, or the error
(type and text) must agree. torch's AOTAutograd is the oracle for the graph text, and is
checked to still drop the gradient (so a fix in torch is noticed).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx
from aotkit_backends import nop
from aotkit_capture import InputRebindError, record_compilations
from aotkit_frontends import aot_function, aot_module, aot_module_simplified
from functorch.compile import aot_function as torch_aot_function
from functorch.compile import make_boxed_compiler
from functorch.compile import nop as torch_nop

Make = Callable[[], tuple[Any, ...]]


def _summary(t: torch.Tensor) -> tuple[Any, ...]:
    return (
        t.detach().clone(), t.requires_grad, t.grad_fn is not None, t.is_leaf, t._is_view(),
        tuple(t.stride()), t.storage_offset(),
    )


def _observe(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Everything eager shows of a call, or its error."""
    try:
        out = fn(*args)
    except Exception as e:  # noqa: BLE001 - the error is what is compared
        return ("error", type(e), str(e).split("\n")[0])
    outs = out if isinstance(out, (tuple, list)) else (out,)
    tensors = [o for o in outs if isinstance(o, torch.Tensor)]
    result: list[Any] = [[_summary(o) for o in tensors]]
    result.append([(a.detach().clone(), a.requires_grad, a.is_leaf) for a in args
                   if isinstance(a, torch.Tensor)])
    losses = [o.sum() for o in tensors if o.requires_grad]
    if losses:
        try:
            torch.stack(losses).sum().backward()
        except RuntimeError as e:
            result.append(("backward error", str(e).split("\n")[0]))
    result.append([None if a.grad is None else a.grad.clone() for a in args
                   if isinstance(a, torch.Tensor)])
    return tuple(result)


def _assert_same(a: Any, b: Any, path: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=path)
    elif isinstance(a, (tuple, list)):
        assert isinstance(b, (tuple, list)) and len(a) == len(b), (path, a, b)
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, (path, a, b)


def _flip(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a.requires_grad_(True)
    return a.mul(3), b.mul(4)


def _flip_attribute(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a.requires_grad = True
    return (a * b).sin()


def _flip_if_needed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # eager's branch: the watch answers ``requires_grad`` as eager's leaf would
    if not a.requires_grad and a.is_leaf and a.grad_fn is None:
        a.requires_grad_()
    return a * b + a.shape[0]


def _flip_then_return_it(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a.requires_grad_()
    return a, a[1:], a.exp()


def _flip_then_mutate(a: torch.Tensor) -> torch.Tensor:
    a.requires_grad_()
    a.mul_(2)  # eager: a leaf that requires grad used in an in-place op
    return a


def _flip_and_mutate_another(a: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    a.requires_grad_()
    buf.add_(1)
    return a * buf


def _unflip(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    b.requires_grad_(False)
    return a * b


def _unflip_attribute(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    b.requires_grad = False
    return (a * b).cos()


def _unflip_intermediate(a: torch.Tensor) -> torch.Tensor:
    y = a * 2
    y.requires_grad_(False)  # eager: not a leaf
    return y


def _flip_under_no_grad(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        a.requires_grad_()
        return a * b


def _flip_twice(a: torch.Tensor) -> torch.Tensor:
    a.requires_grad_()
    y = a * 2
    a.requires_grad_(False)
    return y


def _flip_on_off_between_uses(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a.requires_grad_()
    y = a * b
    a.requires_grad_(False)  # the flags end as they began: no change to follow
    return y, a * 3


def _flip_after_setting_the_same_flag(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a.requires_grad_(False)  # no-op: a arrives not requiring grad
    a.requires_grad_()
    a.requires_grad_()  # no-op: a is a leaf that requires grad
    return a * b


def _flip_both(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a.requires_grad_()
    b.requires_grad_()
    return a * b


def _dupe(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a.requires_grad_()
    return a * b


def _ones(*shape: int, grad: bool = False) -> torch.Tensor:
    return torch.ones(*shape).requires_grad_(grad)


def _arange(n: int, grad: bool = False) -> torch.Tensor:
    return torch.arange(float(n)).requires_grad_(grad)


def _same_tensor_twice() -> tuple[torch.Tensor, torch.Tensor]:
    t = _arange(3)
    return t, t


def _use_before_flip(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    c = a * 2
    a.requires_grad_()
    return c + a, b * 1


def _uses_with_another_before_flip(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    s = torch.mul(a, b).sum() + a.exp().mean()
    a.requires_grad_()
    return (a * s).sin() + s


PROGRAMS: list[tuple[str, Callable[..., Any], Make]] = [
    ("flip, suite's program", _flip, lambda: (_ones(3, 3), _ones(3, 3, grad=True))),
    ("flip, no other input requires grad", _flip, lambda: (_ones(3, 3), _ones(3, 3))),
    ("flip by attribute", _flip_attribute, lambda: (_arange(3), _arange(3))),
    ("flip behind a branch on the flags", _flip_if_needed, lambda: (_arange(3), _arange(3))),
    ("flip behind a branch, arrives True", _flip_if_needed,
     lambda: (_arange(3, grad=True), _arange(3))),
    ("flip, arrives True", _flip, lambda: (_ones(3, grad=True), _ones(3, grad=True))),
    ("flip, returns the input and a view", _flip_then_return_it, lambda: (_arange(4),)),
    ("flip, then in-place on it", _flip_then_mutate, lambda: (_arange(3),)),
    ("flip, another input mutated", _flip_and_mutate_another, lambda: (_arange(3), _ones(3))),
    ("flip a view of a base that needs no grad", _flip, lambda: (_arange(6)[1:4], _arange(3))),
    ("flip a transposed view", _flip, lambda: (_arange(6).view(2, 3).t(), _ones(3, 2))),
    ("flip an integer tensor", _flip,
     lambda: (torch.arange(3), torch.arange(3))),
    ("flip inside no_grad", _flip_under_no_grad, lambda: (_arange(3), _arange(3, grad=True))),
    ("flip on then off", _flip_twice, lambda: (_arange(3),)),
    ("flip on, use, off, use", _flip_on_off_between_uses,
     lambda: (_arange(3), _ones(3, grad=True))),
    ("flip between no-op sets of the flag", _flip_after_setting_the_same_flag,
     lambda: (_arange(3), _ones(3))),
    ("flip two inputs", _flip_both, lambda: (_arange(3), _ones(3))),
    ("flip an input passed twice", _dupe, _same_tensor_twice),
    ("unflip a leaf", _unflip, lambda: (_arange(3, grad=True), _ones(3, grad=True))),
    ("unflip a leaf by attribute", _unflip_attribute,
     lambda: (_arange(3, grad=True), _ones(3, grad=True))),
    ("unflip a non-leaf", _unflip, lambda: (_arange(3, grad=True), _ones(3, grad=True) * 1)),
    ("flip a view of a base that requires grad", _flip,
     lambda: (_arange(6, grad=True)[1:4], _arange(3))),
    ("unflip a view of a base that requires grad", _unflip,
     lambda: (_arange(3), _arange(6, grad=True)[1:4])),
    ("unflip an intermediate", _unflip_intermediate, lambda: (_arange(3, grad=True),)),
    ("unflip, arrives False", _unflip, lambda: (_arange(3, grad=True), _ones(3))),
    # See Note [A use of an input before its flip]
    ("use before flip", _use_before_flip, lambda: (_arange(3), _ones(3, grad=True))),
    ("uses before flip, with another input", _uses_with_another_before_flip,
     lambda: (_arange(3), _ones(3, grad=True))),
    ("use before flip, nothing else requires grad", _use_before_flip,
     lambda: (_arange(3), _ones(3))),
]


@pytest.mark.parametrize(("fn", "make"), [p[1:] for p in PROGRAMS], ids=[p[0] for p in PROGRAMS])
def test_matches_eager(fn: Callable[..., Any], make: Make) -> None:
    expected = _observe(fn, make())
    args = make()
    flags = [a.requires_grad for a in args]
    _assert_same(expected, _observe(aot_function(fn, nop), args))
    if expected[0] == "error":  # eager's error; the caller's flags are left as they were
        assert [a.requires_grad for a in args] == flags


@pytest.mark.parametrize(("fn", "make"), [p[1:] for p in PROGRAMS], ids=[p[0] for p in PROGRAMS])
def test_matches_eager_under_no_grad(fn: Callable[..., Any], make: Make) -> None:
    with torch.no_grad():
        expected = _observe(fn, make())
        _assert_same(expected, _observe(aot_function(fn, nop), make()))


@pytest.mark.parametrize(("fn", "make"), [p[1:] for p in PROGRAMS[:4]], ids=[p[0] for p in PROGRAMS[:4]])
def test_matches_eager_with_kept_input_mutations(fn: Callable[..., Any], make: Make) -> None:
    expected = _observe(fn, make())
    compiled = aot_function(fn, nop, keep_inference_input_mutations=True)
    _assert_same(expected, _observe(compiled, make()))


def _fw_code(compile_fn: Callable[..., Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> str:
    cell: list[str] = []

    def grab(gm: torch.fx.GraphModule, _: Any) -> Any:
        if not cell:
            cell.append(gm.code.strip())
        return gm

    compiled = compile_fn(fn, fw_compiler=make_boxed_compiler(grab), bw_compiler=nop)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(*args)
    return cell[0]


def test_suite_program_graph_and_gradient() -> None:
    """torch's ``test_input_inplace_requires_grad_true``: torch's forward graph, eager's
    gradient (torch drops it)."""
    a, b = _ones(3, 3), _ones(3, 3, grad=True)
    ours = _fw_code(aot_function, _flip, (a, b))
    assert ours == (
        "def forward(self, primals_1, primals_2):\n"
        "    mul = torch.ops.aten.mul.Tensor(primals_1, 3);  primals_1 = None\n"
        "    mul_1 = torch.ops.aten.mul.Tensor(primals_2, 4);  primals_2 = None\n"
        "    return (mul, mul_1)"
    )
    assert ours == _fw_code(torch_aot_function, _flip, (_ones(3, 3), _ones(3, 3, grad=True)))
    # the caller's tensor is a leaf that requires grad, and receives eager's gradient
    a, b = _ones(3, 3), _ones(3, 3, grad=True)
    out, _ = aot_function(_flip, nop)(a, b)
    assert a.requires_grad and a.is_leaf and out.grad_fn is not None
    out.sum().backward()
    torch.testing.assert_close(a.grad, torch.full((3, 3), 3.0))
    # torch's AOTAutograd drops it (when torch fixes this, the test says so)
    a, b = _ones(3, 3), _ones(3, 3, grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, _ = torch_aot_function(_flip, torch_nop)(a, b)
    out.sum().backward()
    assert a.grad is None


def test_second_calls_reuse_or_recompile_by_the_arriving_flag() -> None:
    g = aot_function(_flip, nop)
    b = _ones(3, grad=True)
    for _ in range(2):  # arrives False: one entry, flipped at every call
        a = _arange(3)
        out, _ = g(a, b)
        assert a.requires_grad and a.is_leaf
        out.sum().backward()
        torch.testing.assert_close(a.grad, torch.full((3,), 3.0))
    assert len(g._aotkit_cache.entries) == 1  # type: ignore[attr-defined]
    assert g._aotkit_cache.artifacts[0].requires_grad_changes == ((0,  True),)  # type: ignore[attr-defined]
    a.grad = None
    out, _ = g(a, b)  # the same tensor, now arriving True: another key, no flip to follow
    out.sum().backward()
    torch.testing.assert_close(a.grad, torch.full((3,), 3.0))
    assert len(g._aotkit_cache.entries) == 2  # type: ignore[attr-defined]
    assert g._aotkit_cache.artifacts[1].requires_grad_changes == ()  # type: ignore[attr-defined]


def test_an_entry_compiled_with_a_leaf_rejects_a_non_leaf_as_eager_does() -> None:
    g = aot_function(_unflip, nop)
    a = _arange(3, grad=True)
    g(a, _ones(3, grad=True))
    b = _ones(3, grad=True) * 1  # same key (requires grad), not a leaf
    with pytest.raises(RuntimeError, match="you can only change requires_grad flags of leaf"):
        _unflip(a, b)
    with pytest.raises(RuntimeError, match="you can only change requires_grad flags of leaf"):
        g(a, b)
    assert b.requires_grad


def _mutate_before_flip(a: torch.Tensor) -> torch.Tensor:
    a.mul_(2)
    a.requires_grad_()
    return a * 3


def _view_before_flip(a: torch.Tensor) -> torch.Tensor:
    v = a[1:]
    a.requires_grad_()
    return v * 3


def _use_before_unflip(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    c = a * b
    b.requires_grad_(False)
    return c + b


def _alias_before_flip(a: torch.Tensor) -> torch.Tensor:
    same = a.to(torch.float32)  # ``a`` itself: it follows the flip in eager
    a.requires_grad_()
    return same * 3


USES_BEFORE: list[tuple[str, Callable[..., Any], Make, str]] = [
    ("alias", _alias_before_flip, lambda: (_arange(3),), "TensorBase.to"),
    ("mutation", _mutate_before_flip, lambda: (_arange(3),), "TensorBase.mul_"),
    ("view", _view_before_flip, lambda: (_arange(3),), "TensorBase.__getitem__"),
    ("use before unflip", _use_before_unflip,
     lambda: (_arange(3, grad=True), _ones(3, grad=True)), "TensorBase.mul"),
]


@pytest.mark.parametrize(("fn", "make", "use"), [p[1:] for p in USES_BEFORE],
                         ids=[p[0] for p in USES_BEFORE])
def test_a_use_before_the_change_raises_and_leaves_the_inputs_alone(
    fn: Callable[..., Any], make: Make, use: str
) -> None:
    """A write or a view before a flip, or a use before an unflip: eager's result follows
    the flag in ways a trace with the new flag cannot reproduce (See Note [A use of an
    input before its flip])."""
    fn(*make())  # eager runs it
    args = make()
    before = [(a.detach().clone(), a.requires_grad) for a in args]
    with pytest.raises(InputRebindError, match=rf"input \d \(`{use}`\) before changing its "
                       r"`requires_grad`.*Remedy: change `requires_grad` at the start"):
        aot_function(fn, nop)(*args)
    for a, (value, requires_grad) in zip(args, before, strict=True):
        torch.testing.assert_close(a.detach(), value, rtol=0, atol=0)
        assert a.requires_grad == requires_grad and a.grad is None


def _flip_off_on(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a.requires_grad_()
    y = a * 2
    a.requires_grad_(False)
    a.requires_grad_()
    return y, a * b


def test_a_use_before_the_flip_torch_drops_the_gradient() -> None:
    """The oracle: torch's AOTAutograd traces ``a`` as not requiring grad and drops its
    gradient; eager's (and aotkit's, test_matches_eager) is 1 from the use after the flip."""
    a, b = _arange(3), _ones(3, grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, _ = torch_aot_function(_use_before_flip, torch_nop)(a, b)
    if out.requires_grad:
        out.sum().backward()
    assert a.grad is None
    a = _arange(3)
    out, _ = aot_function(_use_before_flip, nop)(a, _ones(3, grad=True))
    out.sum().backward()
    torch.testing.assert_close(a.grad, torch.ones(3))


def test_a_second_change_of_the_same_input_raises() -> None:
    args = (_arange(3), _ones(3, grad=True))
    _flip_off_on(*(t.detach().clone() for t in args))  # eager runs it
    with pytest.raises(InputRebindError, match="input 0 more than once.*Remedy: change it once"):
        aot_function(_flip_off_on, nop)(*args)
    assert not args[0].requires_grad


class _FlipsItsArgument(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(3.0) + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.requires_grad_()
        return (x * self.w).sin()


class _FreezesItsParameter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(3.0) + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.w.requires_grad_(False)
        return x * self.w


class _UnfreezesParameterAndBuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(3.0) + 1, requires_grad=False)
        self.register_buffer("buf", torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.w.requires_grad_()
        self.buf.requires_grad_()
        return x * self.w * self.buf


@pytest.mark.parametrize("cls", [_FlipsItsArgument, _FreezesItsParameter, _UnfreezesParameterAndBuffer])
def test_aot_module(cls: type[torch.nn.Module]) -> None:
    def run(wrap: Callable[[torch.nn.Module], Any], x_grad: bool) -> tuple[Any, ...]:
        mod = cls()
        x = _arange(3, grad=x_grad)
        seen = _observe(wrap(mod), (x,))
        state = [(n, t.requires_grad, t.grad) for n, t in
                 [*mod.named_parameters(), *mod.named_buffers()]]
        return seen, state

    for x_grad in (False, True):
        expected = run(lambda m: m, x_grad)
        _assert_same(expected, run(lambda m: aot_module(m, nop), x_grad))


def test_aot_module_simplified() -> None:
    gm = torch.fx.symbolic_trace(_flip)
    assert "requires_grad_" in gm.code
    compiled = aot_module_simplified(gm, [_ones(3), _ones(3, grad=True)], fw_compiler=nop)
    for _ in range(2):
        _assert_same(_observe(_flip, (_arange(3), _ones(3, grad=True))),
                     _observe(compiled, (_arange(3), _ones(3, grad=True))))


@pytest.mark.parametrize("fn", [_flip, _unflip], ids=["flip", "unflip"])
def test_torch_compile(fn: Callable[..., Any]) -> None:
    """dynamo applies the change itself, before the graph it hands the backend."""
    import aotkit  # noqa: F401  (registers aotkit_eager)
    import torch._dynamo

    make = (lambda: (_arange(3), _ones(3, grad=True))) if fn is _flip else (
        lambda: (_arange(3, grad=True), _ones(3, grad=True)))
    expected = _observe(fn, make())
    for backend in ("aotkit_eager", "aot_eager"):
        torch._dynamo.reset()
        _assert_same(expected, _observe(torch.compile(fn, backend=backend), make()))
    torch._dynamo.reset()


def test_export_still_raises() -> None:
    from aotkit_frontends import aot_export_joint_simple

    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        x.requires_grad_()
        return (x * y,)

    with pytest.raises(InputRebindError, match="input 0 from False to True.*before exporting"):
        aot_export_joint_simple(fn, [torch.randn(3), torch.randn(3, requires_grad=True)],
                                trace_joint=True)


def test_functions_that_change_no_flag_trace_once() -> None:
    with record_compilations() as compiled:
        aot_function(lambda x, y: x * y, nop)(_arange(3), _ones(3, grad=True))
    assert len(compiled) == 1 and compiled[0].requires_grad_changes == ()


@pytest.mark.parametrize(
    ("fn", "make", "changes"),
    [
        (_flip, lambda: (_arange(3), _ones(3, grad=True)), ((0, True),)),
        (_unflip, lambda: (_arange(3, grad=True), _ones(3, grad=True)), ((1, False),)),
    ],
    ids=["flip", "unflip"],
)
def test_disk_cache_stores_and_restores_the_change(
    fn: Callable[..., Any], make: Make, changes: tuple[tuple[int, bool], ...],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aotkit_cache import cache_counters
    from aotkit_schemas import disk_cache_config, mark_cache_key

    def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        return nop(gm, example_inputs)

    mark_cache_key(compiler, "test.requires_grad_flips/1")
    monkeypatch.setattr(disk_cache_config, "dir", str(tmp_path))
    monkeypatch.setattr(disk_cache_config, "enabled", True)
    expected = _observe(fn, make())
    cache_counters.clear()
    cold = aot_function(fn, compiler)
    _assert_same(expected, _observe(cold, make()))
    assert cache_counters["store"] == 1
    assert cold._aotkit_cache.artifacts[0].requires_grad_changes == changes  # type: ignore[attr-defined]
    cache_counters.clear()
    warm = aot_function(fn, compiler)  # a new function object: its memory cache is empty
    _assert_same(expected, _observe(warm, make()))
    assert dict(cache_counters) == {"hit": 1}
    art = warm._aotkit_cache.artifacts[0]  # type: ignore[attr-defined]
    assert art.from_cache and art.requires_grad_changes == changes

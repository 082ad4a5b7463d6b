"""Programs aotkit used to answer with wrong values in silence (issue 13), each compared with
eager and with torch's AOTAutograd: opaque non-tensor arguments, non-tensor values keyed
by value, ambient state (autocast, default dtype, ...) in the compile key, and tensors
captured by closure or global.

View replay of outputs viewing a mutated non-contiguous input is covered by the corpus
(tests/corpus/layouts.py) and the fuzzer's input layouts.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from aotkit import aot_function, aot_module, nop
from aotkit_capture import CapturedTensorError, UnsupportedInputError
from torch._functorch.aot_autograd import aot_function as torch_aot_function


class Cfg:
    def __init__(self, scale: float) -> None:
        self.scale = scale


def _scaled(x: torch.Tensor, cfg: Cfg) -> torch.Tensor:
    return x * cfg.scale


# ---- opaque non-tensor arguments ------------------------------------------------------


def test_opaque_object_argument_raises_like_torch() -> None:
    with pytest.raises(AssertionError, match="all flat_args must be KNOWN_TYPES"):
        torch_aot_function(_scaled, nop)(torch.ones(2), Cfg(2.0))
    g = aot_function(_scaled, nop)
    with pytest.raises(UnsupportedInputError) as info:
        g(torch.ones(2), Cfg(2.0))
    text = str(info.value)
    assert "all flat_args must be KNOWN_TYPES or opaque types" in text  # torch's words
    assert "argument 1 is a " in text and "Cfg" in text  # position and type
    assert "functools.partial" in text and "as tensors" in text  # the remedies
    assert isinstance(info.value, TypeError) and isinstance(info.value, AssertionError)


def test_opaque_object_in_a_keyword_container_is_named() -> None:
    g = aot_function(lambda x, *, opts: x * opts["a"][1], nop)
    with pytest.raises(UnsupportedInputError, match=r"keyword argument 'opts'\['a'\]\[1\]"):
        g(torch.ones(2), opts={"a": [1, Cfg(2.0)]})


def test_the_remedy_works_and_matches_eager() -> None:
    g = aot_function(functools.partial(_scaled, cfg=Cfg(3.0)), nop)
    torch.testing.assert_close(g(torch.ones(2)), torch.full((2,), 3.0))


@pytest.mark.parametrize(
    ("fn", "values"),
    [
        (lambda x, d: x.to(d), [torch.float16, torch.float64]),
        (lambda x, s: x * s, [0.0, -0.0]),
        (lambda x, s: x * s, [2.0, 3.0]),
        (lambda x, s: x * s.real, [2 + 0j, 3 + 0j]),
        (lambda x, s: x.sum() if s == "sum" else x.mean(), ["sum", "mean"]),
        (lambda x, d: x.to(d), [torch.device("cpu"), torch.device("meta")]),
        (
            lambda x, m: x.contiguous(memory_format=m),
            [torch.contiguous_format, torch.channels_last],
        ),
    ],
)
def test_non_tensor_values_are_keyed_by_value(fn: Any, values: list[Any]) -> None:
    g = aot_function(fn, nop)
    for v in values:
        x = torch.randn(2, 3, 4, 5)
        expected, got = fn(x, v), g(x, v)
        assert got.dtype == expected.dtype and got.device == expected.device
        assert got.stride() == expected.stride()
        if expected.device.type != "meta":
            torch.testing.assert_close(got, expected, equal_nan=True)
            assert torch.equal(torch.signbit(got), torch.signbit(expected))


# ---- ambient state --------------------------------------------------------------------


def test_autocast_region_is_part_of_the_key() -> None:
    g = aot_function(lambda x, w: x @ w, nop)
    x, w = torch.randn(3, 3), torch.randn(3, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert g(x, w).dtype == (x @ w).dtype == torch.bfloat16
    assert g(x, w).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.float16):
        assert g(x, w).dtype == (x @ w).dtype
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        assert g(x, w).dtype == torch.float32


def test_default_dtype_is_part_of_the_key() -> None:
    fn = lambda x: x + torch.ones(3)  # noqa: E731
    g = aot_function(fn, nop)
    x = torch.ones(3, dtype=torch.float16)
    assert g(x).dtype == torch.float32
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert g(x).dtype == fn(x).dtype == torch.float64
    finally:
        torch.set_default_dtype(old)
    assert g(x).dtype == torch.float32


def test_inference_mode_and_deterministic_algorithms_are_part_of_the_key() -> None:
    g = aot_function(lambda x: x * 2, nop)
    assert not g(torch.ones(2)).is_inference()
    with torch.inference_mode():
        assert g(torch.ones(2)).is_inference()
    assert not g(torch.ones(2)).is_inference()
    n = len(g._aotkit_cache.entries)  # type: ignore[attr-defined]
    old = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        g(torch.ones(2))
    finally:
        torch.use_deterministic_algorithms(old)
    assert len(g._aotkit_cache.entries) == n + 1  # type: ignore[attr-defined]
    g(torch.ones(2))
    assert len(g._aotkit_cache.entries) == n + 1  # type: ignore[attr-defined]


def test_autocast_in_aot_module() -> None:
    lin = torch.nn.Linear(3, 3)
    m = aot_module(lin, nop)
    x = torch.randn(2, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert m(x).dtype == lin(x).dtype == torch.bfloat16
    assert m(x).dtype == torch.float32


# ---- tensors captured by closure or global -------------------------------------------

W_GLOBAL = torch.nn.Parameter(torch.randn(3, 3))
COUNTER = torch.zeros(3)


def _uses_global(x: torch.Tensor) -> torch.Tensor:
    return x @ W_GLOBAL


def _mutates_global(x: torch.Tensor) -> torch.Tensor:
    COUNTER.add_(x)
    return x * 2


def _closure() -> Any:
    w = torch.nn.Parameter(torch.randn(3, 3))

    def uses_closure(x: torch.Tensor) -> torch.Tensor:
        return x @ w

    return uses_closure


def _captured_run(fn: Any, requires_grad: bool, user_fn: Any) -> list[torch.Tensor]:
    """Output, input gradient, the captured tensor's gradient and the global counter after
    a call (and its backward)."""
    captured = [t for t in (W_GLOBAL, *_cells(user_fn)) if isinstance(t, torch.Tensor)]
    for t in captured:
        t.grad = None
    x = torch.ones(3, requires_grad=requires_grad)
    out = fn(x)
    got = [out.detach()]
    if requires_grad:
        out.sum().backward()
        got += [x.grad, *(t.grad if t.grad is not None else torch.zeros(0) for t in captured)]
    return [*got, COUNTER.clone()]


def _cells(fn: Any) -> list[Any]:
    return [c.cell_contents for c in (fn.__closure__ or ())]


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("fn", [_uses_global, _mutates_global, _closure()])
def test_captured_tensor_is_lifted_as_an_input(fn: Any, requires_grad: bool) -> None:
    """Global and closure tensors are lifted as inputs (Note [Global tensors lifted as
    inputs]): eager's outputs, gradients (the captured parameter's too) and the mutated
    global, call after call; torch fails with an internal assertion on all of these."""
    with pytest.raises((AssertionError, RuntimeError)):
        torch_aot_function(fn, nop)(torch.ones(3, requires_grad=requires_grad))
    compiled = aot_function(fn, nop)
    for _ in range(2):
        # a leaf again each time: eager's add_ of x gave it x's history
        COUNTER.detach_().zero_()
        eager = _captured_run(fn, requires_grad, fn)
        COUNTER.detach_().zero_()
        torch.testing.assert_close(_captured_run(compiled, requires_grad, fn), eager)
    assert len(compiled._aotkit_cache.entries) == 1


def test_captured_module_parameters_in_aot_module_forward() -> None:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) + W_GLOBAL.sum()

    with pytest.raises(CapturedTensorError) as info:
        aot_module(M(), nop)(torch.ones(3))
    text = str(info.value)
    assert "global 'W_GLOBAL'" in text
    assert "lin.weight" not in text  # the module's own parameters are inputs


# ---- views of a mutated non-contiguous input (fuzzer seeds 1 and 2) --------------------
# See Note [Views see eager's layouts] in aotkit_functional and Note [Fresh inputs keep
# their strides] in aotkit_capture.


def _sliced(requires_grad: bool) -> torch.Tensor:
    torch.manual_seed(0)
    base = torch.randn(3, 4, requires_grad=requires_grad)
    return (base.clone() if requires_grad else base.clone())[1:, 1:]  # stride (4, 1), offset 5


def _mutate_then_view(x: torch.Tensor) -> torch.Tensor:
    x.add_(1.5)
    x.reshape(3, -1)  # a copy in eager (and now in the trace)
    x.view(3, -1)  # eager raises: the rows of x are not adjacent in memory
    return x * 2


@pytest.mark.parametrize("requires_grad", [False, True])
def test_invalid_view_of_a_mutated_sliced_input_raises_as_eager(requires_grad: bool) -> None:
    with pytest.raises(RuntimeError, match="view size is not compatible") as eager:
        _mutate_then_view(_sliced(requires_grad))
    x = _sliced(requires_grad)
    before = x.detach().clone()
    with pytest.raises(RuntimeError) as got:
        aot_function(_mutate_then_view, nop)(x)
    assert str(got.value) == str(eager.value)
    assert torch.equal(x.detach(), before)  # raised at compile time: nothing half-done


def _mutate_then_reshape(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x.add_(1.5)
    a = x.reshape(2, -1)
    b = a.reshape(6, -1)
    return b.reshape(2, -1), b


def test_reshape_of_a_mutated_sliced_input_that_requires_grad_copies_as_eager() -> None:
    # The joint trace runs on a clone of the input (autograd needs the value before the
    # mutation); a plain ``clone()`` made the sliced input contiguous, reshape traced as a
    # view of it, and the joint's backward failed to broadcast (2, 6) into (2, 3, 2).
    def make() -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        leaf = torch.randn(3, 4, 3, requires_grad=True)
        return leaf, leaf.clone()[1:, 1:, 1:]

    leaf_e, x_e = make()
    expected = _mutate_then_reshape(x_e)
    (expected[0].sum() + expected[1].sum()).backward()
    leaf_g, x_g = make()
    got = aot_function(_mutate_then_reshape, nop)(x_g)
    (got[0].sum() + got[1].sum()).backward()
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e)
        assert (g.stride(), g.storage_offset(), g._is_view()) == (
            e.stride(), e.storage_offset(), e._is_view()
        )
        assert g.untyped_storage().data_ptr() != x_g.untyped_storage().data_ptr()  # copies
    torch.testing.assert_close(x_g, x_e)
    assert leaf_e.grad is not None and leaf_g.grad is not None
    torch.testing.assert_close(leaf_g.grad, leaf_e.grad)


def test_view_eager_would_copy_after_a_mutation_raises_naming_the_fix() -> None:
    # Known limitation: a view of the mutated sliced input has the functional value's
    # (contiguous) strides in the trace, so ``reshape`` on it traces as a view where eager
    # copies. aotkit raises rather than return the trace's aliasing.
    def f(x: torch.Tensor) -> torch.Tensor:
        x.add_(1.5)
        return x.view(2, 3).reshape(-1)

    f(_sliced(False))  # eager copies
    with pytest.raises(RuntimeError, match=r"Call \.contiguous\(\) on the input") as info:
        aot_function(f, nop)(_sliced(False))
    assert "eager's size (2, 3), stride (4, 1)" in str(info.value)
    x = _sliced(False).contiguous()
    torch.testing.assert_close(aot_function(f, nop)(x.clone()), f(x.clone()))


def test_write_into_an_expanded_input_raises_before_touching_it() -> None:
    # See Note [Writes into an input whose elements share memory] (fuzzer seed 2)
    def f(x: torch.Tensor) -> torch.Tensor:
        x[:1].add_(1.5)
        return x * 2

    x = torch.ones(1).expand(4)
    with pytest.raises(RuntimeError, match="whose elements share memory") as info:
        aot_function(f, nop)(x)
    assert "x.contiguous() or x.clone()" in str(info.value)
    assert torch.equal(x, torch.ones(4))
    y = torch.ones(4)
    torch.testing.assert_close(aot_function(f, nop)(y.clone()), f(y.clone()))

"""Outputs that view an input or an intermediate, when the compiled graph's values hide
their view base (a compiler's Tensor subclass whose ``_base`` and ``_view_func`` are None,
as torch's suite ``*_view_meta_replay`` tests do): aotkit rebuilds them with eager's view
grad_fn, values, strides and storage (See Note [View replay of intermediate aliases]), and
never reaches a bare assertion."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import torch
from aotkit import aot_function


class NoViewReplayTensor(torch.Tensor):
    @property
    def _base(self) -> Any:  # type: ignore[override]
        return None

    @property
    def _view_func(self) -> Any:
        return None


def _erasing(*indices: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrapper(g: Any, *args: Any) -> tuple[Any, ...]:
        outs = list(g(*args))
        for i in indices:
            outs[i] = NoViewReplayTensor(outs[i])
        return tuple(outs)

    return lambda f: aot_function(
        f, fw_compiler=lambda g, _: partial(wrapper, g), bw_compiler=lambda g, _: g
    )


def view_of_input(a: torch.Tensor) -> tuple[torch.Tensor]:
    return (a.view(-1),)


def two_views_of_intermediate(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b = a.clone()
    return b.view(-1), b.view(-1)


def intermediate_and_its_view(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b = a.add(10)
    return b, b.view(-1)


def transposed_views_of_intermediate(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b = a * 3
    return b.t()[1:], b[:, 1:].unsqueeze(0)


def view_of_transposed_intermediate(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b = a * 3
    b.t_()  # an in-place view of the base: its chain is not from the storage's root
    return b, b[1:]


# (function, erased output indices, eager's view grad_fn expected): after an in-place view
# of the base (``t_``) no chain is recorded, and a hidden base leaves only ``as_strided``
# (AsStridedBackward0: same values, strides and gradients, another grad_fn class)
CASES = [
    (view_of_input, (0,), True),
    (two_views_of_intermediate, (0, 1), True),
    (intermediate_and_its_view, (1,), True),
    (transposed_views_of_intermediate, (0, 1), True),
    (view_of_transposed_intermediate, (1,), False),
]


@pytest.mark.parametrize(("fn", "erased", "exact"), CASES, ids=[c[0].__name__ for c in CASES])
def test_hidden_bases_are_rebuilt_as_eager(fn: Any, erased: tuple[int, ...], exact: bool) -> None:
    base = torch.arange(12.0).reshape(3, 4)
    x_eager = base.clone().requires_grad_()
    x_aot = base.clone().requires_grad_()
    expected = fn(x_eager)
    got = _erasing(*erased)(fn)(x_aot)
    assert len(got) == len(expected)
    for e, g in zip(expected, got, strict=True):
        assert type(g) is torch.Tensor
        assert torch.equal(e, g)
        assert g.stride() == e.stride()
        assert g.storage_offset() == e.storage_offset()
        assert g.requires_grad == e.requires_grad
        assert g._is_view() == e._is_view()
        if e._is_view():
            want = type(e.grad_fn).__name__ if exact else "AsStridedBackward0"
            assert type(g.grad_fn).__name__ == want
    # aliasing between outputs as in eager
    for i in range(len(got)):
        for j in range(len(got)):
            same_e = expected[i].untyped_storage().data_ptr() == expected[j].untyped_storage().data_ptr()
            same_g = got[i].untyped_storage().data_ptr() == got[j].untyped_storage().data_ptr()
            assert same_e == same_g
    sum(o.sum() * (k + 1) for k, o in enumerate(expected)).backward()
    sum(o.sum() * (k + 1) for k, o in enumerate(got)).backward()
    assert x_eager.grad is not None and x_aot.grad is not None
    assert torch.equal(x_eager.grad, x_aot.grad)


def test_torch_suite_expectations() -> None:
    """torch's suite test_output_aliases_{input,intermediate,output}_view_meta_replay."""
    out = _erasing(0)(view_of_input)(torch.ones(2, 2, requires_grad=True))[0]
    assert str(out.grad_fn.__class__) == "<class 'ViewBackward0'>"
    out1, out2 = _erasing(0, 1)(two_views_of_intermediate)(torch.ones(2, 2, requires_grad=True))
    assert str(out1.grad_fn.__class__) == "<class 'ViewBackward0'>"
    assert str(out2.grad_fn.__class__) == "<class 'ViewBackward0'>"
    b, v = _erasing(1)(intermediate_and_its_view)(torch.ones(2, 2, requires_grad=True))
    assert b.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    assert str(v.grad_fn.__class__) == "<class 'ViewBackward0'>"

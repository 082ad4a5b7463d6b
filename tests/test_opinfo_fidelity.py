"""Cases from torch's TestEagerFusionOpInfo (``test_aot_autograd_exhaustive`` over op_db)
that aotkit got wrong while torch's AOTAutograd passes.

Each case runs an op eagerly, through aotkit and through torch's AOTAutograd (the oracle),
with the same settings ``torch.testing._internal.optests.aot_autograd_check`` uses
(``compiled_function``, nop compilers, min-cut partitioner, kept inference mutations), and
compares outputs (values, conjugate/negative bits, strides) and gradients with eager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aotkit
import functorch.compile as torch_compile
import pytest
import torch


def _compile(api: Any, f: Callable[..., Any]) -> Callable[..., Any]:
    return api.compiled_function(
        f,
        api.nop,
        api.nop,
        partition_fn=api.min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,
    )


def _outs_and_grads(f: Callable[..., Any], x: torch.Tensor) -> tuple[list[torch.Tensor], Any]:
    out = f(x)
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    if not torch.is_grad_enabled():
        return outs, None
    total = sum(o.sum().abs() for o in outs)
    assert isinstance(total, torch.Tensor)
    return outs, torch.autograd.grad(total, [x], allow_unused=True)


def _check_three_ways(f: Callable[..., Any], make_input: Callable[[], torch.Tensor], grad: bool) -> None:
    with torch.set_grad_enabled(grad):
        ref_outs, ref_grads = _outs_and_grads(f, make_input())
        for api in (aotkit, torch_compile):
            outs, grads = _outs_and_grads(_compile(api, f), make_input())
            for got, ref in zip(outs, ref_outs, strict=True):
                # values the user reads (assert_close compares resolved values)
                torch.testing.assert_close(got, ref)
                assert got.is_conj() == ref.is_conj(), api.__name__
                assert got.is_neg() == ref.is_neg(), api.__name__
                assert got.shape == ref.shape and got.stride() == ref.stride(), api.__name__
            if ref_grads is not None:
                torch.testing.assert_close(grads, ref_grads)


def _real_input(shape: tuple[int, ...]) -> Callable[[], torch.Tensor]:
    def make() -> torch.Tensor:
        g = torch.Generator().manual_seed(0)
        return torch.randn(*shape, generator=g).requires_grad_(True)

    return make


def _complex_input() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(3, 4, dtype=torch.cfloat, generator=g).requires_grad_(True)


# See Note [Conjugate and negative bits of aliases] in aotkit_functional: an output that
# is a lazy-conjugate (or lazy-negative) view of a graph intermediate lost its bit when
# the runtime turned it into a plain tensor, and came back with the unconjugated values.
CASES: dict[str, tuple[Callable[..., Any], Callable[[], torch.Tensor]]] = {
    # op_db fft.ifft sample 0: _conj(_fft_r2c(pad(x)))
    "fft_ifft_real_input": (lambda x: torch.fft.ifft(x, n=10, dim=1, norm="ortho"), _real_input((5, 6, 7))),
    "fft_ihfft": (lambda x: torch.fft.ihfft(x, dim=0), _real_input((6, 5))),
    "fft_ihfftn": (lambda x: torch.fft.ihfftn(x), _real_input((4, 5, 6))),
    "conj_view_of_intermediate": (lambda x: (x * 2).conj().t(), _complex_input),
    "neg_view_of_intermediate": (lambda x: torch._neg_view(x * 2)[1:], _real_input((3, 4))),
}


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_lazy_bit_outputs_match_eager(name: str, grad: bool) -> None:
    f, make_input = CASES[name]
    _check_three_ways(f, make_input, grad)


def test_a_sparse_output_takes_a_sparse_gradient_as_eager() -> None:
    """``to_sparse`` (op_db ``to_sparse``, xfailed upstream: torch's AOTAutograd raises on
    the forward). aotkit's forward ran; its backward raised "unsupported memory format
    option Contiguous" on the sparse gradient autograd hands it. See Note [Sparse tangents].
    """

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.to_sparse()

    x = torch.randn(3, 4, requires_grad=True)
    expected = f(x)
    (eager_grad,) = torch.autograd.grad(expected.to_dense().sum() * 2, [x])
    out = _compile(aotkit, f)(x)
    assert out.layout == expected.layout == torch.sparse_coo
    assert torch.equal(out.to_dense(), expected.to_dense())
    assert out.requires_grad
    # autograd gives the output a sparse gradient (the backward of ``to_dense``)
    (grad,) = torch.autograd.grad(out.to_dense().sum() * 2, [x])
    assert grad.layout == eager_grad.layout == torch.strided
    torch.testing.assert_close(grad, eager_grad, rtol=0, atol=0)
    with pytest.raises(NotImplementedError, match="SparseCPU"):
        _compile(torch_compile, f)(x)

"""aotkit_tracing on its own: the joint and inference traces of a flat function over fake
inputs, the tracing-error translation and the HOP error (no pipeline, no compiler)."""

from __future__ import annotations

from typing import Any

import aotkit_tracing
import pytest
import torch
from aotkit_analysis import collect_metadata
from aotkit_tracing import (
    AOTCompileError,
    UnsupportedHigherOrderOperatorError,
    explain_tracing_errors,
    trace_inference,
    trace_joint,
)
from aotkit_tracing._errors import unsupported_hop_error
from torch._subclasses.fake_tensor import FakeTensorMode


def _f(x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    return [(x @ w).tanh().sum()]


def _fakes(mode: FakeTensorMode, *reals: torch.Tensor) -> list[Any]:
    return [mode.from_tensor(r) for r in reals]


def _placeholders(gm: torch.fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op == "placeholder"]


def test_joint_graph_takes_primals_then_tangents_and_returns_input_grads() -> None:
    mode = FakeTensorMode()
    x, w = torch.randn(4, 3), torch.randn(3, 2, requires_grad=True)
    with mode:
        fake = _fakes(mode, x, w)
        meta, _ = collect_metadata(_f, fake, keep_input_mutations=False, is_train=True)
        gm, (primals, tangents) = trace_joint(_f, fake, meta, {})
    assert _placeholders(gm) == ["primals_1", "primals_2", "tangents_1"]
    assert len(primals) == 2 and len(tangents) == 1
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    returns = out.args[0]
    # the forward's return, then one gradient per primal: None for x, which needs none
    assert len(returns) == 3 and returns[1] is None and returns[2] is not None
    assert returns[2].meta["val"].shape == w.shape
    # the traced joint computes eager's values and gradient on real inputs
    loss, _, grad_w = gm([x, w.detach()], [torch.ones(())])
    w_eager = w.detach().clone().requires_grad_(True)
    (eager,) = _f(x, w_eager)
    eager.backward()  # type: ignore[no-untyped-call]
    torch.testing.assert_close(loss, eager.detach())
    torch.testing.assert_close(grad_w, w_eager.grad)


def test_inference_graph_takes_primals_only() -> None:
    mode = FakeTensorMode()
    x, w = torch.randn(4, 3), torch.randn(3, 2)
    with mode:
        fake = _fakes(mode, x, w)
        meta, _ = collect_metadata(_f, fake, keep_input_mutations=False, is_train=False)
        gm = trace_inference(_f, fake, meta, {})
    # one placeholder per input (the pipeline names them primals_N afterwards)
    assert len(_placeholders(gm)) == 2
    (out,) = gm(x, w)
    torch.testing.assert_close(out, _f(x, w)[0])


def test_a_hop_without_a_rule_is_named_with_the_remedy() -> None:
    e = NotImplementedError(
        "There was no rule registered for HigherOrderOperator my_hop and mode "
        "<torch._subclasses.functional_tensor.FunctionalTensorMode object at 0x7f>"
    )
    err = unsupported_hop_error(e)
    assert isinstance(err, UnsupportedHigherOrderOperatorError)
    assert isinstance(err, AOTCompileError) and isinstance(err, NotImplementedError)
    assert err.hop == "my_hop"
    assert "my_hop.py_impl(FunctionalTensorMode)" in str(err)
    assert unsupported_hop_error(NotImplementedError("something else")) is None
    with pytest.raises(UnsupportedHigherOrderOperatorError) as info:
        with explain_tracing_errors():
            raise e
    assert info.value.__cause__ is e


def test_public_api_is_exported() -> None:
    for name in aotkit_tracing.__all__:
        assert hasattr(aotkit_tracing, name), name

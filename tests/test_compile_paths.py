"""Which tracing path a compilation takes, and why (Note [Why a graph took the path it
took]): the reasons record_compilations reports, and the single pass under torch.compile
against the two-pass flow (same joint graph, same training result)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aotkit
import aotkit_capture.compile._compile as compile_module
import pytest
import torch
import torch._dynamo
import torch.nn as nn
from _small_models import attention as _attention
from _small_models import convnet as _convnet
from _small_models import fresh_dynamo  # noqa: F401  (autouse fixture)
from _small_models import mlp as _mlp
from aotkit_capture import CompiledArtifacts, record_compilations

# (name, model, input, the two-pass flow's path: BatchNorm's running stats are input
# mutations, which the native joint trace leaves to the Python mode)
MODELS: list[tuple[str, Callable[[], nn.Module], Callable[[], torch.Tensor], str]] = [
    ("mlp", _mlp, lambda: torch.randn(4, 8), "native"),
    ("convnet", _convnet, lambda: torch.randn(2, 3, 6, 6), "python"),
    ("attention", _attention, lambda: torch.randn(2, 5, 8), "native"),
]


def _compile_and_train(
    make: Callable[[], nn.Module], x: torch.Tensor, **compile_kwargs: Any
) -> tuple[list[CompiledArtifacts], torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make().train()
    with record_compilations() as records:
        out = torch.compile(model, backend="aotkit_eager", **compile_kwargs)(x)
        out.sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return list(records), out.detach(), grads, [b.clone() for b in model.buffers()]


@pytest.mark.parametrize("name,make,make_input,two_pass_path", MODELS, ids=[m[0] for m in MODELS])
def test_static_shapes_under_torch_compile_take_the_single_pass(
    name: str,
    make: Callable[[], nn.Module],
    make_input: Callable[[], torch.Tensor],
    two_pass_path: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # dynamo's fake mode always carries a ShapeEnv; with static shapes it does not stop the
    # single pass, which must trace the joint the two-pass flow traces and train the same
    x = make_input()
    records, out, grads, buffers = _compile_and_train(make, x)
    assert [r.path for r in records] == ["single pass"], [r.path_reason for r in records]
    assert records[0].path_reason is None
    monkeypatch.setattr(compile_module, "single_pass_blocker", lambda *a: "forced")
    two_pass, out2, grads2, buffers2 = _compile_and_train(make, x)
    assert [r.path for r in two_pass] == [two_pass_path]
    assert two_pass[0].single_pass_skipped == "forced"
    joint, joint2 = records[0].joint_module, two_pass[0].joint_module
    assert joint is not None and joint2 is not None
    assert joint.code == joint2.code
    assert torch.equal(out, out2)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads2, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(buffers, buffers2, strict=True))


def test_dynamic_shapes_name_the_reason() -> None:
    records, *_ = _compile_and_train(_mlp, torch.randn(4, 8), dynamic=True)
    (r,) = records
    assert r.path == "native"
    assert r.single_pass_skipped == "dynamic shapes"
    assert r.path_reason == "not single pass: dynamic shapes"


def test_an_aliased_output_names_the_reason() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * w
        return y, y.view(-1)

    w = torch.randn(3, requires_grad=True)
    with record_compilations() as records:
        aotkit.aot_function(f, aotkit.nop)(torch.randn(2, 3), w)
    (r,) = records
    assert r.path == "python"
    assert r.single_pass_skipped == "an output aliases an input or another output"
    assert r.native_skipped == "an output is an alias"


def test_an_op_the_python_mode_rewrites_is_named() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        mean, var = torch.zeros(3), torch.ones(3)
        out: torch.Tensor = torch.ops.aten.native_batch_norm(
            x, w, None, mean, var, True, 0.1, 1e-5
        )[0]
        return out

    w = torch.randn(3, requires_grad=True)
    with record_compilations() as records:
        aotkit.aot_function(f, aotkit.nop)(torch.randn(4, 3), w)
    (r,) = records
    assert r.path == "python"
    op = "aten.native_batch_norm.default"
    assert r.single_pass_skipped == f"{op} needs the Python functionalization mode"
    assert r.native_skipped == f"{op} needs the Python functionalization mode"


def test_inference_and_nested_recorders() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin()

    with record_compilations() as outer:
        with record_compilations() as inner:
            aotkit.aot_function(f, aotkit.nop)(torch.randn(3))
        aotkit.aot_function(f, aotkit.nop)(torch.randn(3, requires_grad=True))
    assert [r.path for r in inner] == ["inference"]
    assert inner[0].path_reason == "no input requires grad"
    assert [r.path for r in outer] == ["inference", "single pass"]


@pytest.mark.parametrize(
    "view",
    [
        lambda y: y.t(),
        lambda y: y.view(-1),
        lambda y: y[1:],
        lambda y: y.detach()[0],  # a view that does not require grad: non_alias
    ],
    ids=["t", "view", "slice", "detached"],
)
def test_a_view_of_an_intermediate_takes_the_single_pass(
    view: Callable[[torch.Tensor], torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GPT-2's graph before its graph break returns ``hidden_states.view(...)``: the only
    # output viewing an intermediate is classified as the metadata pass does (Note [Output
    # aliasing kinds]), with the same joint, outputs and gradients as the two-pass flow
    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x @ w
        return view(y), (y * 2).sum()

    def run() -> tuple[list[CompiledArtifacts], list[torch.Tensor], list[torch.Tensor | None]]:
        x = torch.randn(3, 4)
        w = torch.randn(4, 3, requires_grad=True)
        with record_compilations() as records:
            outs = aotkit.aot_function(f, aotkit.nop)(x, w)
        sum(o.sum() for o in outs if o.requires_grad).backward()
        return list(records), list(outs), [w.grad]

    torch.manual_seed(0)
    single, outs, grads = run()
    assert [r.path for r in single] == ["single pass"], [r.path_reason for r in single]
    monkeypatch.setattr(compile_module, "single_pass_blocker", lambda *a: "forced")
    torch.manual_seed(0)
    two_pass, outs2, grads2 = run()
    assert two_pass[0].single_pass_skipped == "forced"
    assert single[0].meta.output_info == two_pass[0].meta.output_info
    joint, joint2 = single[0].joint_module, two_pass[0].joint_module
    assert joint is not None and joint2 is not None
    assert joint.code == joint2.code
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    w = torch.randn(4, 3, requires_grad=True)
    eager = f(x, w)
    for a, b, e in zip(outs, outs2, eager, strict=True):
        assert torch.equal(a, b) and torch.equal(a, e)
        assert a.stride() == b.stride() == e.stride()
        assert a.storage_offset() == b.storage_offset()
        assert a._is_view() == b._is_view()
        assert a.requires_grad == b.requires_grad == e.requires_grad
    assert all(torch.equal(a, b) for a, b in zip(grads, grads2, strict=True))  # type: ignore[arg-type]

"""compile_flat and the traces on their own, without the frontends that flatten pytrees."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from aotkit_backends import nop
from aotkit_capture import (
    AOTCompileError,
    compile_flat,
    get_aot_compilation_context,
    trace_for_export,
)
from aotkit_partitioners import default_partition
from aotkit_schemas import AOTConfig, MutationType


def _config(compiler: Callable[..., Any] = nop, **overrides: Any) -> AOTConfig:
    fields: dict[str, Any] = dict(
        fw_compiler=compiler,
        bw_compiler=compiler,
        inference_compiler=compiler,
        partition_fn=default_partition,
        decompositions={},
        num_params_buffers=0,
        aot_id=7,
        keep_inference_input_mutations=False,
    )
    fields.update(overrides)
    return AOTConfig(**fields)


def test_training_program_matches_eager_and_names_placeholders() -> None:
    seen: dict[str, torch.fx.GraphModule] = {}

    def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        [name] = get_aot_compilation_context()[0]
        seen[name] = gm
        return nop(gm, example_inputs)

    def flat_fn(x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
        return [(x @ w).tanh().sum()]

    x, w = torch.randn(4, 3), torch.randn(3, 2, requires_grad=True)
    runner, artifacts = compile_flat(flat_fn, [x, w], _config(compiler))
    [loss] = runner([x, w])
    loss.backward()
    w_ref = w.detach().clone().requires_grad_(True)
    [ref] = flat_fn(x, w_ref)
    torch.autograd.backward(ref)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(w.grad, w_ref.grad)
    assert artifacts.meta.is_train and artifacts.single_pass
    fw_names = [n.name for n in seen["7_forward"].graph.find_nodes(op="placeholder")]
    assert fw_names == ["primals_1", "primals_2"]
    bw_names = [n.name for n in seen["7_backward"].graph.find_nodes(op="placeholder")]
    assert bw_names[-1] == "tangents_1"


def test_buffer_mutation_is_applied_after_the_graph() -> None:
    def flat_fn(buf: torch.Tensor, x: torch.Tensor) -> list[torch.Tensor]:
        buf.add_(1)
        return [x * buf]

    buf, x = torch.zeros(3), torch.randn(3, requires_grad=True)
    runner, artifacts = compile_flat(flat_fn, [buf, x], _config())
    [out] = runner([buf, x])
    assert artifacts.meta.input_info[0].mutation_type == MutationType.MUTATED_OUT_GRAPH
    torch.testing.assert_close(buf, torch.ones(3))
    torch.testing.assert_close(out, x * 1)
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(3))


def test_an_output_aliasing_an_input_takes_the_two_pass_flow() -> None:
    def flat_fn(x: torch.Tensor) -> list[torch.Tensor]:
        return [x.t(), x.sin()]

    x = torch.randn(2, 3, requires_grad=True)
    runner, artifacts = compile_flat(flat_fn, [x], _config())
    alias, out = runner([x])
    assert not artifacts.single_pass
    assert alias._base is x and alias.shape == (3, 2)
    (alias.sum() + out.sum()).backward()
    torch.testing.assert_close(x.grad, 1 + x.detach().cos())


def test_inference_when_nothing_requires_grad() -> None:
    compiled: list[str] = []

    def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        compiled.append(get_aot_compilation_context()[0][0])
        return nop(gm, example_inputs)

    runner, artifacts = compile_flat(lambda x: [x.sin() + 1], [torch.randn(5)], _config(compiler))
    x = torch.randn(5)
    [out] = runner([x])
    torch.testing.assert_close(out, x.sin() + 1)
    assert not artifacts.meta.is_train and compiled == ["7_inference"]


def test_data_dependent_control_flow_is_a_clear_error() -> None:
    def flat_fn(x: torch.Tensor) -> list[torch.Tensor]:
        return [x * 2 if x.sum() > 0 else x]

    with pytest.raises(AOTCompileError, match="data-dependent"):
        compile_flat(flat_fn, [torch.randn(3)], _config())


def test_export_trace_of_a_joint() -> None:
    def flat_fn(w: torch.Tensor, x: torch.Tensor) -> list[torch.Tensor]:
        return [(x * w).sum()]

    w, x = torch.randn(3, requires_grad=True), torch.randn(3)
    traced = trace_for_export(flat_fn, [w, x], _config(num_params_buffers=1, is_export=True))
    assert traced.meta.is_train
    placeholders = [n.name for n in traced.graph.graph.find_nodes(op="placeholder")]
    assert placeholders == ["primals_1", "primals_2", "tangents_1"]
    targets = {n.target for n in traced.graph.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.mul.Tensor in targets

    with torch.no_grad():
        inference = trace_for_export(flat_fn, [w, x], _config(num_params_buffers=1, is_export=True))
    assert not inference.meta.is_train

"""Unit tests for Note [Shape guards]: ShapeGuard and caller-owned fake modes."""

from __future__ import annotations

from typing import Any

import torch
from aotkit_analysis import compute_input_layout
from aotkit_backends import nop
from aotkit_capture import ShapeGuard, compile_flat
from aotkit_partitioners import default_partition
from aotkit_schemas import AOTConfig
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv


def _fake(shape_env: ShapeEnv, *tensors: torch.Tensor) -> list[Any]:
    mode = FakeTensorMode(shape_env=shape_env)
    return [mode.from_tensor(t) for t in tensors]


def test_guard_checks_specialized_and_ranged_sizes() -> None:
    env = ShapeEnv(duck_shape=False)
    x, one = _fake(env, torch.randn(5, 3), torch.randn(1, 3))
    n = env.create_symintnode(env.create_symbol(7, ConstantSource("n")), hint=7)
    assert x.shape[0] > 4  # bool() of the SymBool records the guard s0 > 4
    layout = compute_input_layout([x, one, n])
    guard = ShapeGuard.build(env, [x, one, n], range(3), layout)
    assert guard([torch.randn(6, 3), torch.randn(1, 3), 3])
    assert not guard([torch.randn(4, 3), torch.randn(1, 3), 3])  # branch
    assert not guard([torch.randn(6, 3), torch.randn(2, 3), 3])  # 0/1 specialization
    assert not guard([torch.randn(6, 3), torch.randn(1, 3), 1])  # int range [2, oo)
    assert not guard([torch.randn(6, 3).t().contiguous().t(), torch.randn(1, 3), 3])  # strides
    assert "5 <= L['t0'].size()[0]" in guard.failures([torch.randn(4, 3), torch.randn(1, 3), 3])


def test_compile_flat_reuses_a_fake_mode_with_shape_env() -> None:
    """dynamo's case: fake inputs whose mode has a ShapeEnv. compile_flat traces in that
    mode, with its symbols, and leaves guarding to the caller."""
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    x = mode.from_tensor(torch.randn(6, 4))
    w = mode.from_tensor(torch.randn(4, 2), static_shapes=True)
    w.requires_grad_(True)
    seen: list[torch.fx.GraphModule] = []

    def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        seen.append(gm)
        return nop(gm, example_inputs)

    def flat_fn(w: torch.Tensor, x: torch.Tensor) -> list[torch.Tensor]:
        return [(x @ w).relu().sum(0) / x.shape[0]]

    cfg = AOTConfig(
        fw_compiler=compiler,
        bw_compiler=compiler,
        inference_compiler=compiler,
        partition_fn=default_partition,
        decompositions={},
        num_params_buffers=1,
        aot_id=0,
        keep_inference_input_mutations=False,
        dynamic_shapes=True,
    )
    runner, artifacts = compile_flat(flat_fn, [w, x], cfg)
    assert artifacts.guard is None
    fw = seen[0]
    x_val = list(fw.graph.find_nodes(op="placeholder"))[1].meta["val"]
    assert x_val.fake_mode is mode and isinstance(x_val.shape[0], torch.SymInt)
    real_w = torch.randn(4, 2, requires_grad=True)
    for n in (3, 6, 11):
        real_x = torch.randn(n, 4)
        [out] = runner([real_w, real_x])
        torch.testing.assert_close(out, flat_fn(real_w, real_x)[0])

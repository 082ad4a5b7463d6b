"""Activation-checkpointing tags (meta['recompute']) are honoured by the partitioners."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from aotkit_partitioners import (
    default_partition,
    min_cut_rematerialization_partition,
    partition_report,
)
from aotkit_partitioners._tracing import make_joint, run_joint, run_partition
from aotkit_schemas import Partitioner
from torch.utils.checkpoint import CheckpointPolicy

aten = torch.ops.aten


def _check(
    f: Callable[..., torch.Tensor],
    partition: Partitioner,
    policy: CheckpointPolicy,
    tag: Callable[[torch.fx.Node], bool],
) -> tuple[list[str], tuple[str, ...]]:
    traced = make_joint(
        f, (torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True))
    )
    for node in traced.gm.graph.nodes:
        if node.op == "call_function" and tag(node):
            node.meta["recompute"] = policy
    fw, bw = partition(traced.gm, traced.inputs, num_fwd_outputs=1)
    torch.testing.assert_close(run_partition(fw, bw, 1, traced.inputs, 2), run_joint(traced))
    report = partition_report(fw, bw, 1)
    return [name for name, _ in report.saved_tensors], report.recomputed_node_names


@pytest.mark.parametrize("partition", [default_partition, min_cut_rematerialization_partition])
def test_checkpointed_region_saves_only_its_inputs(partition: Partitioner) -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x @ w).relu().sin().sum()

    forward = {"mm", "relu", "alias", "sin"}
    saved, recomputed = _check(
        f, partition, CheckpointPolicy.MUST_RECOMPUTE, lambda n: n.name in forward
    )
    assert saved == ["primals_1", "primals_2"]
    assert {"mm", "relu"} <= set(recomputed)


def test_must_save_is_not_recomputed() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x.sin().cos() * w).sum()

    saved, recomputed = _check(
        f, min_cut_rematerialization_partition, CheckpointPolicy.MUST_SAVE, lambda n: False
    )
    assert "sin" in recomputed and "sin" not in saved
    saved, recomputed = _check(
        f,
        min_cut_rematerialization_partition,
        CheckpointPolicy.MUST_SAVE,
        lambda n: n.target is aten.sin.default,
    )
    assert "sin" in saved and "sin" not in recomputed

from __future__ import annotations

import pytest
from aotkit_partitioners import (
    memory_budget_partition,
    min_cut_rematerialization_partition,
    partition_report,
)
from aotkit_partitioners._corpus import traced_case

BUDGETS = [1.0, 0.9, 0.75, 0.6, 0.5, 0.4, 0.25, 0.1, 0.0]


def _bytes(case: str, budget: float, solver: str) -> int:
    traced = traced_case(case)
    part = memory_budget_partition(budget, solver=solver)  # type: ignore[arg-type]
    fw, bw = part(traced.gm, traced.inputs, num_fwd_outputs=traced.num_fwd_outputs)
    return partition_report(fw, bw, traced.num_fwd_outputs).saved_bytes


@pytest.mark.parametrize("solver", ["greedy", "milp"])
@pytest.mark.parametrize("case", ["mlp", "norms", "conv_bn"])
def test_bytes_monotone_over_budget_sweep(case: str, solver: str) -> None:
    sweep = [_bytes(case, b, solver) for b in BUDGETS]
    assert sweep == sorted(sweep, reverse=True), sweep
    assert sweep[-1] < sweep[0]


@pytest.mark.parametrize("case", ["mlp", "conv_bn"])
def test_endpoints(case: str) -> None:
    traced = traced_case(case)
    n = traced.num_fwd_outputs
    fw, bw = min_cut_rematerialization_partition(traced.gm, traced.inputs, num_fwd_outputs=n)
    assert _bytes(case, 1.0, "greedy") == partition_report(fw, bw, n).saved_bytes
    fw0, bw0 = memory_budget_partition(0.0)(traced.gm, traced.inputs, num_fwd_outputs=n)
    saved = [name for name, _ in partition_report(fw0, bw0, n).saved_tensors]
    assert saved and all(name.startswith("primals_") for name in saved)


def test_budget_validation() -> None:
    with pytest.raises(ValueError):
        memory_budget_partition(1.5)
    with pytest.raises(ValueError):
        memory_budget_partition(0.5, solver="exact")  # type: ignore[arg-type]


def test_call_time_override() -> None:
    traced = traced_case("conv_bn")
    part = memory_budget_partition(1.0)
    fw, bw = part(traced.gm, traced.inputs, num_fwd_outputs=1, memory_budget=0.0)
    assert partition_report(fw, bw, 1).saved_bytes == _bytes("conv_bn", 0.0, "greedy")

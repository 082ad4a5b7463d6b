"""The public surface is deliberate: changing a name or signature must change this file."""

from __future__ import annotations

import inspect

import aotkit_partitioners
import aotkit_partitioners.testing

PUBLIC = [
    "ENTRY_POINT_GROUP",
    "MemoryBudgetPartitioner",
    "PartitionError",
    "PartitionReport",
    "UnknownPartitionerError",
    "available_partitioners",
    "cse",
    "default_partition",
    "get_partitioner",
    "memory_budget_partition",
    "min_cut_rematerialization_partition",
    "partition_region_boundaries",
    "partition_report",
    "region_partition_count",
    "register_partitioner",
    "unregister_partitioner",
]


def _sig(fn: object) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]  # type: ignore[arg-type]


def test_all_is_pinned() -> None:
    assert aotkit_partitioners.__all__ == PUBLIC
    assert "PartitionerConformance" in aotkit_partitioners.testing.__all__


def test_partitioner_signatures() -> None:
    P = inspect.Parameter
    head = [("joint_module", P.POSITIONAL_OR_KEYWORD), ("joint_inputs", P.POSITIONAL_OR_KEYWORD)]
    assert _sig(aotkit_partitioners.default_partition) == [
        *head,
        ("num_fwd_outputs", P.KEYWORD_ONLY),
        ("static_lifetime_input_indices", P.KEYWORD_ONLY),
        ("functionalize_rng", P.KEYWORD_ONLY),
        ("kwargs", P.VAR_KEYWORD),
    ]
    assert _sig(aotkit_partitioners.min_cut_rematerialization_partition) == [
        *head,
        ("num_fwd_outputs", P.KEYWORD_ONLY),
        ("compiler", P.KEYWORD_ONLY),
        ("static_lifetime_input_indices", P.KEYWORD_ONLY),
        ("functionalize_rng", P.KEYWORD_ONLY),
        ("ban_recompute_materialized_backward", P.KEYWORD_ONLY),
        ("ban_recompute_used_far_apart", P.KEYWORD_ONLY),
        ("kwargs", P.VAR_KEYWORD),
    ]
    assert _sig(aotkit_partitioners.memory_budget_partition) == [
        ("budget", P.POSITIONAL_OR_KEYWORD),
        ("solver", P.KEYWORD_ONLY),
    ]

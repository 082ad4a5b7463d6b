from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from aotkit_partitioners import (
    ENTRY_POINT_GROUP,
    UnknownPartitionerError,
    available_partitioners,
    default_partition,
    get_partitioner,
    min_cut_rematerialization_partition,
    register_partitioner,
    unregister_partitioner,
)
from aotkit_partitioners._budget import MemoryBudgetPartitioner
from aotkit_schemas import Partitioner


def _mine(
    joint_module: torch.fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int
) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    return default_partition(joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs)


@pytest.fixture
def clean() -> Iterator[None]:
    yield
    unregister_partitioner("mine")
    unregister_partitioner("default")


def test_builtins() -> None:
    assert {"default", "min_cut", "memory_budget"} <= set(available_partitioners())
    assert get_partitioner("default") is default_partition
    assert get_partitioner("min_cut") is min_cut_rematerialization_partition
    budget = get_partitioner("memory_budget")
    assert isinstance(budget, MemoryBudgetPartitioner) and budget.budget == 1.0
    assert isinstance(budget, Partitioner)


def test_callable_passes_through() -> None:
    assert get_partitioner(_mine) is _mine
    with pytest.raises(TypeError):
        get_partitioner(3)  # type: ignore[arg-type]


def test_register_and_replace(clean: None) -> None:
    register_partitioner("mine", _mine)
    assert get_partitioner("mine") is _mine
    assert "mine" in available_partitioners()
    with pytest.raises(ValueError, match="already registered"):
        register_partitioner("mine", default_partition)
    register_partitioner("default", _mine, replace=True)
    assert get_partitioner("default") is _mine
    unregister_partitioner("default")
    assert get_partitioner("default") is default_partition


def test_unknown_name_lists_available() -> None:
    with pytest.raises(UnknownPartitionerError, match=r"available: .*default.*min_cut"):
        get_partitioner("no_such_partitioner")


def test_entry_point_discovery(monkeypatch: pytest.MonkeyPatch, clean: None) -> None:
    ep = importlib.metadata.EntryPoint(
        name="mine", value="aotkit_partitioners:default_partition", group=ENTRY_POINT_GROUP
    )

    def fake_entry_points(*, group: str) -> list[importlib.metadata.EntryPoint]:
        return [ep] if group == ENTRY_POINT_GROUP else []

    monkeypatch.setattr(importlib.metadata, "entry_points", fake_entry_points)
    assert "mine" in available_partitioners()
    assert get_partitioner("mine") is default_partition

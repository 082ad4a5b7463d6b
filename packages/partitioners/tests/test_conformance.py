"""Every built-in partitioner passes the conformance kit it ships."""

from __future__ import annotations

import pytest
from aotkit_partitioners import (
    default_partition,
    memory_budget_partition,
    min_cut_rematerialization_partition,
)
from aotkit_partitioners.testing import PartitionerConformance
from aotkit_schemas import Partitioner


class TestDefaultPartition(PartitionerConformance):
    @pytest.fixture
    def partitioner(self) -> Partitioner:
        return default_partition


class TestMinCut(PartitionerConformance):
    @pytest.fixture
    def partitioner(self) -> Partitioner:
        return min_cut_rematerialization_partition


class TestMemoryBudgetGreedy(PartitionerConformance):
    @pytest.fixture
    def partitioner(self) -> Partitioner:
        return memory_budget_partition(0.4)


class TestMemoryBudgetMilp(PartitionerConformance):
    @pytest.fixture
    def partitioner(self) -> Partitioner:
        return memory_budget_partition(0.4, solver="milp")


class TestMemoryBudgetZero(PartitionerConformance):
    @pytest.fixture
    def partitioner(self) -> Partitioner:
        return memory_budget_partition(0.0)

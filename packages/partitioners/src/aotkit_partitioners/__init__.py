"""aotkit_partitioners: split a joint forward+backward graph into forward and backward graphs.

See Note [Joint graph calling convention] in ``aotkit_schemas``.
"""

from ._budget import MemoryBudgetPartitioner as MemoryBudgetPartitioner
from ._budget import memory_budget_partition as memory_budget_partition
from ._cse import cse as cse
from ._default import default_partition as default_partition
from ._extract import PartitionError as PartitionError
from ._mincut import min_cut_rematerialization_partition as min_cut_rematerialization_partition
from ._regions import partition_region_boundaries as partition_region_boundaries
from ._regions import region_partition_count as region_partition_count
from ._registry import ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
from ._registry import UnknownPartitionerError as UnknownPartitionerError
from ._registry import available_partitioners as available_partitioners
from ._registry import get_partitioner as get_partitioner
from ._registry import register_partitioner as register_partitioner
from ._registry import unregister_partitioner as unregister_partitioner
from ._report import PartitionReport as PartitionReport
from ._report import partition_report as partition_report

__all__ = [
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

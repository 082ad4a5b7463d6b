"""aotkit_partitioners: split a joint forward+backward graph into forward and backward graphs.

See Note [Joint graph calling convention] in ``aotkit_schemas``.
"""

from ._default import default_partition as default_partition
from ._extract import PartitionError as PartitionError

__all__ = [
    "PartitionError",
    "default_partition",
]

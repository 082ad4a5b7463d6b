"""aotkit_regions: share the regions that repeat in a graph (transformer blocks), so that
each distinct region is traced, partitioned and compiled once.

See Note [Repeated regions], Note [Regions that are not shared], Note [Sharing repeated
regions], Note [When sharing pays], Note [Marking repeated blocks] and Note [Region schemas
generated once].
"""

from ._find import Region as Region
from ._mark import mark_repeated_blocks as mark_repeated_blocks
from ._mark import unmark_repeated_blocks as unmark_repeated_blocks
from ._rewrite import RegionReport as RegionReport
from ._rewrite import has_invoke_subgraph as has_invoke_subgraph
from ._rewrite import record_region_reports as record_region_reports
from ._rewrite import share_repeated_regions as share_repeated_regions
from ._schemas import region_schemas as region_schemas
from ._switch import DEFAULT_MIN_REPEATS as DEFAULT_MIN_REPEATS
from ._switch import ENV_VAR as ENV_VAR
from ._switch import dedup_regions as dedup_regions
from ._switch import min_repeats as min_repeats
from ._switch import set_dedup_regions as set_dedup_regions

__all__ = [
    "DEFAULT_MIN_REPEATS",
    "ENV_VAR",
    "Region",
    "RegionReport",
    "dedup_regions",
    "has_invoke_subgraph",
    "mark_repeated_blocks",
    "min_repeats",
    "record_region_reports",
    "region_schemas",
    "set_dedup_regions",
    "share_repeated_regions",
    "unmark_repeated_blocks",
]

"""aotkit_cache: the on-disk compile cache.

A second process starts warm: compiled entries (metadata, layout, partition result and
graphs) are stored on disk under a key that describes the program, its inputs and
everything else the compilation read, and restored without fakification, tracing or
partitioning (Note [On-disk compile cache] in ``_files``). It plugs into the compile
pipeline as an ``aotkit_schemas.CompileCache`` (``DiskCompileCache``, one per
compilation: See Note [The compile cache seam]); ``aotkit_frontends`` builds one when the
cache is on for the entry point.
"""

from aotkit_schemas import cache_counters as cache_counters

from ._compile_cache import DiskCompileCache as DiskCompileCache
from ._files import cache_dir as cache_dir
from ._files import clear_entries as clear_entries
from ._files import list_entries as list_entries
from .key._fingerprint import program_fingerprint as program_fingerprint
from .key._key import ambient_state_key as ambient_state_key

__all__ = [
    "DiskCompileCache",
    "ambient_state_key",
    "cache_counters",
    "cache_dir",
    "clear_entries",
    "list_entries",
    "program_fingerprint",
]

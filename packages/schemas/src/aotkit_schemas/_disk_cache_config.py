"""Settings of the on-disk compile cache (See Note [On-disk compile cache] in aotkit_cache)."""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass


@dataclass
class DiskCacheConfig:
    """The on-disk cache settings; a field left None falls back to the environment.

    ``enabled``: None reads ``AOTKIT_CACHE`` (``0``/``1``), else each entry point's default
    (off for aot_function/aot_module, on for the aotkit torch.compile backends).
    ``dir``: None reads ``AOTKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/aotkit`` or
    ``~/.cache/aotkit``.
    """

    enabled: bool | None = None
    dir: str | None = None


# the process-wide settings object: ``aotkit_schemas.disk_cache_config.enabled = True``
disk_cache_config = DiskCacheConfig()


def disk_cache_enabled(default: bool, requested: bool | None = None) -> bool:
    """Whether to use the disk cache: ``requested`` (an entry point's argument) first, then
    ``disk_cache_config.enabled``, then ``AOTKIT_CACHE``, then ``default``."""
    if requested is not None:
        return requested
    if disk_cache_config.enabled is not None:
        return disk_cache_config.enabled
    env = os.environ.get("AOTKIT_CACHE")
    if env is not None and env.strip() in ("0", "1"):
        return env.strip() == "1"
    return default


def disk_cache_dir() -> pathlib.Path:
    """The cache's root directory (not created)."""
    if disk_cache_config.dir:
        return pathlib.Path(disk_cache_config.dir)
    env = os.environ.get("AOTKIT_CACHE_DIR")
    if env:
        return pathlib.Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "aotkit"

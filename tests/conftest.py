"""Make the differential corpus (``corpus``) and its harness (``_harness``) importable.

pytest runs with ``--import-mode=importlib``, which does not put ``tests/`` on sys.path.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

# The test suite leaves the on-disk compile cache alone unless a test turns it on (the
# aotkit torch.compile backends use it by default); tests/test_disk_cache.py runs its
# programs in subprocesses with their own AOTKIT_CACHE and AOTKIT_CACHE_DIR.
os.environ.setdefault("AOTKIT_CACHE", "0")


@pytest.fixture
def disk_cache_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The on-disk compile cache on for this test, in its own directory (returned), the
    cache's counters cleared."""
    from aotkit_cache import cache_counters
    from aotkit_schemas import disk_cache_config

    monkeypatch.setattr(disk_cache_config, "dir", str(tmp_path))
    monkeypatch.setattr(disk_cache_config, "enabled", True)
    cache_counters.clear()
    return tmp_path

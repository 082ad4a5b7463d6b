"""Make the differential corpus (``corpus``) and its harness (``_harness``) importable.

pytest runs with ``--import-mode=importlib``, which does not put ``tests/`` on sys.path.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

# The test suite leaves the on-disk compile cache alone unless a test turns it on (the
# aotkit torch.compile backends use it by default); tests/test_disk_cache.py runs its
# programs in subprocesses with their own AOTKIT_CACHE and AOTKIT_CACHE_DIR.
os.environ.setdefault("AOTKIT_CACHE", "0")

"""Make the differential corpus (``corpus``) and its harness (``_harness``) importable.

pytest runs with ``--import-mode=importlib``, which does not put ``tests/`` on sys.path.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

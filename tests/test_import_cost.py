"""Importing aotkit loads none of torch's heavy optional stacks (Note [Import cost]).

Each check runs in a fresh interpreter, since this test process has long loaded them all.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = [
    "torch._dynamo",
    "torch._inductor",
    "torch.fx.experimental.symbolic_shapes",
    "sympy",
    "networkx",
    "triton",
]


def _last_line(code: str) -> str:
    """The last line a fresh interpreter running ``code`` prints."""
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=300
    )
    return out.stdout.strip().splitlines()[-1]


def _loaded_after(statement: str) -> list[str]:
    code = (
        "import sys, json\n"
        f"{statement}\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    loaded: list[str] = json.loads(_last_line(code))
    return loaded


def _loaded_by_torch() -> set[str]:
    return set(_loaded_after("import torch"))


@pytest.mark.parametrize(
    "module",
    ["aotkit", "aotkit_partitioners", "aotkit_capture", "aotkit_frontends", "aotkit_backends"],
)
def test_import_loads_no_heavy_stack(module: str) -> None:
    extra = set(_loaded_after(f"import {module}")) - _loaded_by_torch()
    assert not extra, f"import {module} loads {sorted(extra)}: See Note [Import cost]"


def test_backends_are_found_without_importing_aotkit() -> None:
    """dynamo finds aotkit's backends through entry points on first use."""
    code = (
        "import torch\n"
        "f = torch.compile(lambda x: x.sin() * 2, backend='aotkit_eager')\n"
        "x = torch.ones(3)\n"
        "assert torch.equal(f(x), x.sin() * 2)\n"
        "import sys; print('aotkit_frontends' in sys.modules)\n"
    )
    assert _last_line(code) == "True"


def test_aotkit_registers_backends_when_dynamo_is_loaded() -> None:
    code = (
        "import torch._dynamo\n"
        "from torch._dynamo.backends.registry import _COMPILER_FNS\n"
        "import aotkit\n"
        "print(sorted(n for n in _COMPILER_FNS if n.startswith('aotkit_')))\n"
    )
    assert _last_line(code) == "['aotkit_eager', 'aotkit_inductor']"

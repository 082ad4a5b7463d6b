"""The recompile log says in words which part of the key or which shape guard failed
(Note [Recompile reasons])."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator

import aotkit
import pytest
import torch
from aotkit_frontends._recompile import explain_key_change
from aotkit_schemas import set_logs


@pytest.fixture
def recompiles(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    set_logs("recompiles")
    caplog.set_level(logging.INFO, logger="aotkit.cache.recompiles")
    try:
        yield caplog
    finally:
        set_logs("")


def _reasons(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "aotkit.cache.recompiles"]


def test_requires_grad_and_grad_mode(recompiles: pytest.LogCaptureFixture) -> None:
    f = aotkit.aot_function(lambda x, w: (x @ w).relu().sum(), aotkit.nop)
    f(torch.randn(3, 4), torch.randn(4, 2))
    f(torch.randn(3, 4), torch.randn(4, 2))  # a hit: no log
    assert _reasons(recompiles) == []
    f(torch.randn(3, 4), torch.randn(4, 2, requires_grad=True))
    with torch.no_grad():
        f(torch.randn(3, 4), torch.randn(4, 2, requires_grad=True))
    first, second = _reasons(recompiles)
    assert "(compilation 2)" in first
    assert "input 1: requires_grad changed from False to True" in first
    assert "grad mode changed from enabled to disabled" in second
    assert "input" not in second.split("because:")[1]


def test_static_sizes_and_constants(recompiles: pytest.LogCaptureFixture) -> None:
    h = aotkit.aot_function(lambda x, n: x * n, aotkit.nop)
    h(torch.randn(2), 2)
    h(torch.randn(2), 3)
    h(torch.randn(3), 3)
    by_value, by_size = _reasons(recompiles)
    assert "input 1: value changed from 2 to 3" in by_value
    assert "input 0: sizes changed from (2,) to (3,)" in by_size


def test_shape_guard_failure(recompiles: pytest.LogCaptureFixture) -> None:
    g = aotkit.aot_function(
        lambda x: (x.sin() if x.shape[0] <= 8 else x.cos()).sum(), aotkit.nop, dynamic=True
    )
    g(torch.randn(5, 4))
    g(torch.randn(6, 4))  # the same entry: guards pass
    assert _reasons(recompiles) == []
    g(torch.randn(16, 4))
    (reason,) = _reasons(recompiles)
    assert "shape guard failed: 2 <= input0.size(0) <= 8 (input0.size(0) = 16)" in reason


def test_aliasing_and_dtype_diff() -> None:
    spec = object()
    t32 = (
        torch.float32, torch.device("cpu"), torch.strided, torch.Size([4]), (1,), False, False, 0
    )
    t64 = (torch.float64, *t32[1:])
    old = (spec, (True, t32, t32, ()))
    new = (spec, (True, t64, t32, (("dup", 1, 0),)))
    assert explain_key_change(old, new, 2) == [  # type: ignore[arg-type]
        "input 0: dtype changed from torch.float32 to torch.float64",
        "input aliasing changed from [no inputs alias] to [input 1 is input 0]",
    ]
    # a key part this module has no words for (ambient state added before the inputs)
    old = (spec, (True, "autocast off", t32))
    new = (spec, (True, "autocast bf16", t32))
    assert explain_key_change(old, new, 1) == [  # type: ignore[arg-type]
        "ambient state #1 changed from 'autocast off' to 'autocast bf16'"
    ]


def test_torch_logs_recompiles_and_quiet_by_default() -> None:
    program = (
        "import torch, aotkit\n"
        "f = aotkit.aot_function(lambda x: x.sin(), aotkit.nop)\n"
        "f(torch.randn(2)); f(torch.randn(2, requires_grad=True))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("AOTKIT_LOGS", "TORCH_LOGS")}

    def stderr(extra: dict[str, str]) -> str:
        return subprocess.run(
            [sys.executable, "-c", program], env={**env, **extra}, capture_output=True,
            text=True, timeout=300, check=True,
        ).stderr

    assert "input 0: requires_grad changed from False to True" in stderr(
        {"TORCH_LOGS": "recompiles"}
    )
    assert "Recompiling" not in stderr({})

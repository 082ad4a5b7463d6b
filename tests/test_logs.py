"""aotkit's loggers (Note [aotkit loggers]): quiet by default, AOTKIT_LOGS in TORCH_LOGS's
grammar, graph dumps for aot_function and the torch.compile backends."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from aotkit_schemas import LogSpecError, parse_log_spec

PROGRAM = (
    "import torch, aotkit\n"
    "f = aotkit.aot_function(lambda x, w: (x @ w).relu().sum(), aotkit.nop)\n"
    "f(torch.randn(3, 4), torch.randn(4, 2, requires_grad=True)).backward()\n"
)


def _stderr(env_extra: dict[str, str], program: str = PROGRAM) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("AOTKIT_LOGS", "TORCH_LOGS")}
    env.update(env_extra)
    out = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300,
        check=True,
    )
    return out.stderr


def test_quiet_by_default() -> None:
    assert "aotkit." not in _stderr({})


def test_aotkit_logs_graphs_prints_forward_and_backward() -> None:
    err = _stderr({"AOTKIT_LOGS": "graphs"})
    assert "[aotkit.capture.graphs]" in err
    assert "Forward graph" in err and "Backward graph" in err
    assert "primals_1" in err and "tangents_1" in err


def test_torch_logs_aot_graphs_shows_aotkit_graphs() -> None:
    assert "Forward graph" in _stderr({"TORCH_LOGS": "aot_graphs"})


def test_spec_grammar() -> None:
    levels = parse_log_spec("+capture,partition").levels
    assert levels["aotkit.capture"] == logging.DEBUG
    assert levels["aotkit.partition"] == logging.INFO
    with pytest.raises(LogSpecError, match="nonsense"):
        parse_log_spec("nonsense")

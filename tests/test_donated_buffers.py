"""Donated buffers (Note [Donated buffers] in aotkit_capture) and torch's ``aot_graphs``
metadata line (Note [torch's aot_graphs metadata line]): ``bw_donated_idxs`` is torch's,
program by program, read from the line both log on torch's ``graph_compile`` logger.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from _autograd_functions import SaveInput
from aotkit import aot_function, nop
from aotkit_capture import record_compilations
from aotkit_partitioners import default_partition, min_cut_rematerialization_partition

LOGGER = "torch._functorch._aot_autograd.graph_compile"


def mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return (x @ w1).relu() @ w2


def intermediate_returned(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> Any:
    # the saved relu output is also a user output: not donated
    h = (x @ w1).relu()
    return h, h @ w2


def saves_input_and_output(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> Any:
    # torch's test_saved_tensors_hooks_donated_buffers, case 1: nothing donated
    y = SaveInput.apply(x)
    return x, torch.nn.functional.relu(y)


def chain(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return ((x * w1.sum()).sin() * w2.mean()).cos()


PROGRAMS: dict[str, Callable[..., Any]] = {
    "mlp": mlp,
    "intermediate_returned": intermediate_returned,
    "saves_input_and_output": saves_input_and_output,
    "chain": chain,
}


@pytest.fixture
def captured() -> Iterator[list[str]]:
    """The messages logged on torch's graph_compile logger (its artifacts included)."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger = logging.getLogger(LOGGER)
    handler, level, propagate = Collect(), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def _donated(messages: list[str]) -> list[str]:
    return re.findall(r"fw_metadata=.*?bw_donated_idxs=(\[[0-9, ]*\]|None)", "\n".join(messages))


def _call(f: Callable[..., Any]) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 3, requires_grad=True)
    w1 = torch.randn(3, 3, requires_grad=True)
    w2 = torch.randn(3, 2, requires_grad=True)
    out = f(x, w1, w2)
    (out[-1] if isinstance(out, (tuple, list)) else out).sum().backward()


def _torch(fn: Callable[..., Any], partition: str) -> Callable[..., Any]:
    from functorch.compile import aot_function as torch_aot_function
    from functorch.compile import default_partition as torch_default
    from functorch.compile import make_boxed_func
    from functorch.compile import min_cut_rematerialization_partition as torch_min_cut

    def boxed(gm: torch.fx.GraphModule, example: Any) -> Any:
        return make_boxed_func(gm.forward)

    part = torch_default if partition == "default" else torch_min_cut
    return torch_aot_function(fn, fw_compiler=boxed, bw_compiler=boxed, partition_fn=part)  # type: ignore[no-any-return]


# the min-cut partitioners of aotkit and torch may save different values (recompute
# choices), so the per-program comparison with torch uses the default partitioner
# everywhere and min-cut where both save the same
@pytest.mark.parametrize(
    ("name", "partition"),
    [
        *((n, "default") for n in PROGRAMS),
        ("mlp", "min_cut"),
        ("saves_input_and_output", "min_cut"),
    ],
)
def test_bw_donated_idxs_match_torch(name: str, partition: str, captured: list[str]) -> None:
    fn = PROGRAMS[name]
    part = default_partition if partition == "default" else min_cut_rematerialization_partition
    with record_compilations() as compiled:
        _call(aot_function(fn, nop, partition_fn=part))  # type: ignore[arg-type]
    ours = _donated(captured)
    captured.clear()
    _call(_torch(fn, partition))
    theirs = _donated(captured)
    assert len(ours) == 1 and ours == theirs
    idxs = compiled[0].meta.bw_donated_idxs
    assert str(idxs) == ours[0]
    if name == "mlp":
        assert idxs, "the relu output is an intermediate only the backward holds"
    if name in ("intermediate_returned", "saves_input_and_output"):
        assert idxs == []


def test_donated_buffer_flag_off(captured: list[str]) -> None:
    with torch._functorch.config.patch(donated_buffer=False), record_compilations() as compiled:
        _call(aot_function(mlp, nop))
    assert compiled[0].meta.bw_donated_idxs is None
    assert _donated(captured) == ["None"]


def test_retain_graph_still_allowed_with_donated_buffers() -> None:
    """aotkit never frees a donated buffer early, so a second backward works as in eager
    (torch raises here, for Inductor's in-place reuse)."""
    f = aot_function(mlp, nop)
    torch.manual_seed(0)
    args = [
        torch.randn(4, 3, requires_grad=True),
        torch.randn(3, 3, requires_grad=True),
        torch.randn(3, 2, requires_grad=True),
    ]
    out = f(*args)
    out.sum().backward(retain_graph=True)
    out.sum().backward()
    eager_args = [a.detach().clone().requires_grad_(True) for a in args]
    eager_out = mlp(*eager_args)
    eager_out.sum().backward(retain_graph=True)
    eager_out.sum().backward()
    for a, e in zip(args, eager_args, strict=True):
        torch.testing.assert_close(a.grad, e.grad)


def test_metadata_line_on_aotkit_graphs_artifact(caplog: pytest.LogCaptureFixture) -> None:
    from aotkit_schemas import set_logs

    set_logs("graphs")
    try:
        with caplog.at_level(logging.INFO, logger="aotkit.capture.graphs"):
            _call(aot_function(mlp, nop))
    finally:
        set_logs("")
    lines = [r.getMessage() for r in caplog.records if r.name == "aotkit.capture.graphs"]
    assert any(m.startswith("aot_config id: ") and "bw_donated_idxs=[" in m for m in lines)

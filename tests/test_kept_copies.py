"""Note [Kept mutations recorded directly]: the ``copy_`` nodes of input mutations kept in
the graph, recorded without dispatching them, give the same graphs and node meta as the
dispatched ``copy_``, on every path that keeps mutations (single pass, two passes, inference)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import aotkit_tracing.core._trace as trace_module
import pytest
import torch
from aotkit_capture import record_compilations
from aotkit_frontends import aot_function


def _bn_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 6 * 6, 2),
    )


def _describe(gm: torch.fx.GraphModule) -> list[tuple[str, dict[str, str]]]:
    rows = []
    for node in gm.graph.nodes:
        meta: dict[str, str] = {}
        for k, v in node.meta.items():
            if k == "val" and isinstance(v, torch.Tensor):
                # a placeholder's val shares its input's version counter, which later
                # compiles move (Inductor's, unless its FX graph cache hits)
                version = v._version if node.op != "placeholder" else None
                v = (tuple(v.shape), v.stride(), v.dtype, v.requires_grad, version)
            elif k == "nn_module_stack":
                v = list(v.values())
            meta[k] = re.sub(r"graph_id=\d+", "", repr(v))
        rows.append((node.format_node(), meta))
    # seq_nr is autograd's process-wide counter: compare its order only
    seqs = sorted({int(m["seq_nr"]) for _, m in rows if "seq_nr" in m})
    for _, m in rows:
        if "seq_nr" in m:
            m["seq_nr"] = str(seqs.index(int(m["seq_nr"])))
    return rows


class _Counted:
    def __init__(self, direct: bool) -> None:
        self.direct = direct
        self.recorded = 0
        self.real = trace_module.record_kept_copy

    def __call__(self, original: Any, new: Any, *, bump_version: bool) -> bool:
        if not self.direct:
            return False
        done = self.real(original, new, bump_version=bump_version)
        self.recorded += int(done)
        return done


def _graphs(
    monkeypatch: pytest.MonkeyPatch, direct: bool, run: Callable[[], None]
) -> tuple[list[Any], int]:
    counted = _Counted(direct)
    with monkeypatch.context() as m:
        m.setattr(trace_module, "record_kept_copy", counted)
        torch._dynamo.reset()
        with record_compilations() as records:
            run()
    graphs = []
    for r in records:
        for gm in (r.joint_module, r.fw_module, r.bw_module, r.inference_module):
            if gm is not None:
                graphs.append(_describe(gm))
    return graphs, counted.recorded


def _dynamo_training(backend: str) -> Callable[[], None]:
    def run() -> None:
        compiled = torch.compile(_bn_model(), backend=backend)
        compiled(torch.randn(2, 3, 8, 8)).sum().backward()

    return run


def _two_pass_training() -> None:
    # an aliased output (a view of the input) sends the compile to the two-pass flow
    def f(x: torch.Tensor, buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            buf.add_(1)
        return x * 2, x.view(-1)

    g = aot_function(f, lambda gm, _: gm, keep_inference_input_mutations=True)
    out, view = g(torch.randn(3, requires_grad=True), torch.zeros(3))
    (out.sum() + view.sum()).backward()


def _inference() -> None:
    def f(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        buf.mul_(0.5)
        return x + buf

    g = aot_function(f, lambda gm, _: gm, keep_inference_input_mutations=True)
    g(torch.randn(3), torch.ones(3))


CASES: dict[str, Callable[[], None]] = {
    "single_pass_aotkit_eager": _dynamo_training("aotkit_eager"),
    "single_pass_aotkit_inductor_decomps": _dynamo_training("aotkit_inductor"),
    "two_pass": _two_pass_training,
    "inference": _inference,
}


@pytest.mark.parametrize("case", list(CASES))
def test_recorded_copies_match_dispatched_ones(
    monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    monkeypatch.setenv("AOTKIT_CACHE", "0")
    dispatched, none = _graphs(monkeypatch, False, CASES[case])
    recorded, count = _graphs(monkeypatch, True, CASES[case])
    assert none == 0
    assert count > 0, "the direct path was not taken"
    assert dispatched and recorded == dispatched


def test_a_copy_that_would_raise_is_dispatched(monkeypatch: pytest.MonkeyPatch) -> None:
    # an expanded (internally overlapping) input cannot be written: eager's error, from
    # the dispatched copy_
    monkeypatch.setenv("AOTKIT_CACHE", "0")

    def f(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        buf.mul_(0.5)
        return x + buf

    g = aot_function(f, lambda gm, _: gm, keep_inference_input_mutations=True)
    buf = torch.ones(1).expand(3)
    with pytest.raises(RuntimeError) as ours:
        g(torch.randn(3), buf)
    with pytest.raises(RuntimeError) as eager:
        f(torch.randn(3), torch.ones(1).expand(3))
    assert "single memory location" in str(eager.value)
    assert "single memory location" in str(ours.value)

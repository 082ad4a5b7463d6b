"""A warm hit makes its entry's fake mode only when something needs it, and a warm start of
a plain aot_function/aot_module program with nop imports neither torch._dynamo nor sympy.
See Note [A restored entry's fake mode made when first needed] in aotkit_cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from aotkit_cache.entry._fake_mode import DeferredFakeMode
from aotkit_cache.entry._fakes import RestoredFakes
from aotkit_capture.compile._examples import compile_fake_mode
from aotkit_schemas import mark_cache_key, mark_example_inputs_unused, mark_graph_reader
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

_PROGRAM = r"""
import json, sys
import torch
import aotkit_backends, aotkit_frontends
from aotkit_cache import cache_counters

torch.manual_seed(0)

def f(x, w):
    return (torch.tanh(x @ w) * w.sum()).sum(1)

model = torch.nn.Sequential(
    torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5), torch.nn.ReLU(), torch.nn.Linear(5, 2)
)
layer = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
x, w = torch.randn(4, 6), torch.randn(6, 3, requires_grad=True)
seq = torch.randn(2, 5, 8)
g = aotkit_frontends.aot_function(f, aotkit_backends.nop)
m = aotkit_frontends.aot_module(model, aotkit_backends.nop)
t = aotkit_frontends.aot_module(layer, aotkit_backends.nop)
out_f = g(x[:, :6], w)
out_f.sum().backward()
out_m = m(x)
out_m.sum().backward()
out_t = t(seq)
out_t.sum().backward()
with torch.no_grad():  # an inference entry
    out_i = g(x, w)
print(json.dumps({
    "counters": dict(cache_counters),
    "dynamo": "torch._dynamo" in sys.modules,
    "sympy": "sympy" in sys.modules,
    "out": [out_f.tolist(), out_m.tolist(), out_t.tolist(), out_i.tolist()],
    "grads": [w.grad.tolist()] + [p.grad.tolist() for p in model.parameters()]
    + [p.grad.tolist() for p in layer.parameters()],
    "buffers": [b.tolist() for b in model.buffers()],
}))
"""


def _run(cache_dir: Path) -> dict[str, Any]:
    env = {**os.environ, "AOTKIT_CACHE": "1", "AOTKIT_CACHE_DIR": str(cache_dir)}
    proc = subprocess.run(
        [sys.executable, "-c", _PROGRAM], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def test_a_warm_start_of_nop_programs_imports_neither_dynamo_nor_sympy(tmp_path: Path) -> None:
    cold = _run(tmp_path)
    assert cold["counters"]["store"] == 4 and cold["dynamo"]  # tracing needs a fake mode
    warm = _run(tmp_path)
    assert warm["counters"] == {"hit": 4}
    assert not warm["dynamo"] and not warm["sympy"]
    for field in ("out", "grads", "buffers"):
        assert warm[field] == cold[field], field  # bitwise: the same graphs, the same kernels


class _Recording:
    """A compiler that records the fake mode active while it compiles; marked as reading
    only the graph and never its examples when ``graph_only``."""

    def __init__(self, graph_only: bool) -> None:
        self.modes: list[Any] = []
        if graph_only:
            mark_graph_reader(self)
            mark_example_inputs_unused(self)
        mark_cache_key(self, f"test.fake_mode/{graph_only}")

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        from aotkit_backends import nop

        self.modes.append(torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE))
        return nop(gm, example_inputs)


def _program(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w).sum(1)


@pytest.mark.parametrize("graph_only", [True, False])
def test_the_backward_compiles_under_the_fake_mode_unless_nothing_made_it(
    disk_cache_on: Path, graph_only: bool
) -> None:
    import aotkit
    from aotkit_cache import cache_counters

    x, w = torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)
    grads = []
    for run in ("cold", "warm"):
        cache_counters.clear()
        compiler = _Recording(graph_only)
        g = aotkit.aot_function(_program, compiler)
        g(x, w).sum().backward()
        assert cache_counters["store" if run == "cold" else "hit"] == 1
        fw_mode, bw_mode = compiler.modes
        if run == "cold":
            assert isinstance(fw_mode, FakeTensorMode) and bw_mode is fw_mode
        elif graph_only:
            # nothing read a fake value: no mode was made, none is entered
            assert fw_mode is None and bw_mode is None
        else:
            # this compiler reads its examples: the mode is made for them, and both graphs
            # compile under it, as in the cold run
            assert isinstance(fw_mode, FakeTensorMode) and bw_mode is fw_mode
        assert w.grad is not None
        grads.append(w.grad)
        w.grad = None
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)


def test_a_value_read_after_the_hit_is_made_in_one_mode(
    disk_cache_on: Path
) -> None:
    import aotkit
    from aotkit_cache import cache_counters

    x, w = torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)
    cold = aotkit.aot_function(_program, aotkit.nop)
    cold(x, w)
    cold_art = cold._aotkit_cache.artifacts[0]
    cache_counters.clear()
    warm = aotkit.aot_function(_program, aotkit.nop)
    warm(x, w).sum().backward()
    assert cache_counters == {"hit": 1}
    art = warm._aotkit_cache.artifacts[0]
    values = [n.meta["val"] for g in (art.fw_module, art.bw_module) for n in g.graph.nodes
              if n.op in ("placeholder", "call_function")]
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    assert tensors and all(isinstance(v, FakeTensor) for v in tensors)
    assert len({id(v.fake_mode) for v in tensors}) == 1  # made once, shared by every value
    cold_values = [n.meta["val"] for g in (cold_art.fw_module, cold_art.bw_module)
                   for n in g.graph.nodes if n.op in ("placeholder", "call_function")]
    for v, c in zip(values, cold_values, strict=True):
        if isinstance(c, torch.Tensor):
            assert (v.shape, v.stride(), v.dtype, v.requires_grad) == (
                c.shape, c.stride(), c.dtype, c.requires_grad
            )


def test_deferred_fake_mode_and_the_compile_mode_rule() -> None:
    deferred = DeferredFakeMode()
    assert not deferred.made
    mode = deferred.get()
    assert deferred.made and isinstance(mode, FakeTensorMode) and deferred.get() is mode
    restored = RestoredFakes([], [], DeferredFakeMode())
    graph_only, reader = _Recording(True), _Recording(False)
    assert not restored.fake_mode_made
    assert compile_fake_mode(restored, graph_only) is None
    assert not restored.fake_mode_made  # asking the rule made nothing
    made = compile_fake_mode(restored, reader)  # a compiler that may read fakes: made now
    assert isinstance(made, FakeTensorMode) and restored.fake_mode_made
    assert compile_fake_mode(restored, graph_only) is made  # once made, every compiler gets it
    own = FakeTensorMode()
    assert compile_fake_mode(RestoredFakes([], [], own), graph_only) is own

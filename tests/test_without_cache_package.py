"""Without aotkit-cache installed every entry point compiles, uncached (See Note [The
compile cache seam] in aotkit_schemas): the frontends import it optionally."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_SCRIPT = r"""
import importlib.abc, json, os, sys

class _NoCache(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "aotkit_cache" or name.startswith("aotkit_cache."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

if sys.argv[1] == "blocked":
    sys.meta_path.insert(0, _NoCache())

import torch
import aotkit_frontends._disk_cache as wiring
from aotkit_backends import nop
from aotkit_frontends import aot_function, aot_module
from aotkit_schemas import cache_counters

def f(x, w):
    return (x @ w).tanh().sum()

torch.manual_seed(0)
x, w = torch.randn(4, 3), torch.randn(3, 2, requires_grad=True)
out = aot_function(f, nop)(x, w)
out.backward()
eager_w = w.detach().clone().requires_grad_(True)
f(x, eager_w).backward()

mod = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
ref = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
ref.load_state_dict(mod.state_dict())
y = aot_module(mod, nop)(x)
y.sin().sum().backward()
ref_y = ref(x)
ref_y.sin().sum().backward()

compiled = torch.compile(f, backend="aotkit_eager")
cw = w.detach().clone().requires_grad_(True)
compiled(x, cw).backward()

entries = [p for p, _, files in os.walk(os.environ["AOTKIT_CACHE_DIR"]) for _ in files]
print(json.dumps({
    "package": wiring.aotkit_cache is not None,
    "out": torch.equal(out, f(x, w)),
    "grad": torch.equal(w.grad, eager_w.grad),
    "module": torch.allclose(y, ref_y) and all(
        torch.allclose(a.grad, b.grad) for a, b in zip(mod.parameters(), ref.parameters())),
    "buffers": torch.allclose(mod[1].running_mean, ref[1].running_mean)
    and torch.allclose(mod[1].running_var, ref[1].running_var),
    "compiled": torch.equal(cw.grad, eager_w.grad),
    "entries": len(entries),
    "stores": cache_counters["store"],
}))
"""


def _run(mode: str, cache_dir: Path) -> dict[str, object]:
    env = {**os.environ, "AOTKIT_CACHE": "1", "AOTKIT_CACHE_DIR": str(cache_dir)}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, mode], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_entry_points_work_uncached_without_the_cache_package(tmp_path: Path) -> None:
    blocked = _run("blocked", tmp_path / "blocked")
    assert blocked == {
        "package": False, "out": True, "grad": True, "module": True, "buffers": True,
        "compiled": True, "entries": 0, "stores": 0,
    }
    # the same program with the package stores its entries (the switch above is the package)
    cached = _run("installed", tmp_path / "installed")
    assert cached["package"] is True and cached["entries"] and cached["stores"]
    assert all(cached[k] is True for k in ("out", "grad", "module", "buffers", "compiled"))

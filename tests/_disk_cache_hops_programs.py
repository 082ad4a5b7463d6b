"""Programs with higher-order operators that tests/test_disk_cache_hops.py runs in fresh
processes (See Note [Higher-order operators in the on-disk cache]).

``python this.py DIR NAME...``: runs each program with the disk cache in DIR and prints
one JSON line: per program its outputs, gradients, the code of every graph compiled
(subgraphs included) and the ``aotkit_capture.cache_counters`` of that program alone.
Each program checks its outputs and gradients against eager.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import aotkit
import torch
from aotkit_cache import cache_counters
from aotkit_capture import record_compilations


def _cond_fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    def true_fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x @ w).sin()

    def false_fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x @ w).cos() * 2

    return torch.cond(x.sum() > 0, true_fn, false_fn, (x, w))


class CondModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return torch.cond(h.sum() > 0, lambda h: h.relu() * 3, lambda h: h.tanh(), (h,))


@torch.compiler.nested_compile_region
def _block(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ w) + x


class Regions(torch.nn.Module):
    """A transformer-style stack whose repeated block is one compiled region."""

    def __init__(self) -> None:
        super().__init__()
        self.ws = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(6, 6) / 3) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in self.ws:
            x = _block(x, w)
        return x


def _graph_codes(compiled: list[Any]) -> list[str]:
    codes = []
    for art in compiled:
        for name in ("fw_module", "bw_module", "inference_module"):
            gm = getattr(art, name, None)
            if gm is None:
                continue
            codes.append(gm.code)
            codes += [f"{n}:{sub.code}" for n, sub in sorted(gm.named_children())]
    return codes


def _check(compiled_fn: Callable[..., Any], eager_fn: Callable[..., Any], params: list[torch.Tensor],
           *inputs: torch.Tensor) -> dict[str, Any]:
    with record_compilations() as compiled:
        out = compiled_fn(*inputs)
        out.sum().backward()
    leaves = [*inputs, *params]
    grads = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    expected = eager_fn(*inputs)
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    for got, t in zip(grads, leaves, strict=True):
        torch.testing.assert_close(got, t.grad)
    return {"out": out.tolist(), "grads": [g.tolist() for g in grads],
            "graphs": _graph_codes(compiled)}


def cond_function() -> dict[str, Any]:
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    return _check(aotkit.aot_function(_cond_fn, aotkit.nop), _cond_fn, [], x, w)


def cond_compiled() -> dict[str, Any]:
    mod = CondModel()
    x = torch.randn(3, 4, requires_grad=True)
    return _check(torch.compile(mod, backend="aotkit_eager"), mod, list(mod.parameters()), x)


def regions_compiled() -> dict[str, Any]:
    mod = Regions()
    x = torch.randn(2, 6, requires_grad=True)
    return _check(torch.compile(mod, backend="aotkit_eager"), mod, list(mod.parameters()), x)


MARKER = "aotkit-effect-marker"


def _effects_fn(x: torch.Tensor) -> torch.Tensor:
    # two effect chains' worth of ops: a print (ordered) and linalg's error checks
    torch.ops.aten._print(MARKER)
    return torch.linalg.inv(x @ x.mT + torch.eye(3)).sin()


class Solver(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return torch.linalg.solve(h @ h.mT + torch.eye(3), h).cos()


def effects_function() -> dict[str, Any]:
    x = torch.randn(3, 3, requires_grad=True)
    return _check(aotkit.aot_function(_effects_fn, aotkit.nop), _effects_fn, [], x)


def effects_compiled() -> dict[str, Any]:
    mod = Solver()
    x = torch.randn(3, 3, requires_grad=True)
    return _check(torch.compile(mod, backend="aotkit_eager"), mod, list(mod.parameters()), x)


def _compiled(cls: type[torch.nn.Module], shape: tuple[int, ...], backend: str) -> dict[str, Any]:
    mod = cls()
    x = torch.randn(*shape, requires_grad=True)
    return _check(torch.compile(mod, backend=backend), mod, list(mod.parameters()), x)


def inductor_programs() -> dict[str, Callable[[], dict[str, Any]]]:
    """The torch.compile programs above with aotkit_inductor."""
    return {
        "cond_inductor": lambda: _compiled(CondModel, (3, 4), "aotkit_inductor"),
        "regions_inductor": lambda: _compiled(Regions, (2, 6), "aotkit_inductor"),
        "effects_inductor": lambda: _compiled(Solver, (3, 3), "aotkit_inductor"),
    }


PROGRAMS: dict[str, Callable[[], dict[str, Any]]] = {
    **inductor_programs(),
    "cond_function": cond_function, "cond_compiled": cond_compiled,
    "regions_compiled": regions_compiled, "effects_function": effects_function,
    "effects_compiled": effects_compiled,
}


def main(d: str, names: list[str]) -> list[dict[str, Any]]:
    from aotkit_schemas import disk_cache_config

    disk_cache_config.dir = d
    results = []
    for name in names:
        torch.manual_seed(0)
        torch._dynamo.reset()
        cache_counters.clear()
        result = PROGRAMS[name]()
        result["counters"] = dict(cache_counters)
        result["name"] = name
        results.append(result)
    return results


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:])))

"""Programs the on-disk cache tests run in fresh processes.

``python this.py '[[DIR, [NAME, ...], REPEAT], ...]'``: for every cache directory, its
programs, REPEAT times, runs the program from a fresh compiled wrapper with
the disk cache in that directory and records its outputs, gradients, buffers and the
``aotkit_capture.cache_counters`` of that run alone. Prints one JSON line: a list of
``{"dir", "name", ...}`` results. One process runs several programs because process
start (importing torch) dominates these tests on a loaded CI machine.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import aotkit
import torch
from aotkit_cache import cache_counters


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> Any:
        return self.b(torch.relu(self.a(x))), 3


class ScaledSilu(torch.autograd.Function):
    """A custom autograd.Function (forward, setup_context, backward): cached by its code."""

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x) * 2.0

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return g * 2.0 * (s + x * s * (1 - s))


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
        self.norm1 = torch.nn.LayerNorm(16)
        self.ff1 = torch.nn.Linear(16, 32)
        self.ff2 = torch.nn.Linear(32, 16)
        self.norm2 = torch.nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x + self.attn(x, x, x, need_weights=False)[0])
        return self.norm2(h + self.ff2(ScaledSilu.apply(self.ff1(h))))


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3)
        self.bn = torch.nn.BatchNorm2d(6)
        self.fc = torch.nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def _run_module(mod: torch.nn.Module, compiled: Callable[..., Any], x: torch.Tensor) -> dict[str, Any]:
    out = compiled(x)
    loss_out = out[0] if isinstance(out, tuple) else out
    loss_out.sum().backward()
    result: dict[str, Any] = {"out": loss_out.tolist()}
    if isinstance(out, tuple):
        result["extra"] = list(out[1:])
    result["x_grad"] = x.grad.tolist() if x.grad is not None else None
    result["grads"] = {n: p.grad.tolist() for n, p in mod.named_parameters() if p.grad is not None}
    result["buffers"] = {n: b.tolist() for n, b in mod.named_buffers()}
    with torch.no_grad():
        again = compiled(x)
    result["no_grad"] = (again[0] if isinstance(again, tuple) else again).tolist()
    result["placeholders"] = _placeholder_values(compiled)
    return result


def _placeholder_values(compiled: Any) -> list[Any]:
    """Every compiled graph's placeholder values (read after the run, so a deferred value
    is built now): a warm hit must hand its compilers the metadata a trace did, down to
    ``requires_grad`` (See Note [Lazy node values of restored graphs] in aotkit_cache)."""
    out: list[Any] = []
    cache = getattr(getattr(compiled, "_compiled", None), "_aotkit_cache", None)
    for art in cache.artifacts if cache is not None else ():  # (aot_module's; not dynamo's)
        for role in ("fw_module", "bw_module", "inference_module"):
            gm = getattr(art, role)
            if gm is None:
                continue
            for n in gm.graph.find_nodes(op="placeholder"):
                v = n.meta.get("val")
                out.append([role, n.name] + (
                    [list(v.shape), list(v.stride()), str(v.dtype), v.requires_grad]
                    if isinstance(v, torch.Tensor) else [repr(v)]
                ))
    return out


def mlp() -> dict[str, Any]:
    mod = MLP()
    return _run_module(mod, aotkit.aot_module(mod, aotkit.nop), torch.randn(5, 8, requires_grad=True))


def transformer() -> dict[str, Any]:
    mod = Layer()
    return _run_module(mod, aotkit.aot_module(mod, aotkit.nop), torch.randn(2, 5, 16, requires_grad=True))


def convnet() -> dict[str, Any]:
    mod = ConvNet().train()
    return _run_module(mod, aotkit.aot_module(mod, aotkit.nop), torch.randn(4, 3, 8, 8))


def _dyn_f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x @ w).relu().sum(0)


def _dynamic(sizes: tuple[int, ...]) -> dict[str, Any]:
    """aot_function(dynamic=True) over ``sizes``; outputs and grads checked against eager
    here (the warm runs use other sizes than the cold one)."""
    w = torch.randn(4, 3, requires_grad=True)
    w_eager = w.detach().clone().requires_grad_(True)
    g = aotkit.aot_function(_dyn_f, aotkit.nop, dynamic=True)
    outs = []
    for n in sizes:
        x = torch.randn(n, 4)
        y = g(x, w)
        y.sum().backward()
        expected = _dyn_f(x, w_eager)
        expected.sum().backward()
        torch.testing.assert_close(y, expected)
        outs.append(y.tolist())
    assert w.grad is not None and w_eager.grad is not None
    torch.testing.assert_close(w.grad, w_eager.grad)
    return {"out": outs, "w_grad": w.grad.tolist(), "eager_ok": True}


def dynamic() -> dict[str, Any]:
    return _dynamic((3, 5))


def dynamic_other() -> dict[str, Any]:
    # other sizes that satisfy the cold entry's guards (every size >= 2)
    return _dynamic((7, 9))


def dynamic_one() -> dict[str, Any]:
    # a size of 1 is specialized: the cold entry's guards fail
    return _dynamic((1,))


def compiled_dynamic() -> dict[str, Any]:
    mod = MLP()
    opt = torch.compile(mod, backend="aotkit_eager", dynamic=True)
    x = torch.randn(5, 8, requires_grad=True)
    result = _run_module(mod, opt, x)
    torch.testing.assert_close(torch.tensor(result["out"]), mod(x)[0])
    return result


def compiled_dynamic_other() -> dict[str, Any]:
    # the cold entry of compiled_dynamic at another batch size: dynamo's graph and its
    # guards hold, so the disk entry applies (the key once held the real batch size)
    mod = MLP()
    opt = torch.compile(mod, backend="aotkit_eager", dynamic=True)
    x = torch.randn(7, 8, requires_grad=True)
    result = _run_module(mod, opt, x)
    torch.testing.assert_close(torch.tensor(result["out"]), mod(x)[0])
    return result


def compiled() -> dict[str, Any]:
    mod = MLP()
    opt = torch.compile(mod, backend="aotkit_eager")
    return _run_module(mod, opt, torch.randn(5, 8, requires_grad=True))


PROGRAMS: dict[str, Callable[[], dict[str, Any]]] = {
    "mlp": mlp, "transformer": transformer, "convnet": convnet, "dynamic": dynamic,
    "dynamic_other": dynamic_other, "dynamic_one": dynamic_one, "compiled": compiled,
    "compiled_dynamic": compiled_dynamic, "compiled_dynamic_other": compiled_dynamic_other,
}


def main(argv: list[str]) -> list[dict[str, Any]]:
    from aotkit_schemas import disk_cache_config

    results = []
    for d, names, repeat in json.loads(argv[0]):
        disk_cache_config.dir = d
        for _ in range(repeat):
            for name in names:
                torch.manual_seed(0)
                torch._dynamo.reset()
                cache_counters.clear()
                result = PROGRAMS[name]()
                result["counters"] = dict(cache_counters)
                result["dir"], result["name"] = d, name
                results.append(result)
    return results


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))

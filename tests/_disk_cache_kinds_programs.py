"""Programs of the kinds the on-disk cache used to refuse, run in fresh processes by
tests/test_disk_cache_kinds.py: modules with hooks, tensor constants, activation
checkpointing with dropout (the functionalized RNG's state operators), recorded view
chains, and programs that
differ from those only where the key must tell them apart.

``python this.py DIR NAME...``: runs each program with the disk cache in DIR and prints
one JSON line: per program its outputs, gradients, the code of every graph compiled and
the ``aotkit_capture.cache_counters`` of that program alone. Each program checks its
outputs and gradients against eager.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import aotkit
import torch
import torch.utils.checkpoint as cp
from aotkit_cache import cache_counters
from aotkit_capture import record_compilations


def _graph_codes(compiled: list[Any]) -> list[str]:
    codes = []
    for art in compiled:
        for name in ("fw_module", "bw_module", "inference_module"):
            gm = getattr(art, name, None)
            if gm is not None:
                codes.append(gm.code)
                codes += [f"{n}:{sub.code}" for n, sub in sorted(gm.named_children())]
    return codes


def _check(compiled_fn: Callable[..., Any], eager_fn: Callable[..., Any],
           params: list[torch.Tensor], *inputs: torch.Tensor, seed: int | None = None) -> dict[str, Any]:
    """Compiled against eager: outputs, gradients of inputs and parameters (random ops
    draw from ``seed`` in both)."""
    if seed is not None:
        torch.manual_seed(seed)
    with record_compilations() as compiled:
        out = compiled_fn(*inputs)
        out.sum().backward()
    leaves = [*inputs, *params]
    grads = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    if seed is not None:
        torch.manual_seed(seed)
    expected = eager_fn(*inputs)
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    for got, t in zip(grads, leaves, strict=True):
        torch.testing.assert_close(got, t.grad)
    return {"out": out.tolist(), "grads": [g.tolist() for g in grads],
            "graphs": _graph_codes(compiled)}


# ---- modules with hooks (aot_module) ------------------------------------------------


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 6)
        self.b = torch.nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def _scale_input(mod: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return (args[0] * 0.5,)


def _hooked(scale: float) -> Block:
    mod = Block()
    mod.a.register_forward_pre_hook(_scale_input)
    mod.register_forward_hook(lambda m, args, out: out * scale + args[0])
    return mod


def _run_hooks(scale: float) -> dict[str, Any]:
    mod = _hooked(scale)
    x = torch.randn(3, 4, requires_grad=True)
    return _check(aotkit.aot_module(mod, aotkit.nop), mod, list(mod.parameters()), x)


def _run_kwargs_hook() -> dict[str, Any]:
    # a forward hook with kwargs and always_call, and a process-wide forward hook
    mod = Block()
    mod.b.register_forward_hook(lambda m, args, kwargs, out: out.tanh(), with_kwargs=True,
                                always_call=True)
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda m, args, out: out * 2 if isinstance(m, torch.nn.Linear) else None
    )
    try:
        x = torch.randn(3, 4, requires_grad=True)
        return _check(aotkit.aot_module(mod, aotkit.nop), mod, list(mod.parameters()), x)
    finally:
        handle.remove()


# ---- tensor constants ----------------------------------------------------------------


def _const_fn(x: torch.Tensor) -> torch.Tensor:
    # traced as _tensor_constant0 + lift_fresh_copy, in the forward and the backward
    return (x * torch.tensor([1.0, -2.0, 3.0, 0.5])).sin() + torch.tensor(2.0)


def _const_fn_other(x: torch.Tensor) -> torch.Tensor:
    return (x * torch.tensor([1.0, -2.0, 3.0, 0.25])).sin() + torch.tensor(2.0)


class ConstModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.tensor([[True, False, True, True]])
        return torch.where(mask, self.lin(x), x * torch.tensor([0.5, 1.5, 2.5, 3.5]))


def _run_const_function(fn: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, Any]:
    x = torch.randn(3, 4, requires_grad=True)
    return _check(aotkit.aot_function(fn, aotkit.nop), fn, [], x)


def _run_const_compiled() -> dict[str, Any]:
    mod = ConstModel()
    x = torch.randn(3, 4, requires_grad=True)
    return _check(torch.compile(mod, backend="aotkit_eager"), mod, list(mod.parameters()), x)


# ---- activation checkpointing with dropout (RNG state operators) ---------------------


class Checkpointed(torch.nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p
        self.lin = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 2)

    def _inner(self, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(self.lin(y).relu(), self.p, training=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(cp.checkpoint(self._inner, x, use_reentrant=False))


def _run_checkpoint(p: float) -> dict[str, Any]:
    mod = Checkpointed(p)
    x = torch.randn(5, 8, requires_grad=True)
    return _check(torch.compile(mod, backend="aotkit_eager"), mod, list(mod.parameters()), x,
                  seed=1234)


# ---- recorded view chains (view replay) --------------------------------------------


def _view_of_mutated(x: torch.Tensor) -> torch.Tensor:
    x.mul_(2)
    return x[1:].t()


def _view_of_mutated_other(x: torch.Tensor) -> torch.Tensor:
    x.mul_(2)
    return x[2:].t()


def _metadata_mutation(x: torch.Tensor) -> torch.Tensor:
    x.t_()
    return x + 1


def _run_view_chain(fn: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, Any]:
    """An output viewing a mutated non-contiguous input (or an input whose metadata
    changes): replayed from functionalization's recorded chain. Values, strides, offsets
    and aliasing against eager."""
    def make() -> torch.Tensor:
        return torch.arange(30.0).reshape(5, 6).t()[1:]

    x, ref = make(), make()
    with record_compilations() as compiled:
        out = aotkit.aot_function(fn, aotkit.nop)(x)
    expected = fn(ref)
    facts = []
    for got, want, inp, ref_inp in ((out, expected, x, ref),):
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(inp, ref_inp)
        assert got.stride() == want.stride() and got.storage_offset() == want.storage_offset()
        assert inp.stride() == ref_inp.stride() and inp.shape == ref_inp.shape
        same = got.untyped_storage()._cdata == inp.untyped_storage()._cdata
        assert same == (want.untyped_storage()._cdata == ref_inp.untyped_storage()._cdata)
        facts.append([got.tolist(), list(got.stride()), inp.tolist(), list(inp.stride()), same])
    return {"out": facts, "grads": [], "graphs": _graph_codes(compiled)}


PROGRAMS: dict[str, Callable[[], dict[str, Any]]] = {
    "view_chain": lambda: _run_view_chain(_view_of_mutated),
    "view_chain_other": lambda: _run_view_chain(_view_of_mutated_other),
    "view_chain_input": lambda: _run_view_chain(_metadata_mutation),
    "hooks": lambda: _run_hooks(2.0),
    "hooks_other": lambda: _run_hooks(3.0),  # another hook (its closure): must miss
    "hooks_kwargs": _run_kwargs_hook,
    "const_function": lambda: _run_const_function(_const_fn),
    "const_function_other": lambda: _run_const_function(_const_fn_other),  # another value
    "const_compiled": _run_const_compiled,
    "checkpoint": lambda: _run_checkpoint(0.5),
    "checkpoint_other": lambda: _run_checkpoint(0.25),  # another checkpointed body
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

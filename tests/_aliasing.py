"""Calling one function several times on inputs that alias each other in changing ways,
and comparing the calls with eager's: outputs (shapes and values), the buffers the inputs
view after each call, and the gradients of the leaves they come from. Used by
test_aliased_input_layouts.py and test_fuzz_aliasing_patterns.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

# what aot_module_simplified logs on ``recompiles`` when a call's layout does not fit its
# graph (See Note [Runtime checks of the input layout] in aotkit_frontends)
EAGER_FALLBACK = "runs the module eagerly"

# one call's inputs: (buffers to observe after the call, leaves whose .grad to observe,
# the arguments)
Inputs = tuple[list[torch.Tensor], list[torch.Tensor], tuple[Any, ...]]


def _call(fn: Callable[..., Any], inputs: Inputs) -> Any:
    buffers, leaves, args = inputs
    out = fn(*args)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    grads = None
    if leaves:
        weighted = [
            (o * (torch.arange(o.numel()).reshape(o.shape) + 1.0)).sum()
            for o in outs
            if o.requires_grad
        ]
        if weighted:
            torch.stack(weighted).sum().backward()
        grads = [None if x.grad is None else x.grad.clone() for x in leaves]
    return (
        [(tuple(o.shape), o.detach().clone()) for o in outs],
        [b.detach().clone() for b in buffers],
        grads,
    )


def observe(
    fn: Callable[..., Any], make: Callable[[int], Inputs], n_calls: int, *, catch: bool = False
) -> list[Any]:
    """Per call: the outputs (shapes, values), the buffers after the call and the leaves'
    gradients after a backward of every output that requires grad (with fixed cotangents);
    with ``catch``, a call that raises is recorded as ``("raised", type name, message)``."""
    seen: list[Any] = []
    for k in range(n_calls):
        inputs = make(k)
        if not catch:
            seen.append(_call(fn, inputs))
            continue
        try:
            seen.append(_call(fn, inputs))
        except Exception as e:  # compared with eager's outcome
            seen.append(("raised", type(e).__name__, str(e)))
    return seen


def differences(expected: Sequence[Any], got: Sequence[Any], who: str) -> list[str]:
    """Every difference between two ``observe`` records."""
    problems: list[str] = []
    for call, (e, g) in enumerate(zip(expected, got, strict=True)):
        where = f"{who}, call {call}"
        if e[0] == "raised" or g[0] == "raised":
            if (e[0] == "raised") != (g[0] == "raised"):
                problems.append(f"{where}: eager {_outcome(e)}, compiled {_outcome(g)}")
            continue
        (e_outs, e_bufs, e_grads), (g_outs, g_bufs, g_grads) = e, g
        if [s for s, _ in g_outs] != [s for s, _ in e_outs]:
            problems.append(
                f"{where}: output shapes {[s for s, _ in g_outs]}, eager {[s for s, _ in e_outs]}"
            )
            continue
        for j, ((_, ev), (_, gv)) in enumerate(zip(e_outs, g_outs, strict=True)):
            if not torch.allclose(gv, ev, equal_nan=True):
                problems.append(f"{where}: output {j} {gv.tolist()}, eager {ev.tolist()}")
        for j, (eb, gb) in enumerate(zip(e_bufs, g_bufs, strict=True)):
            if not torch.allclose(gb, eb, equal_nan=True):
                problems.append(f"{where}: buffer {j} {gb.tolist()}, eager {eb.tolist()}")
        if (e_grads is None) != (g_grads is None):
            problems.append(f"{where}: gradients observed in one run only")
            continue
        for j, (eg, gg) in enumerate(zip(e_grads or (), g_grads or (), strict=True)):
            if (eg is None) != (gg is None):
                problems.append(f"{where}: leaf {j}: grad {gg}, eager {eg}")
            elif eg is not None and not torch.allclose(gg, eg, equal_nan=True):
                problems.append(f"{where}: leaf {j}: grad {gg.tolist()}, eager {eg.tolist()}")
    return problems


def _outcome(record: Any) -> str:
    return f"raised {record[1]}: {record[2][:200]}" if record[0] == "raised" else "returned"


def assert_same(expected: Sequence[Any], got: Sequence[Any], who: str) -> None:
    assert len(expected) == len(got)
    problems = differences(expected, got, who)
    assert not problems, "\n".join(problems)

"""Gradients that are differentiable again: the compiled Function's backward when autograd
records a graph (``create_graph=True``).

# Note [Higher-order gradients through compiled code]
# Autograd runs a node's backward with grad mode on exactly when the caller asked for
# create_graph=True. The compiled backward can't serve that call: it runs on the saved
# activations, which the compiled forward made without history, so its gradients would not
# depend on the inputs as autograd sees them. Instead the backward recomputes:
#   * the forward graph (functional ATen), pruned to the differentiable forward returns
#     (the outputs that receive tangents) and the random ops, runs again on the Function's
#     own inputs with grad mode on, so every recomputed value is a differentiable function
#     of the inputs through ATen ops that have derivative formulas;
#   * ``torch.autograd.grad(recomputed returns, inputs, tangents, create_graph=True)``
#     then gives eager's gradients, with eager's history: they can be differentiated to any
#     order (the history never goes through the compiled Function again), and with
#     aotkit_eager, whose forward graph calls the ops eager calls, they are eager's bits.
# What the forward keeps for this, per call: a reference to its inputs (the tuple
# autograd passes, no copy), the version counters of the inputs the recompute reads that
# are not among the tensors the graph saves anyway (their unpacking checks those), and
# the default generators' states when the forward draws random numbers, so the recompute
# draws the forward's numbers (a dropout mask inside a gradient penalty is the forward's).
# The compiled first-order backward is untouched. A program the recompute can't reproduce
# (See Note [Programs whose backward is not the forward's derivative] in aotkit_capture)
# keeps the error node of Note [Gradients made with create_graph=True], with the reason.
# A recompute input changed in place since the forward (the user's ``w.add_(1)``) raises,
# as eager raises for a saved tensor changed in place.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ._effects import EFFECT_TOKEN


@dataclass(frozen=True)
class HigherOrder:
    """What a compiled Function needs to differentiate its backward; fixed at compile
    time. See Note [Higher-order gradients through compiled code]."""

    # builds (once) the recompute: takes the forward graph's inputs (effect tokens first,
    # passed as None) and returns the differentiable forward returns, in tangent order
    module: Callable[[], Callable[..., Sequence[Any]]]
    num_tokens: int
    # Function inputs whose version counters the forward records (the recompute reads
    # them and no saved tensor checks them)
    versioned: tuple[int, ...]
    # the forward draws random numbers: the generators' states are recorded
    draws: bool
    # devices named by the random ops themselves (``device=``), besides the inputs'
    rng_devices: tuple[torch.device, ...] = ()


class RngDevices:
    """The devices whose default generators a drawing forward records: the random ops'
    own and the inputs' (read at the first call; the compile key fixes them)."""

    __slots__ = ("devices", "_static")

    def __init__(self, static: tuple[torch.device, ...]) -> None:
        self._static = static
        self.devices: tuple[torch.device, ...] | None = None

    def of(self, args: Sequence[Any]) -> tuple[torch.device, ...]:
        if self.devices is None:
            found = {torch.device("cpu"), *self._static}
            found.update(a.device for a in args if isinstance(a, torch.Tensor))
            self.devices = tuple(
                sorted((d for d in found if d.type in ("cpu", "cuda")), key=str)
            )
        return self.devices


def rng_states(devices: Sequence[torch.device]) -> list[torch.Tensor]:
    """The default generators' states of ``devices`` (CPU first)."""
    return [
        torch.get_rng_state() if d.type == "cpu" else torch.cuda.get_rng_state(d) for d in devices
    ]


@contextlib.contextmanager
def _replaying(devices: Sequence[torch.device], states: Sequence[torch.Tensor]) -> Iterator[None]:
    """Draw from ``states`` inside; the generators as they were after."""
    now = rng_states(devices)
    for d, s in zip(devices, states, strict=True):
        _set_state(d, s)
    try:
        yield
    finally:
        for d, s in zip(devices, now, strict=True):
            _set_state(d, s)


def _set_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cpu":
        torch.set_rng_state(state)
    else:
        torch.cuda.set_rng_state(state, device)


INPUT_CHANGED = (
    "aotkit: input {i} of this compiled function was modified in place after its forward "
    "ran (version {old}, now {new}). A backward with create_graph=True recomputes the "
    "forward from its inputs and needs their values at the forward. Differentiate before "
    "changing the input, or pass a copy. See Note [Higher-order gradients through "
    "compiled code]."
)


def higher_order_grads(
    ho: HigherOrder,
    module: Callable[..., Sequence[Any]],
    args: Sequence[Any],
    versions: tuple[Sequence[int], Sequence[int]] | None,
    rng: tuple[tuple[torch.device, ...], list[torch.Tensor]] | None,
    tangents: Sequence[Any],
) -> tuple[Any, ...]:
    """The gradients of the Function's inputs, with history (create_graph=True). See Note
    [Higher-order gradients through compiled code]."""
    if versions is not None:
        for i, old in zip(*versions, strict=True):
            new = args[i]._version
            if new != old:
                raise RuntimeError(INPUT_CHANGED.format(i=i, old=old, new=new))
    call = [EFFECT_TOKEN] * ho.num_tokens + list(args)
    # the graph holds the forward's casts already: run as compiled graphs run, without
    # autocast (See Note [Compiled graphs run without autocast] in aotkit_tracing)
    with torch.enable_grad(), torch._C._DisableAutocast():
        if rng is not None:
            with _replaying(*rng):
                outs = module(*call)
        else:
            outs = module(*call)
    del call
    sel_outs, sel_tangents = [], []
    for o, t in zip(outs, tangents, strict=True):
        if t is not None and isinstance(o, torch.Tensor) and o.requires_grad:
            sel_outs.append(o)
            sel_tangents.append(t)
    wrt = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    result: list[Any] = [None] * len(args)
    if not sel_outs or not wrt:
        return tuple(result)
    grads = torch.autograd.grad(
        sel_outs,
        [args[i] for i in wrt],
        sel_tangents,
        allow_unused=True,
        create_graph=True,
    )
    for i, g in zip(wrt, grads, strict=True):
        result[i] = g
    return tuple(result)

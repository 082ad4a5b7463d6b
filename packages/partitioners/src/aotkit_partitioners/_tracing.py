"""Trace small joint graphs for tests, the conformance kit and benchmarks.

The joint graphs follow Note [Joint graph calling convention]: they are traced with make_fx
from ``joint(primals, tangents)``, which runs the user function and then
``torch.autograd.grad``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

TracingMode = Literal["real", "fake", "symbolic"]


@dataclass(frozen=True)
class TracedJoint:
    """A traced joint graph, the inputs it was traced with and its forward-return count."""

    gm: torch.fx.GraphModule
    # length = # placeholders of gm: primals then tangents
    inputs: tuple[Any, ...]
    num_fwd_outputs: int
    # length = # primals
    requires_grad: tuple[bool, ...]

    def __post_init__(self) -> None:
        n_placeholders = len(self.gm.graph.find_nodes(op="placeholder"))
        if n_placeholders != len(self.inputs):
            raise ValueError(f"{n_placeholders} placeholders but {len(self.inputs)} inputs")

    @property
    def primals(self) -> tuple[Any, ...]:
        return self.inputs[: len(self.requires_grad)]

    @property
    def tangents(self) -> tuple[Any, ...]:
        return self.inputs[len(self.requires_grad) :]


def make_joint(
    fn: Callable[..., Any],
    primals: Sequence[Any],
    *,
    tracing_mode: TracingMode = "fake",
) -> TracedJoint:
    """Trace ``fn(*primals)`` together with its backward into one joint graph.

    Tensors in ``primals`` with ``requires_grad=True`` get gradients; the others (and
    non-tensors) get ``None`` in the joint's gradient outputs. ``fn`` returns a tensor or a
    tuple of tensors; every output gets a tangent of its own shape.
    """
    requires_grad = tuple(isinstance(p, torch.Tensor) and p.requires_grad for p in primals)

    def outputs_of(*args: Any) -> tuple[torch.Tensor, ...]:
        out = fn(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def joint(primals: list[Any], tangents: list[torch.Tensor]) -> tuple[Any, ...]:
        outs = outputs_of(*primals)
        diff = [p for p, rg in zip(primals, requires_grad, strict=True) if rg]
        diff_outs = [(o, t) for o, t in zip(outs, tangents, strict=True) if o.requires_grad]
        grads: Sequence[torch.Tensor | None] = [None] * len(diff)
        if diff and diff_outs:
            grads = torch.autograd.grad(
                [o for o, _ in diff_outs], diff, [t for _, t in diff_outs], allow_unused=True
            )
        it = iter(grads)
        return (*outs, *[next(it) if rg else None for rg in requires_grad])

    with torch.enable_grad():
        example = outputs_of(*primals)
    tangents = [torch.randn_like(o) for o in example]
    gm = make_fx(joint, tracing_mode=tracing_mode)(list(primals), tangents)
    return TracedJoint(
        gm=gm,
        inputs=(*primals, *tangents),
        num_fwd_outputs=len(example),
        requires_grad=requires_grad,
    )


def run_joint(traced: TracedJoint, inputs: Sequence[Any] | None = None) -> list[Any]:
    """Run the joint graph itself: the reference a partition must reproduce."""
    args = list(traced.inputs if inputs is None else inputs)
    n = len(traced.requires_grad)
    out = traced.gm(args[:n], args[n:])
    return list(out)


def run_partition(
    fw: torch.fx.GraphModule,
    bw: torch.fx.GraphModule,
    num_fwd_outputs: int,
    inputs: Sequence[Any],
    num_primals: int,
) -> list[Any]:
    """Run a forward/backward pair the way the runtime does; returns the joint's outputs.

    See Note [Joint graph calling convention]: the forward returns
    ``(*fwd_returns, *saved_tensors, *saved_symints)`` and the backward takes
    ``(*saved_symints, *saved_tensors, *tangents)``.
    """
    primals, tangents = list(inputs[:num_primals]), list(inputs[num_primals:])
    fw_out = list(fw(*primals))
    saved = fw_out[num_fwd_outputs:]
    n_symints = sum(
        1
        for v in saved
        if isinstance(v, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool))
    )
    tensors, symints = saved[: len(saved) - n_symints], saved[len(saved) - n_symints :]
    grads = list(bw(*symints, *tensors, *tangents))
    return fw_out[:num_fwd_outputs] + grads

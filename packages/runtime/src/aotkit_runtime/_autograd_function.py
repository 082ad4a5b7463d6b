"""The generated torch.autograd.Function that runs a compiled forward and backward.

See Note [Forward graph calling convention] for the layout of the forward's outputs and
the backward's inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from aotkit_schemas import ViewAndMutationMeta

from ._call import as_list_caller

_DOUBLE_BACKWARD_ERROR = (
    "aotkit: the compiled backward of this function is not differentiable twice. "
    "Gradients made with create_graph=True can't be differentiated again through an "
    "aot_function/aot_module call. Compute higher-order gradients eagerly, or compile "
    "the function that already contains the first torch.autograd.grad call."
)


@dataclass(frozen=True)
class AutogradPlan:
    """What the autograd.Function needs, fixed at compile time."""

    meta: ViewAndMutationMeta
    num_saved_tensors: int
    num_saved_symints: int
    # one flag per compiled input: does it get a gradient slot
    num_inputs: int

    def __post_init__(self) -> None:
        assert self.meta.is_train, "an AutogradPlan needs training metadata"


def make_autograd_function(
    compiled_fw: Callable[..., Any],
    compiled_bw: Callable[[], Callable[..., Any]],
    plan: AutogradPlan,
) -> Callable[[list[Any]], tuple[Any, ...]]:
    """Build ``run(args) -> forward returns`` that records one autograd node per call.

    ``compiled_bw`` is a thunk returning the compiled backward (compiled on first use).
    """
    fw = as_list_caller(compiled_fw)
    meta = plan.meta
    n_returns = meta.num_forward_returns
    n_tensors = plan.num_saved_tensors
    tangent_positions = meta.tangent_indices
    non_diff_positions = tuple(i for i in range(n_returns) if i not in set(tangent_positions))
    bw_holder: list[Callable[[list[Any]], Sequence[Any]]] = []

    class CompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *args: Any) -> Any:
            outs = fw(list(args))
            saved_tensors = outs[n_returns : n_returns + n_tensors]
            ctx.save_for_backward(*saved_tensors)
            ctx.saved_symints = tuple(outs[n_returns + n_tensors :])
            returns = tuple(outs[:n_returns])
            non_diff = [
                returns[i] for i in non_diff_positions if isinstance(returns[i], torch.Tensor)
            ]
            if non_diff:
                ctx.mark_non_differentiable(*non_diff)
            return returns

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            if not bw_holder:
                bw_holder.append(as_list_caller(compiled_bw()))
            tangents = [_as_tangent(grads[i]) for i in tangent_positions]
            all_args = [*ctx.saved_symints, *ctx.saved_tensors, *tangents]
            if torch.is_grad_enabled() and any(
                isinstance(t, torch.Tensor) and t.requires_grad for t in all_args
            ):
                with torch.no_grad():
                    in_grads = bw_holder[0](all_args)
                return tuple(_delay_error(g) for g in in_grads)
            return tuple(bw_holder[0](all_args))

    def run(args: list[Any]) -> tuple[Any, ...]:
        out: tuple[Any, ...] = CompiledFunction.apply(*args)
        return out

    return run


def _as_tangent(g: Any) -> Any:
    if isinstance(g, torch.Tensor) and not g.is_contiguous():
        return g.contiguous()
    return g


def _delay_error(g: Any) -> Any:
    """Attach an error node so that differentiating ``g`` again raises. See
    _DOUBLE_BACKWARD_ERROR."""
    if not isinstance(g, torch.Tensor):
        return g
    # DelayedError only records a node when its input requires grad.
    g = g.detach().requires_grad_(True)
    delayed: Any = torch._C._functions.DelayedError(_DOUBLE_BACKWARD_ERROR, 1)
    return delayed(g)

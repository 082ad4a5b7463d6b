"""The pieces both joint traces (functionalized in ``_trace``, unfunctionalized in
``_unfunctionalized``) share: the flat function run on functional inputs, and the primals'
gradients with the outputs that could not be differentiated."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from aotkit_schemas import (
    InputAliasInfo,
    MutationType,
    OutputType,
    ViewAndMutationMeta,
)

from aotkit_tracing.autocast._autocast import backward_autocast
from aotkit_tracing.autocast._autocast_cache import (
    check_leaf_flags,
    eager_cast_cache,
    wrapped_as_leaf,
)

from ._backward_errors import error_record, raised_by_custom_backward
from ._node_meta import backward_node_meta

FlatFn = Callable[..., Sequence[Any]]


def _fresh_input(arg: Any, info: InputAliasInfo, leaf: bool = False) -> Any:
    """An input that autograd can differentiate through after the function mutates it.

    torch.autograd.grad must see the value *before* the mutation, so, as in torch, a
    data-mutated input that requires grad after the call (``x.add_(y)`` makes ``x``
    require grad when ``y`` does) is replaced by a clone, and a metadata-mutated input by a
    trivial view, before the user's function runs.
    """
    if not isinstance(arg, torch.Tensor):
        return arg
    if info.mutates_data and info.requires_grad:
        if leaf:  # See Note [Autocast's cast cache in the trace]
            with torch.no_grad():
                fresh = _clone_keeping_strides(arg)
            return fresh.requires_grad_(True)
        return _clone_keeping_strides(arg)
    if info.mutates_metadata:
        return arg.view(arg.shape)
    return arg


def _clone_keeping_strides(arg: torch.Tensor) -> torch.Tensor:
    """A clone of ``arg`` with ``arg``'s strides. See Note [Fresh inputs keep their strides]."""
    out = arg.clone()
    strides = arg.stride()
    if any(isinstance(s, torch.SymInt) for s in strides) or out.stride() == strides:
        return out
    if any(st == 0 and n > 1 for n, st in zip(arg.size(), strides, strict=True)):
        return out  # overlapping memory cannot be written (eager rejects the mutation too)
    fresh = arg.new_empty_strided(arg.size(), strides)
    return fresh.copy_(arg)


# Note [Fresh inputs keep their strides]
# The function runs on the fresh clone of a data-mutated input that requires grad (see
# ``_fresh_input``), so every view op in the trace sees the clone's layout. ``clone()``
# keeps the strides of a dense input only: a sliced, stepped or expanded input would come
# out contiguous, and then ``reshape`` would trace as a view where eager copies (changing
# which outputs alias the input and how autograd flows through them), and ``view`` would
# succeed where eager raises "view size is not compatible with input tensor's size and
# stride". Such an input is cloned into memory with its own strides (``empty_strided`` +
# ``copy_``), so the trace sees eager's layout. (torch clones with ``clone()``.) Symbolic
# strides keep ``clone()``: comparing them would add guards.


def forward_returns(
    flat_fn: FlatFn,
    f_args: list[Any],
    meta: ViewAndMutationMeta,
    *,
    for_autograd: bool,
    cache_flag: bool = False,
) -> tuple[list[Any], list[Any]]:
    """Run ``flat_fn`` on functional inputs; return (forward returns, inputs as run).
    ``cache_flag``: autocast's cache flag of the caller (See Note [Autocast's cast cache
    in the trace])."""
    run_args = list(f_args)
    if for_autograd:
        for i, info in enumerate(meta.input_info):
            if info.mutation_type is MutationType.MUTATED_OUT_GRAPH:
                run_args[i] = _fresh_input(f_args[i], info, leaf=wrapped_as_leaf(f_args[i]))
    leaves = [wrapped_as_leaf(a) for a in run_args]
    with eager_cast_cache(cache_flag):
        outs = list(flat_fn(*run_args))
    check_leaf_flags(run_args, leaves)
    bases: list[Any] = [None] * meta.num_intermediate_bases
    for o, out_info in zip(outs, meta.output_info, strict=True):
        if out_info.output_type is OutputType.alias_of_intermediate_save_as_output:
            assert out_info.base_idx is not None and isinstance(o, torch.Tensor)
            bases[out_info.base_idx] = o._base
    if any(b is None for b in bases):
        raise RuntimeError(
            "aotkit: the function's outputs alias its intermediates differently on the "
            "second trace than on the first; it is not deterministic under tracing."
        )
    mutated = [run_args[i] for i in meta.mutated_inp_runtime_indices]
    return [*mutated, *outs, *bases], run_args


# Note [An output that is a kept-mutated input]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# ``def f(a, b): return torch.sin(a, out=b)`` returns its input ``b``, and the inference
# graph keeps b's mutation as ``copy_(b, sin)``. torch's graph then returns the ``copy_``
# node (the input itself, written), not ``sin``; aotkit returns the input after its kept
# write too, so the graph text is torch's. The values are the same either way; the
# runtime regenerates outputs that alias inputs from the inputs.


# Note [Backward paths through stale saved values]
# An output can depend on a value autograd saved before the function modified it in place
# (``y = x.sin(); x.add_(1); buf.add_(y.mean())``: ``buf``'s gradient needs sin's saved
# ``x``). Eager raises autograd's "modified by an inplace operation" error only if the user
# backpropagates through that output. The joint graph differentiates every
# tangent-receiving output at trace time, so when that raises, each output is
# differentiated on its own; the ones that fail are left out of the joint (their tangents
# go unused) and recorded in ``gm.meta[STALE_TANGENTS_KEY]`` (tangent index -> autograd's
# message). The compiled backward raises the same message when it receives a gradient for
# one of those outputs, so the error appears exactly when eager's would, and after the
# gradients autograd accumulates before reaching a node (``return y, leaf``: the leaf's
# ``.grad`` is set, then backward raises, as in eager).
#
# The same holds for every error a backward node raises when autograd reaches it and only
# then, which the joint would otherwise raise at the call: a custom op registered without
# an autograd formula (``torch.library.custom_op`` with no ``register_autograd``: the
# forward runs, and eager's "Trying to backward through ... but no autograd formula was
# registered" comes at backward, and only through outputs computed from the op), and an
# error the user's ``autograd.Function.backward`` raises (Note [Errors raised by a custom
# backward]). Each is recorded as its class and message (Note [Deferred backward errors]
# in aotkit_runtime).
STALE_TANGENTS_KEY = "aotkit_stale_tangents"
_RAISED_WHEN_REACHED = (
    "modified by an inplace operation",
    "but no autograd formula was registered",
)


def _raised_when_reached(e: Exception) -> bool:
    """Whether eager raises ``e`` only when a backward reaches the node that raised it."""
    if raised_by_custom_backward(e):  # See Note [Errors raised by a custom backward]
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and any(m in text for m in _RAISED_WHEN_REACHED)


def primal_grads(
    outs_and_tangents: Sequence[tuple[int, torch.Tensor, torch.Tensor]],
    f_primals: Sequence[Any],
) -> tuple[list[Any], dict[int, tuple[str, str]]]:
    """Gradients of the outputs for every primal (None where it does not require grad),
    and the outputs that could not be differentiated (See Note [Backward paths through
    stale saved values])."""
    grads: list[Any] = [None] * len(f_primals)
    diff = [
        (i, p) for i, p in enumerate(f_primals) if isinstance(p, torch.Tensor) and p.requires_grad
    ]
    if not outs_and_tangents or not diff:
        return grads, {}
    # See Note [Preserved node meta] and Note [Autocast in the backward trace]
    with backward_node_meta([o for _, o, _ in outs_and_tangents]), backward_autocast():
        computed, failed = _input_grads(outs_and_tangents, [p for _, p in diff])
    for (i, _), g in zip(diff, computed, strict=True):
        grads[i] = g
    return grads, failed


def _input_grads(
    outs_and_tangents: Sequence[tuple[int, torch.Tensor, torch.Tensor]],
    inputs: Sequence[torch.Tensor],
) -> tuple[list[Any], dict[int, tuple[str, str]]]:
    """Gradients of the outputs w.r.t. ``inputs``; see Note [Backward paths through stale
    saved values] for the outputs that cannot be differentiated."""
    try:
        return list(
            torch.autograd.grad(
                [o for _, o, _ in outs_and_tangents],
                list(inputs),
                grad_outputs=[t for _, _, t in outs_and_tangents],
                allow_unused=True,
                retain_graph=True,
            )
        ), {}
    except Exception as e:
        if not _raised_when_reached(e):
            raise
    totals: list[Any] = [None] * len(inputs)
    failed: dict[int, tuple[str, str]] = {}
    for k, out, tangent in outs_and_tangents:
        try:
            partial = torch.autograd.grad(
                [out], list(inputs), grad_outputs=[tangent], allow_unused=True, retain_graph=True
            )
        except Exception as e:
            if not _raised_when_reached(e):
                raise
            failed[k] = error_record(e)
            continue
        totals = [
            g if total is None else (total if g is None else total + g)
            for total, g in zip(totals, partial, strict=True)
        ]
    return totals, failed

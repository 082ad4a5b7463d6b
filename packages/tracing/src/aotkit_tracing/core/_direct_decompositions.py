"""Fake kernels of a few backward ops run without re-entering FakeTensorMode per inner op.

# Note [Decompositions run directly on meta]
# FakeTensorMode computes the output of an op such as ``native_batch_norm_backward`` (one
# that has no C++ meta kernel it trusts and a decomposition in ``torch._decomp``) by
# running the decomposition *under the fake mode*: each of its 10-20 inner ops is a fake
# dispatch of its own, with a cache key built, a cache miss on first sight, and the inner
# op's own Python reference run under ``in_kernel_invocation_manager``. On the convnets
# those ops appear only in the backward and miss the cache (torch's AOTAutograd misses them
# too): about 9 ms per ``native_batch_norm_backward``, 1.5 ms per ``threshold_backward``
# on this machine, most of it the fake-mode layer around the inner ops.
#
# During aotkit's joint traces (``direct_decompositions``), a cache miss of an op in
# ``DIRECT_OPS`` runs the *same* decomposition function once, inside
# ``in_kernel_invocation_manager``: the inner ops go straight to their meta kernels (the
# same references the fake route ends in), and the outputs are wrapped as FakeTensors by
# the fake mode's own ``wrap_meta_outputs_with_default_device_logic``, as for any op with
# a meta kernel. The fake-tensor cache still stores the result (the hook replaces only the
# miss path, ``_dispatch_impl`` of that FakeTensorMode instance, for the duration of the
# trace) and hits are untouched, so the graphs and every node's value metadata are the same.
#
# An op is in ``DIRECT_OPS`` only after its outputs (shape, strides, storage offset, dtype,
# device, requires_grad, FakeTensor-ness) matched the ordinary fake route on random
# configurations (300 per op when the list was made, 60 per op in the test): ranks 2-5, sizes with 1s, contiguous, channels-last, transposed
# and permuted layouts mixed between arguments, four float dtypes, flags requiring grad
# (tests/test_direct_decompositions.py). The direct route is taken only when every tensor
# argument is a plain FakeTensor of this mode,
# strided, without symbolic sizes or a constant, all on the CPU (where the check ran; a
# device-type branch could differ elsewhere), no argument is symbolic, and the mode
# propagates no real tensors; otherwise, or if the decomposition raises, the ordinary
# route runs (and raises its own error).
#
# Note [The forward's batch norm directly on meta]
# The one forward op in ``DIRECT_OPS``: ``_native_batch_norm_legit_functional``, which the
# functionalized trace makes of every BatchNorm in training. Dynamo ran the mutating
# ``_native_batch_norm_legit`` instead, so each BatchNorm shape misses the fake cache in
# both AOT layers; on efficientnet_b0 its 19 misses cost about 100-150 ms of the layer (the
# fake route's 15 inner fake dispatches, each with its cache key). Its decomposition
# branches on ``input.device.type``, which inside the kernel invocation reports the meta
# device, so only the branch-free case is routed (``_batch_norm_branch_free``): training
# mode (eval mode gives ``(C,)`` saved statistics on meta, ``(0,)`` on CPU) and an input
# of float32 or float64 (the CPU branch casts the saved statistics to the input's dtype,
# a no-op only when that is the computation dtype; half types compute in float32). Both
# routes run the decomposition with the same dispatch-key state, so an output requires
# grad on the direct route exactly when autograd ran inside it; the direct route then
# steps aside (``NotImplemented``) rather than trust ``wrap_meta_outputs`` with the flag:
# in the joint traces autograd sits above functionalization and no output requires grad.
# Validated like the others (tests/test_direct_decompositions.py), with and without
# autograd's keys excluded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import (
    FakeTensor,
    FakeTensorMode,
    in_kernel_invocation_manager,
)

__all__ = ["DIRECT_OPS", "direct_decompositions", "fake_mode_of"]

_aten = torch.ops.aten

# See Note [Decompositions run directly on meta]: each validated against the fake route
DIRECT_OPS: frozenset[torch._ops.OpOverload] = frozenset(
    {
        _aten.native_batch_norm_backward.default,
        _aten.native_layer_norm_backward.default,
        _aten.threshold_backward.default,
        _aten.nll_loss_backward.default,
        _aten._log_softmax_backward_data.default,
        _aten._softmax_backward_data.default,
        _aten.gelu_backward.default,
        _aten.sigmoid_backward.default,
        _aten.tanh_backward.default,
        _aten.silu_backward.default,
        _aten.hardswish_backward.default,
        _aten.hardsigmoid_backward.default,
        _aten.leaky_relu_backward.default,
        _aten.softplus_backward.default,
        _aten.native_dropout_backward.default,
        # See Note [The forward's batch norm directly on meta]
        _aten._native_batch_norm_legit_functional.default,
    }
)

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _decomposition(func: Any) -> Callable[..., Any] | None:
    if func not in DIRECT_OPS:
        return None
    from torch._decomp import decomposition_table

    return decomposition_table.get(func)


def _batch_norm_branch_free(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """See Note [The forward's batch norm directly on meta]."""
    if kwargs or len(args) != 8:
        return False
    x, training = args[0], args[5]
    return (
        training is True
        and isinstance(x, torch.Tensor)
        and x.dtype in (torch.float32, torch.float64)
    )


# ops whose decomposition branches on the device: the arguments for which it does not
_CONDITIONS: dict[Any, Callable[[Sequence[Any], Mapping[str, Any]], bool]] = {
    _aten._native_batch_norm_legit_functional.default: _batch_norm_branch_free,
}


def _eligible(mode: FakeTensorMode, flat: Sequence[Any]) -> bool:
    device = None
    for a in flat:
        if isinstance(a, torch.Tensor):
            if (
                type(a) is not FakeTensor
                or a.fake_mode is not mode
                or a.constant is not None
                or a.layout is not torch.strided
                or a._has_symbolic_sizes_strides
            ):
                return False
            if device is None:
                device = a.device
            elif a.device != device:
                return False
        elif isinstance(a, _SYMBOLIC):
            return False
    # validated on CPU only; inside the kernel invocation a FakeTensor reports the meta
    # device, so a decomposition that branched on the device could differ elsewhere
    return device is not None and device.type == "cpu"


def run_directly(
    mode: FakeTensorMode,
    func: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> Any:
    """The op's fake outputs by its decomposition on meta, or NotImplemented when the
    ordinary route must run. See Note [Decompositions run directly on meta]."""
    decomp = _decomposition(func)
    if decomp is None or mode.propagate_real_tensors:
        return NotImplemented
    condition = _CONDITIONS.get(func)
    if condition is not None and not condition(args, kwargs):
        return NotImplemented
    flat = pytree.tree_leaves((args, kwargs))
    if not _eligible(mode, flat):
        return NotImplemented
    try:
        with in_kernel_invocation_manager(mode):
            out = decomp(*args, **kwargs)
    except Exception:
        return NotImplemented  # the ordinary route raises its own error
    if condition is not None and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in pytree.tree_leaves(out)
    ):
        return NotImplemented  # See Note [The forward's batch norm directly on meta]
    # the same call FakeTensorMode makes after running a meta kernel
    return mode.wrap_meta_outputs_with_default_device_logic(
        out,
        func,
        flat,
        device=kwargs.get("device"),  # type: ignore[arg-type]
    )


def fake_mode_of(args: Sequence[Any]) -> FakeTensorMode | None:
    """The fake mode of the first FakeTensor among ``args`` (a subclass's inner tensors are
    not searched: no direct route for those traces)."""
    for a in args:
        if type(a) is FakeTensor:
            return a.fake_mode
    return None


@contextlib.contextmanager
def direct_decompositions(mode: FakeTensorMode | None) -> Iterator[None]:
    """Within the block, ``mode``'s cache misses of ``DIRECT_OPS`` run their decomposition
    directly on meta. See Note [Decompositions run directly on meta]."""
    if mode is None or "_dispatch_impl" in vars(mode):  # none, or already (a nested trace)
        yield
        return
    ordinary = mode._dispatch_impl

    def dispatch(
        func: Any, types: Sequence[type], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        if func in DIRECT_OPS:
            out = run_directly(mode, func, args, kwargs)
            if out is not NotImplemented:
                return out
        return ordinary(func, types, args, kwargs)

    mode._dispatch_impl = dispatch  # type: ignore[method-assign]
    try:
        yield
    finally:
        del mode._dispatch_impl

"""The ``copy_`` of an input mutation kept in the graph, recorded without dispatching it.

# Note [Kept mutations recorded directly]
# An input mutation that stays in the graph ends the trace as ``copy_(primals_k, new)``
# (See Note [Input mutations kept in the training graph] in ``_trace``). Dispatched through
# make_fx, each such ``copy_`` passes every mode on the stack, the fake tensor's kernel (not
# cached: it mutates) and make_fx's argument handling, about 0.5 ms apiece: BatchNorm
# models keep three per layer (``running_mean``, ``running_var``, ``num_batches_tracked``),
# 60 on resnet18. ``record_kept_copy`` records the node itself, as make_fx would: the
# tracer's ``create_proxy`` with make_fx's node name (so the ambient node meta, stack traces
# and module stack follow the same path), then make_fx's ``track_tensor_tree`` (``val`` and
# ``tensor_meta``; the input now maps to the ``copy_`` node), and the input's version
# counter moves as the fake kernel's would. Only for the plain case, where the dispatched
# ``copy_`` cannot raise, record anything else, or change autograd state: two fake tensors
# of the same mode, static and equal sizes, dtype and device, distinct storages, no
# internal overlap in the destination, both tracked by the tracer (neither a constant),
# grad mode off or neither requiring grad, make_fx's plain tracer (not pre-dispatch), only
# make_fx's own modes (proxy, fake, its metadata torch function mode) and aotkit's
# RNG-keying mode on the stacks, and ``copy_`` not decomposed. Anything else is dispatched
# as before.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.proxy_tensor import (
    PythonKeyTracer,
    TorchFunctionMetadataMode,
    get_proxy_mode,
    get_proxy_slot,
    track_tensor_tree,
)
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from aotkit_tracing._rng_replay import is_rng_keying_mode

_COPY = torch.ops.aten.copy_.default


def record_kept_copy(original: torch.Tensor, new: torch.Tensor, *, bump_version: bool) -> bool:
    """Record ``original.copy_(new)`` in the graph make_fx is building, without running it;
    False (nothing done) when it must be dispatched. See Note [Kept mutations recorded
    directly]."""
    mode = get_proxy_mode()
    if mode is None or mode.pre_dispatch or type(mode.tracer) is not PythonKeyTracer:
        return False
    torch_function_modes = torch.overrides._get_current_function_mode_stack()  # type: ignore[no-untyped-call]
    if not all(type(m) is TorchFunctionMetadataMode for m in torch_function_modes):
        return False  # a torch function mode of the caller's would see the copy_
    with torch._C.DisableTorchFunction():  # make_fx's metadata mode: no op runs here
        return _record(mode, original, new, bump_version)


def _record(mode: Any, original: torch.Tensor, new: torch.Tensor, bump_version: bool) -> bool:
    if not _plain_pair(original, new) or _COPY in mode.decomposition_table:
        return False
    fake_mode = original.fake_mode  # type: ignore[attr-defined]
    if not all(
        m is mode or m is fake_mode or is_rng_keying_mode(m)
        for m in _get_current_dispatch_mode_stack()
    ):
        return False
    tracer = mode.tracer
    dst: Any = get_proxy_slot(original, tracer, None)
    src: Any = get_proxy_slot(new, tracer, None)
    if dst is None or src is None or dst.constant is not None or src.constant is not None:
        return False
    name = tracer.graph._target_to_str("copy_")
    proxy = tracer.create_proxy("call_function", _COPY, (dst.proxy, src.proxy), {}, name=name)
    if bump_version:
        torch.autograd.graph.increment_version(original)
    # below autograd, as inside a dispatch: ``val`` is a detached snapshot with a version
    # counter of its own, as make_fx records it
    with torch._C._AutoDispatchBelowADInplaceOrView():
        track_tensor_tree(original, proxy, constant=None, tracer=tracer)
    return True


def _plain_pair(original: torch.Tensor, new: torch.Tensor) -> bool:
    if type(original) is not FakeTensor or type(new) is not FakeTensor:
        return False
    if original.fake_mode is not new.fake_mode or new is original:
        return False
    if torch.is_grad_enabled() and (original.requires_grad or new.requires_grad):
        return False
    if original.dtype != new.dtype or original.device != new.device:
        return False
    sizes = (
        *original.shape, *original.stride(), original.storage_offset(), *new.shape, *new.stride()
    )
    if not all(type(s) is int for s in sizes) or original.shape != new.shape:
        return False
    if torch._C._is_alias_of(original, new):  # type: ignore[attr-defined]
        return False
    return torch._debug_has_internal_overlap(original) == 0

"""Inputs whose ``.data`` or ``requires_grad`` the traced function changes.

# Note [Input changes no graph records]
# Two things a function can do to a tensor input bypass the dispatcher, so neither
# functionalization nor any graph sees them:
#   * ``x.data = y`` (``set_data``) rebinds the input to another tensor: eager leaves the
#     caller's tensor holding ``y``'s storage, shape and values, and every later use in the
#     function reads ``y``. The compiled function kept the caller's tensor untouched and,
#     since the trace saw the rebind only on its own wrapper, computed the outputs from
#     values and shapes that belong to neither (``x.data = torch.zeros(5); return x * 3``
#     returned 3 elements where eager returns 5). torch's AOTAutograd does the same.
#   * ``x.requires_grad_()`` / ``x.requires_grad = True`` on an input that does not require
#     grad (it stays a leaf, unlike ``x.copy_(y)`` from a ``y`` that requires grad, which
#     autograd records and aotkit replays): eager then records the function's ops on
#     ``x``, and the caller's ``x`` requires grad afterwards and receives ``.grad``. The
#     compiled function was keyed and traced with ``x`` not requiring grad, so its outputs
#     came back without ``requires_grad`` and the gradient was silently lost (torch too).
# Neither can be replayed by a graph, so every trace of the function checks each tensor
# input after the function returns: its storage must be the one it had on entry unless
# functionalization recorded a ``set_`` (which it replays), and it must not have become a
# leaf that requires grad. Otherwise the trace raises ``InputRebindError`` naming the
# input and the fix. ``x.requires_grad_(False)`` on an input that requires grad fails in
# the trace already (the traced inputs are not leaves); that error is re-raised as an
# ``InputRebindError`` that says so. Cost: a few attribute reads per input per trace; nothing at run time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.functional_tensor import FunctionalTensor

from ._errors import AOTCompileError

__all__ = ["InputRebindError", "checking_input_rebinds"]

DATA_MESSAGE = (
    "aotkit: the compiled function assigned `.data` of its tensor input {i} "
    "(`x.data = ...`, shape {before} before, {after} after). No graph can record that "
    "assignment (it bypasses the dispatcher), so the compiled function would compute with "
    "the caller's old tensor and leave it unchanged, where eager rebinds it. Remedy: use "
    "an in-place op the graph records (`x.copy_(new)` under `torch.no_grad()` for the same "
    "shape, `x.set_(new)` to take another tensor's storage), or assign `.data` outside "
    "the compiled function."
)

REQUIRES_GRAD_MESSAGE = (
    "aotkit: the compiled function changed `requires_grad` of its tensor input {i} from "
    "{before} to {after} (`x.requires_grad_()` or `x.requires_grad = ...`). The compiled "
    "function is traced for the inputs' `requires_grad` at the call, so the change would "
    "be lost: the caller's tensor would keep its flag and the gradient eager sends to it "
    "would never arrive. Remedy: set `requires_grad` on the tensor before calling the "
    "compiled function (it is then traced as requiring grad and receives its gradient)."
)

_NOT_A_LEAF = "you can only change requires_grad flags of leaf variables"
NOT_A_LEAF_MESSAGE = (
    "aotkit: if that tensor is an input of the compiled function (a leaf in eager), the "
    "function changed its `requires_grad` (`x.requires_grad_(False)`, "
    "`x.requires_grad = False`). The compiled function is traced for the inputs' "
    "`requires_grad` at the call and cannot change it. Remedy: set `requires_grad` before "
    "calling the compiled function, or use `x.detach()` inside it."
)


class InputRebindError(AOTCompileError):
    """The traced function changed an input in a way no graph records (See Note [Input
    changes no graph records])."""


def _storage_id(t: torch.Tensor) -> int | None:
    try:
        return int(torch.Tensor.untyped_storage(t)._cdata)
    except (RuntimeError, NotImplementedError):
        return None


def _set_recorded(t: torch.Tensor) -> bool:
    """Whether functionalization recorded a storage swap (``set_``) on ``t``."""
    inner = t.elem if isinstance(t, FunctionalTensor) else t
    try:
        return bool(torch._functionalize_was_storage_changed(inner))  # type: ignore[attr-defined]
    except RuntimeError:  # not a functional tensor: nothing to tell the two apart
        return True


def checking_input_rebinds(flat_fn: Callable[..., Any]) -> Callable[..., Any]:
    """``flat_fn``, raising ``InputRebindError`` after it returns if it rebound an input's
    ``.data`` or changed its ``requires_grad``. See Note [Input changes no graph records]."""

    @functools.wraps(flat_fn)
    def checked(*args: Any) -> Any:
        before = [
            (i, a, _storage_id(a), tuple(a.shape), a.requires_grad)
            for i, a in enumerate(args)
            if isinstance(a, torch.Tensor)
        ]
        try:
            out = flat_fn(*args)
        except RuntimeError as e:
            # the trace's inputs that require grad are not leaves (eager's are)
            if str(e).startswith(_NOT_A_LEAF) and any(
                isinstance(a, torch.Tensor) and a.requires_grad for a in args
            ):
                raise InputRebindError(f"{e}\n{NOT_A_LEAF_MESSAGE}") from e
            raise
        for i, a, storage, shape, requires_grad in before:
            # an in-place op from a tensor that requires grad (``x.copy_(y)``) also sets the
            # flag, recorded: the input then has a grad_fn. Only a leaf flag is unrecorded.
            if a.requires_grad and not requires_grad and a.grad_fn is None:
                raise InputRebindError(
                    REQUIRES_GRAD_MESSAGE.format(i=i, before=requires_grad, after=a.requires_grad)
                )
            if storage is not None and _storage_id(a) != storage and not _set_recorded(a):
                raise InputRebindError(
                    DATA_MESSAGE.format(i=i, before=list(shape), after=list(a.shape))
                )
        return out

    return checked

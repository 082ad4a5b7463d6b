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
#   * ``x.requires_grad_()`` / ``x.requires_grad = ...`` on an input: the flag is not an
#     op either. The compiled function was keyed and traced with the flag the input had at
#     the call, so the change was lost in silence (torch's AOTAutograd still drops it).
#     aotkit follows it instead: See Note [Inputs whose requires_grad the function
#     changes] in ``_requires_grad_changes``.
# A rebind cannot be replayed by a graph, so every trace of the function checks each
# tensor input after the function returns: its storage must be the one it had on entry
# unless functionalization recorded a ``set_`` (which it replays); otherwise the trace
# raises ``InputRebindError`` naming the input and the fix. A changed flag raises
# ``InputRequiresGradChanged`` (an ``InputRebindError``) carrying the changes, which
# ``compile_flat`` catches to trace again; export raises it to the user. Cost: a few
# attribute reads per input per trace; nothing at run time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch._subclasses.functional_tensor import FunctionalTensor

from aotkit_tracing._errors import AOTCompileError

from ._requires_grad_watch import RequiresGradWatch

__all__ = ["InputRebindError", "InputRequiresGradChanged", "checking_input_rebinds"]

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
    "aotkit: the traced function changed `requires_grad` of its tensor input {i} from "
    "{before} to {after} (`x.requires_grad_()` or `x.requires_grad = ...`). Export traces "
    "for the inputs' `requires_grad` at the call, so the change would be lost: the "
    "caller's tensor would keep its flag and the gradient eager sends to it would never "
    "arrive. Remedy: set `requires_grad` on the tensor before exporting (it is then traced "
    "as requiring grad)."
)

NOT_A_LEAF = "you can only change requires_grad flags of leaf variables"
NOT_A_LEAF_MESSAGE = (
    "aotkit: if that tensor is an input of the compiled function (a leaf in eager), the "
    "function changed its `requires_grad` (`x.requires_grad_(False)`, "
    "`x.requires_grad = False`). Export traces for the inputs' `requires_grad` at the "
    "call and cannot change it. Remedy: set `requires_grad` before calling, or use "
    "`x.detach()` inside the function."
)

USED_BEFORE_MESSAGE = (
    "aotkit: the compiled function used its tensor input {i} (`{use}`) before changing "
    "its `requires_grad` to {flag}. {explanation} Remedy: change `requires_grad` at the "
    "start of the function, before any use of the input (or set it before calling the "
    "compiled function)."
)
_USED_BEFORE_FLIP = (
    "In eager, an in-place write to the input, or a view of it (or the input itself, "
    "returned by an op such as `to` or `contiguous`), made before the change follows the "
    "change in autograd. The compiled function traces the input with its new flag from "
    "the start and runs the other uses made before the change on a detached alias, as "
    "eager computes them, but cannot reproduce a write or a view. See Note [A use of an "
    "input before its flip]."
)
_USED_BEFORE_UNFLIP = (
    "In eager, what the function computed from the input before the change stays "
    "connected to the input in autograd; the compiled function traces the input with its "
    "new flag from the start and cannot reproduce that."
)

TWICE_MESSAGE = (
    "aotkit: the compiled function changed `requires_grad` of its tensor input {i} more "
    "than once. The compiled function follows one change (it traces the input with the "
    "new flag). Remedy: change it once, at the start of the function, or set it before "
    "calling the compiled function."
)

UNFOLLOWED_MESSAGE = (
    "aotkit: the compiled function changed `requires_grad` of its tensor input {i}, but "
    "a second trace, with the input carrying its new flag, did not reach the change. "
    "Remedy: change `requires_grad` at the start of the function, unconditionally, or set "
    "it before calling the compiled function."
)


class InputRebindError(AOTCompileError):
    """The traced function changed an input in a way no graph records (See Note [Input
    changes no graph records])."""


class InputRequiresGradChanged(InputRebindError):
    """The traced function changed ``requires_grad`` of inputs: ``changes`` maps each
    input index to its new flag; None when an input's ``requires_grad_(False)`` failed in
    the trace and the input is not known yet. ``compile_flat`` traces again with the new
    flags (See Note [Inputs whose requires_grad the function changes])."""

    def __init__(self, message: str, changes: dict[int, bool] | None) -> None:
        super().__init__(message)
        self.changes = changes


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


def checking_input_rebinds(
    flat_fn: Callable[..., Any],
    changes: Mapping[int, bool] | None = None,
    watch_all: bool = False,
) -> Callable[..., Any]:
    """``flat_fn``, raising ``InputRebindError`` after it returns if it rebound an input's
    ``.data``, and ``InputRequiresGradChanged`` if it changed an input's ``requires_grad``
    (See Note [Input changes no graph records]).

    ``changes``: inputs traced with the flag the function gives them (input index -> new
    flag), whose flips are followed (See Note [Inputs whose requires_grad the function
    changes]). ``watch_all``: find the input whose ``requires_grad_(False)`` failed in an
    earlier trace."""
    changes = dict(changes or {})

    @functools.wraps(flat_fn)
    def checked(*args: Any) -> Any:
        before = [
            (i, a, _storage_id(a), tuple(a.shape), a.requires_grad)
            for i, a in enumerate(args)
            if isinstance(a, torch.Tensor)
        ]
        watch = (
            RequiresGradWatch(
                args, changes, watch_all, _unseen_flip,
                functools.partial(_used_before, changes), _changed_twice,
            )
            if changes or watch_all else None
        )
        try:
            if watch is None:
                out = flat_fn(*args)
            else:
                with watch:
                    out = flat_fn(*args)
        except RuntimeError as e:
            # the trace's inputs that require grad are not leaves (eager's are)
            if not watch_all and str(e).startswith(NOT_A_LEAF) and any(
                isinstance(a, torch.Tensor) and a.requires_grad for a in args
            ):
                raise InputRequiresGradChanged(f"{e}\n{NOT_A_LEAF_MESSAGE}", None) from e
            raise
        for i, a, storage, shape, _ in before:
            if storage is not None and _storage_id(a) != storage and not _set_recorded(a):
                raise InputRebindError(
                    DATA_MESSAGE.format(i=i, before=list(shape), after=list(a.shape))
                )
        if watch is not None:
            _check_followed(watch)
        flips: dict[int, bool] = {}
        for i, a, _, _, requires_grad in before:
            # an in-place op from a tensor that requires grad (``x.copy_(y)``) also sets the
            # flag, recorded: the input then has a grad_fn. Only a leaf flag is unrecorded.
            if i not in changes and a.requires_grad != requires_grad and a.grad_fn is None:
                flips[i] = a.requires_grad
        if flips:
            i, flag = next(iter(flips.items()))
            raise InputRequiresGradChanged(
                REQUIRES_GRAD_MESSAGE.format(i=i, before=not flag, after=flag), flips
            )
        return out

    return checked


def _unseen_flip(i: int) -> None:
    raise InputRequiresGradChanged(
        REQUIRES_GRAD_MESSAGE.format(i=i, before=True, after=False), {i: False}
    )


def _used_before(changes: Mapping[int, bool], i: int, use: str) -> None:
    flag = changes[i]
    explanation = _USED_BEFORE_FLIP if flag else _USED_BEFORE_UNFLIP
    raise InputRebindError(
        USED_BEFORE_MESSAGE.format(i=i, use=use, flag=flag, explanation=explanation)
    )


def _changed_twice(i: int) -> None:
    raise InputRebindError(TWICE_MESSAGE.format(i=i))


def _check_followed(watch: RequiresGradWatch) -> None:
    unseen = watch.unseen_flips()
    if unseen:
        raise InputRebindError(UNFOLLOWED_MESSAGE.format(i=unseen[0]))

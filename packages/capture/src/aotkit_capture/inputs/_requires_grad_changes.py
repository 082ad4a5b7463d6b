"""Inputs whose ``requires_grad`` the traced function changes: traced with the new flag,
flipped on the caller's tensor at run time.

# Note [Inputs whose requires_grad the function changes]
# ``a.requires_grad_()`` (or ``a.requires_grad = True``) on an input that arrives not
# requiring grad is not an op: no graph records it. In eager, the caller's ``a`` becomes a
# leaf that requires grad, every op after the flip records autograd on it, and
# ``out.backward()`` fills ``a.grad``. torch's AOTAutograd traces ``a`` as not requiring
# grad and drops that gradient in silence. aotkit follows eager:
#   1. Every trace of the function checks the inputs' flags after it returns
#      (``checking_input_rebinds``); a changed flag raises ``InputRequiresGradChanged``
#      with {input index: new flag}.
#   2. ``compile_following_flips`` catches it and traces again with the caller's tensors
#      carrying their new flags for the duration of the compile (put back afterwards,
#      whether it succeeds or not), so fakification, the metadata pass and the joint
#      trace all see ``a`` as requiring grad: its gradient is a graph output as for any
#      input that requires grad. Torch's graph names and numbering follow (``primals_1``
#      is ``a``).
#   3. The compiled entry's runner sets each changed input's flag on the caller's tensor
#      before running the compiled function, so the autograd function's outputs reach
#      ``a`` as eager's do, and ``a`` keeps the flag afterwards. The entry is stored under
#      the key of the flags at the call: a later call whose ``a`` arrives False again
#      reuses it; one whose ``a`` already requires grad is another key, traced with ``a``
#      requiring grad, where the flip is a no-op as in eager.
# The retrace runs the function under ``RequiresGradWatch``, a TorchFunctionMode that
# makes it behave as eager up to the flip: the flip call is a no-op (the input already
# carries the flag) and reads of ``requires_grad``/``is_leaf``/``grad_fn`` give eager's
# answers before it, so ``if not a.requires_grad: a.requires_grad_()`` takes eager's
# branch. Hard cases:
#   * A use of ``a`` before the flip (anything but a shape/dtype/flag query): in eager its
#     result is not connected to ``a`` in autograd; the watch runs it on ``a.detach()``,
#     which gives eager's values and autograd (See Note [A use of an input before its
#     flip] in _requires_grad_watch). A write to ``a`` or a view of it before the flip,
#     and any use before a flip to False, raise ``InputRebindError`` naming the use and
#     the fix (flip first). A second change of the same input raises too.
#   * ``requires_grad_(False)`` on an input that requires grad: the trace cannot run it
#     (its inputs that require grad are not leaves), so the first trace only learns that
#     some input did it; a trace with ``watch_all`` finds which, and the third traces it
#     not requiring grad. On a caller's tensor that is not a leaf, setting the flag
#     raises eager's own error ("you can only change requires_grad flags of leaf
#     variables...") at compile time and at run time; the same call on an intermediate
#     raises that error unchanged.
#   * Under ``no_grad`` the flag changes and the outputs do not require grad, as in eager
#     (the entry is an inference one; grad mode is in the key).
#   * A view input whose base does not require grad is a leaf in eager and flips as one.
#   * The on-disk cache stores the changes with the entry (its key holds the flags at the
#     call) and a restored entry flips as a traced one does.
#   * Export raises ``InputRequiresGradChanged`` to the user: an exported graph has no
#     runner to flip anything.
# Cost: nothing for functions that change no flag; a flipping function pays one or two
# extra traces at compile time and one flag check per changed input per call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from aotkit_schemas import CacheFormatError
from aotkit_tracing import InputRebindError, InputRequiresGradChanged

__all__ = [
    "changes_from_json",
    "compile_following_flips",
    "flipping_runner",
    "temporarily_flipped",
]

Runner = Callable[[list[Any]], Any]


@contextlib.contextmanager
def temporarily_flipped(flat_args: Sequence[Any], changes: Mapping[int, bool]) -> Iterator[None]:
    """The caller's tensors carry their changed flags inside the block, and their own
    after it. Setting the flag raises eager's error for a tensor eager could not change."""
    saved: dict[int, tuple[torch.Tensor, bool]] = {}
    try:
        for i, flag in changes.items():
            t = flat_args[i]
            if not isinstance(t, torch.Tensor):
                raise InputRebindError(f"aotkit: input {i} whose requires_grad changed is not a tensor")
            if id(t) not in saved:
                saved[id(t)] = (t, t.requires_grad)
            if t.requires_grad != flag:
                t.requires_grad_(flag)
        yield
    finally:
        for t, flag in saved.values():
            if t.requires_grad != flag:
                t.requires_grad_(flag)


def flipping_runner(runner: Runner, changes: Mapping[int, bool]) -> Runner:
    """``runner``, setting each changed input's flag on the caller's tensor first. See
    Note [Inputs whose requires_grad the function changes]."""
    items = tuple(sorted(changes.items()))

    def run(args: list[Any]) -> Any:
        for i, flag in items:
            t = args[i]
            if t.requires_grad != flag:
                t.requires_grad_(flag)  # a non-leaf raises eager's error
        return runner(args)

    return run


def compile_following_flips(
    compile_one: Callable[[Mapping[int, bool], bool], tuple[Runner, Any]],
    flat_args: Sequence[Any],
) -> tuple[Runner, Any, dict[int, bool]]:
    """``compile_one(changes, watch_all)`` retried until the function changes no flag the
    trace did not follow. Returns (runner, artifacts, changes); the runner flips the
    caller's tensors when ``changes`` is not empty. See Note [Inputs whose requires_grad
    the function changes]."""
    changes: dict[int, bool] = {}
    watch_all = False
    for _ in range(len(flat_args) + 2):
        try:
            with temporarily_flipped(flat_args, changes):
                runner, artifacts = compile_one(dict(changes), watch_all)
        except InputRequiresGradChanged as e:
            if e.changes is None:
                if watch_all:
                    raise
                watch_all = True
                continue
            new = {i: f for i, f in e.changes.items() if changes.get(i) != f}
            if not new:
                raise
            changes.update(new)
            continue
        if changes:
            runner = flipping_runner(runner, changes)
        return runner, artifacts, changes
    raise InputRebindError(
        "aotkit: the compiled function kept changing `requires_grad` of its inputs from "
        "one trace to the next. Remedy: set `requires_grad` before calling it."
    )


def changes_from_json(value: Any) -> dict[int, bool]:
    """A disk entry's ``requires_grad_changes`` ([[input, flag], ...]) read back."""
    if not isinstance(value, list) or not all(
        isinstance(c, list) and len(c) == 2 and type(c[0]) is int and type(c[1]) is bool
        for c in value
    ):
        raise CacheFormatError("bad requires_grad change list")
    return {c[0]: c[1] for c in value}

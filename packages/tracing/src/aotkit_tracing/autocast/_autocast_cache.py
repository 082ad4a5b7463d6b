"""Autocast's cast cache, reproduced in the traces.

# Note [Autocast's cast cache in the trace]
# Eager autocast caches the casts of some tensors: a float32 tensor that requires grad, is
# an autograd leaf and is not a view, cast to the device's lower-precision dtype (the
# autocast dtype of its device type), while the cache flag is on. The cache is keyed by the
# tensor's identity (not by dtype: a nested region with another dtype gets the first cast
# back), lives until the outermost autocast region exits (``torch.autocast.__exit__``
# clears it when the nesting count drops to 0), and is never invalidated by an in-place
# update of the tensor. So in
#     with torch.autocast("cpu", dtype=torch.bfloat16):
#         a = x @ w; b = a @ w
# a leaf ``w`` is cast once: the graph has one ``_to_copy``, and the backward sums the two
# bf16 gradients before one cast back to float32; and a cast made before
# ``with torch.no_grad(): w.mul_(2)`` is reused after it. Casting at every use gives other
# roundings of ``w``'s gradient, and the updated value where eager reuses the stale cast.
#
# A trace casts at every use unless two things change, and aotkit changes both while the
# user's function runs (the forward part of a joint trace, the single pass, the inference
# trace):
#   * make_fx turns the cache off for its whole trace (a cache that outlived a trace would
#     hand its proxies to the next one). The forward runs with the flag the caller had,
#     read before make_fx starts (the flag is part of the compile key: See Note [Ambient
#     state in the compile key]), and make_fx's setting is put back afterwards. The casts
#     the trace caches are of its own input wrappers, which live only in this trace.
#   * functionalization's input wrappers are not autograd leaves (See Note [Input wrappers
#     that are autograd leaves] in aotkit_functional). Each input that is a leaf for the
#     user (``cast_cache_leaf``: requires grad, no grad_fn, not a view, a plain tensor; for
#     entry points that do not key leafness, a parameter) is wrapped as a leaf, so
#     autocast's own C++ cache applies exactly its own rules (the metadata pass wraps
#     them alike, so both passes see the same ``is_leaf``). A data-mutated one (only
#     possible under no_grad or through ``.data``: eager rejects an in-place write to a
#     leaf that requires grad otherwise) runs on a fresh clone made under no_grad and made
#     a leaf, and its gradient is read there.
# Whether an input is such a leaf is part of the compile key (aotkit_frontends
# ``input_key``), so a graph with one shared cast never runs for a non-leaf ``w``, which
# eager casts at every use.
#
# Left as they are, each pinned by tests/test_autocast_cache.py
# (``test_cast_cache_across_the_graph_boundary``: different from eager in aotkit and in
# torch's aot_eager/aot_function, and the exact values aotkit gives):
#   * torch.compile with a plain leaf tensor (not a parameter) as a graph input: dynamo
#     does not guard leafness, so a graph with one shared cast could later run for a
#     non-leaf that eager casts at every use; the trace casts it at every use, bitwise as
#     torch's aot_eager;
#   * a graph break inside an autocast region splits it into two graphs, each with its own
#     cast, where eager's cache spans the region: bitwise as torch's aot_eager;
#   * when the call itself runs inside an autocast region, eager's cache spans the call,
#     and a weight cast before the call (or after it) in the same region shares that cast
#     with the uses inside the function; the compiled graph casts its own once (torch's
#     casts at every use), bitwise as eager with the outside use in a region of its own.
# All three cross the graph's boundary: the cast would have to be made outside the
# graphs, by eager autocast with its cache, and passed in (the graph's ``_to_copy`` of the
# input replaced by a placeholder, the bf16 gradient returned for eager's own cast node to
# sum and cast back). That is a change of every graph's inputs under autocast and of the
# runtime wrappers, not made yet.
# A trace started inside a region leaves its few cache entries (of its own wrappers, never
# matched again) until that region exits, rather than clearing the user's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from aotkit_functional import is_leaf_input

from aotkit_tracing.inputs._input_rebinds import NOT_A_LEAF_MESSAGE, InputRebindError

_C: Any = torch._C


def cast_cache_leaf(arg: Any) -> bool:
    """Whether eager autocast could cache casts of input ``arg`` (a plain tensor that
    requires grad, is an autograd leaf and is not a view). See Note [Autocast's cast cache
    in the trace]."""
    return is_leaf_input(arg)


def wrapped_as_leaf(f_arg: Any) -> bool:
    """Whether the input wrapper ``f_arg`` was made a leaf (``cast_cache_leaf``)."""
    return isinstance(f_arg, torch.Tensor) and f_arg.requires_grad and f_arg.is_leaf


def check_leaf_flags(f_args: Sequence[Any], leaves: Sequence[bool]) -> None:
    """Raise ``InputRebindError`` if the function cleared ``requires_grad`` of an input
    wrapped as a leaf (eager allows it on a leaf; the graph cannot replay it: See Note
    [Input changes no graph records]). A wrapper that is not a leaf raised already."""
    for i, (f, leaf) in enumerate(zip(f_args, leaves, strict=True)):
        if leaf and not f.requires_grad:
            raise InputRebindError(
                f"aotkit: the compiled function cleared `requires_grad` of its tensor input "
                f"{i}.\n{NOT_A_LEAF_MESSAGE}"
            )


def caller_cache_flag() -> bool:
    """The autocast cache flag outside make_fx (read before the trace starts)."""
    return bool(_C.is_autocast_cache_enabled())


def _nesting() -> int:
    depth = int(_C.autocast_increment_nesting()) - 1
    _C.autocast_decrement_nesting()
    return depth


@contextlib.contextmanager
def eager_cast_cache(enabled: bool) -> Iterator[None]:
    """Run the user's function with autocast's cache flag as the caller had it. See Note
    [Autocast's cast cache in the trace]."""
    previous = _C.is_autocast_cache_enabled()
    if previous == enabled:
        yield
        return
    _C.set_autocast_cache_enabled(enabled)
    try:
        yield
    finally:
        _C.set_autocast_cache_enabled(previous)
        if _nesting() == 0:  # no region is open: eager's cache is empty here too
            _C.clear_autocast_cache()

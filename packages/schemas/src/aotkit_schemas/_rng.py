"""The functionalized-RNG switch shared by capture and the partitioners.

# Note [Functionalized RNG]
# A random op must draw the same numbers wherever its value is computed. Eager autograd runs
# each random op once, in the forward (or, for ``torch.utils.checkpoint``, again in the
# backward after restoring the generator to the state the forward saw). aotkit keeps that
# contract with torch's two RNG higher-order ops (``torch._prims.rng_prims``), on every
# device, CPU included:
#
# * ``run_and_save_rng_state(op, *args)`` returns ``(state, op(*args))``: the generator's
#   state just before ``op`` drew, then the draw. The generator advances exactly as eager's.
# * ``run_with_rng_state(state, op, *args)`` runs ``op`` from ``state`` and then puts the
#   generator back where it was: a replay draws the forward's numbers and leaves the global
#   RNG state untouched, as checkpoint's ``fork_rng`` does.
#
# Two places introduce them:
#
# * capture (``aotkit_tracing._rng_replay``): a random op that runs again from a generator
#   state it already drew from during the trace (checkpoint's recomputation restores it)
#   becomes ``run_with_rng_state`` of the first draw's saved state. See Note [RNG replay
#   keys].
# * the partitioners (``aotkit_partitioners._rng``): a forward random op the backward
#   recomputes (min-cut/memory budget when that saves bytes, or a checkpoint tag) becomes
#   ``run_and_save_rng_state`` in the forward and ``run_with_rng_state`` in the backward;
#   the state is saved like any tensor, after the other saved tensors and before the saved
#   symints. Recomputing costs the state's bytes (5,056 on CPU), never the op's output.
#
# So the global RNG state after forward and backward equals eager's: only forward draws
# advance the generator, replays restore it. With the switch off (``functionalize_rng(False)``)
# random ops are never recomputed (their results are saved), and a checkpointed region
# whose recomputation draws random numbers raises (eager replays the forward's draws;
# See Note [Checkpointed random ops with functionalized RNG off] in aotkit_tracing).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

_ENABLED = [True]


def functionalize_rng_enabled() -> bool:
    """Whether random ops are functionalized. See Note [Functionalized RNG]."""
    return _ENABLED[0]


def set_functionalize_rng(enabled: bool) -> bool:
    """Turn functionalized RNG on or off for later compilations; returns the previous value."""
    previous = _ENABLED[0]
    _ENABLED[0] = bool(enabled)
    return previous


@contextmanager
def functionalize_rng(enabled: bool) -> Iterator[None]:
    """Compile with functionalized RNG on or off inside the block.

    The switch is read when a program is traced and partitioned (the first call of an
    ``aot_function`` for given inputs, ``torch.compile``'s compilation), not when it runs.
    """
    previous = set_functionalize_rng(enabled)
    try:
        yield
    finally:
        set_functionalize_rng(previous)

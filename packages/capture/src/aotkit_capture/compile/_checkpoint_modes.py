"""Selective activation checkpointing traced as eager runs it, when torch's compile-time
treatment of it cannot trace the program.

# Note [Selective checkpointing with in-place ops]
# ``torch.utils.checkpoint`` with a selective-checkpointing ``context_fn``
# (``create_selective_checkpoint_contexts(policy)``) behaves differently under a trace:
# while a proxy mode is active it caches the output of *every* op of the region in the
# forward, tags the traced nodes with the policy (``node.meta["recompute"]``) for the
# partitioner, and hands the cached values back when the backward recomputes the region,
# checking that none was modified since. A region with an in-place op fails that check
# (CPU dropout runs ``empty_like(...).bernoulli_(p).div_(p)``: the cached ``empty_like``
# output is then written to): "Tensor cached during selective activation checkpoint has
# been mutated", where eager, which caches only what the policy saves, runs.
#
# When a compilation fails with that error, it is traced once more with the checkpoint
# treated as in eager: torch's flag for a non-strict make_fx tracing session (which is
# what aotkit's trace is) makes the checkpoint follow its eager path, so the policy's
# saved ops are cached, the others recomputed in the backward (random ops are always
# saved, so a recomputed region replays the forward's dropout mask and the generator
# advances as in eager). Programs whose regions trace the compile-time way keep that way
# (and the partitioner's use of the tags). The flag is global in torch; it is set while
# at least one such retried compilation runs, on any thread, and restored after the last.
#
# Under a trace, the checkpoint's caching mode writes the policy into fx's global
# ``current_meta`` (``recompute``, ``ac_graph_id``) and leaves it there: every later trace
# in the process would tag its nodes as checkpointed (torch's partitioners then fail on
# the stale tags). Every compilation restores ``current_meta`` when it ends
# (``fx_meta_restored``), failed attempts included.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

SAC_MUTATION_MESSAGE = "Tensor cached during selective activation checkpoint has been mutated"

_lock = threading.Lock()
_depth = [0]
_entered: list[contextlib.ExitStack] = []


def fx_meta_restored() -> contextlib.AbstractContextManager[None]:
    """fx's ``current_meta`` as it was, after the block. See Note [Selective checkpointing
    with in-place ops]."""
    import torch.fx.traceback as fx_traceback

    # the flag unchanged: only the saved meta is restored at exit
    return fx_traceback.preserve_node_meta(fx_traceback.should_preserve_node_meta)


def is_sac_mutation_error(e: BaseException) -> bool:
    """Whether ``e`` (or an exception in its chain) is selective checkpointing's cache
    mutation error. See Note [Selective checkpointing with in-place ops]."""
    seen: set[int] = set()
    current: BaseException | None = e
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if SAC_MUTATION_MESSAGE in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


@contextlib.contextmanager
def eager_selective_checkpointing() -> Iterator[None]:
    """Trace selective checkpointing as eager runs it. See Note [Selective checkpointing
    with in-place ops]."""
    context: Any = getattr(torch.compiler, "_non_strict_tracing_context", None)
    if context is None:  # an older torch: nothing to switch
        yield
        return
    with _lock:
        if _depth[0] == 0:
            stack = contextlib.ExitStack()
            stack.enter_context(context())
            _entered.append(stack)
        _depth[0] += 1
    try:
        yield
    finally:
        with _lock:
            _depth[0] -= 1
            if _depth[0] == 0:
                _entered.pop().close()

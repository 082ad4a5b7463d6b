"""Stamps on a cached graph's output node that decide how a compiler compiles the graph,
stored with the graph and given back to the restored one."""

from __future__ import annotations

from typing import Any

import torch.fx
from aotkit_schemas import CacheFormatError

# Note [User-visible output stamps of cached graphs]
# aotkit_inductor's partition step marks the forward's non-saved outputs on the output
# node (``meta["user_visible_output_idxs"]``, Inductor's own key; See Note [Inductor's
# graph roles] in aotkit_backends). The stamp decides how the forward compiles: with it,
# Inductor's layout optimization stays on and the saved activations may come back
# channels-last, and the backward is compiled for the strides the forward reports (See
# Note [Layout optimization in aotkit_inductor] in aotkit_frontends). A restored forward
# carries the stamp, so a warm start compiles it exactly as the cold start did: the same
# settings, hence the stored Inductor artifact of the forward, whose reported strides
# restride the backward's saved inputs as the cold ones were, hence the stored artifact of
# the backward too, and results bitwise equal to the cold start's. Without it the warm
# forward kept eager layouts and both graphs were compiled again, with results that
# differed from the cold start's in the last bits.
_USER_VISIBLE_KEY = "user_visible_output_idxs"


def output_stamp_to_json(node: torch.fx.Node, entry: dict[str, Any]) -> None:
    """See Note [User-visible output stamps of cached graphs]."""
    marked = node.meta.get(_USER_VISIBLE_KEY)
    if isinstance(marked, list) and all(type(i) is int for i in marked):
        entry["user_visible"] = list(marked)


def output_stamp_from_json(node: torch.fx.Node, entry: dict[str, Any]) -> None:
    """See Note [User-visible output stamps of cached graphs]."""
    marked = entry.get("user_visible")
    if marked is None:
        return
    outs = node.args[0] if node.args else None
    n = len(outs) if isinstance(outs, list | tuple) else -1
    if not isinstance(marked, list) or not all(
        type(i) is int and 0 <= i < n for i in marked
    ) or len(set(marked)) != len(marked):
        raise CacheFormatError("bad user-visible outputs of the output node")
    node.meta[_USER_VISIBLE_KEY] = list(marked)

"""The default partitioner: the forward runs what eager forward ran, the rest is backward."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from aotkit_schemas import is_sym_node, mark_cache_key

from ._extract import build_modules
from ._joint import JointInfo, analyze_joint, forward_available, is_primal, sorted_nodes
from ._ops import ban_reason, is_random, must_recompute, mutated_readers
from ._regions import partition_region_boundaries
from ._rng import functional_rng, replay_recomputed_rng_inplace


def forward_region(info: JointInfo) -> set[torch.fx.Node]:
    """The nodes eager autograd would have run in ``.forward()``.

    With ``partitioner_tag`` metadata (set by a tracer that knows where forward ended) the
    forward is every non-backward node up to the last one tagged ``is_forward``. Without
    tags it is every tangent-free node up to the last non-symbolic ancestor of a forward
    return: a joint traced from ``joint(primals, tangents)`` runs ``f`` to completion before
    autograd starts, so graph order separates the two. Symbolic scalars do not count, as
    the tracer materialises a returned size (``return x, y.size()``) only when something
    first needs it as a graph value, which can be well into the backward or at the output:
    counting it would pull every tangent-free backward node before it (``t(weight)``, size
    arithmetic) into the forward. Such a late returned
    size stays out of the region, as it does in torch's: the forward computes it to return
    it, but a backward reading it asks a saved tensor again rather than receiving it. Either
    way the region then takes in the tensors the forward returns and the getitems of its
    tuples (see ``forward_available``).
    """
    if info.has_partitioner_tags:
        marks = [
            i
            for i, n in enumerate(info.nodes)
            if n.meta.get("partitioner_tag") == "is_forward" or is_primal(n)
        ]
    else:
        marks = [info.order[n] for n in info.fw_required if not is_sym_node(n)]
        marks += [info.order[p] for p in info.primals]
    last = max(marks, default=-1)
    region = {
        n
        for n in info.nodes[: last + 1]
        if n not in info.tangent_closure and n.meta.get("partitioner_tag") != "is_backward"
    }
    region |= {n for n in info.fw_required if not is_sym_node(n)}
    return forward_available(info, region)


def saved_values(info: JointInfo, fw_nodes: set[torch.fx.Node]) -> list[torch.fx.Node]:
    """What the forward hands the backward, torch's way (Note [Saving sizes]).

    Every forward value a live backward node reads is saved, except a tensor the backward
    reads only through symbolic-size nodes (``sym_size(x, 0)``): those size nodes are
    saved instead (the forward computes them), so ``x`` need not stay alive. The order is
    torch's: forward nodes in graph order, the sizes read off a tensor where the tensor is.
    """
    saved: list[torch.fx.Node] = []
    for node in info.nodes:
        if node not in fw_nodes:
            continue
        readers = [u for u in node.users if u in info.bw_required and u not in fw_nodes]
        if not readers:
            continue
        if not is_sym_node(node) and all(
            is_sym_node(u)
            and u not in info.tangent_closure
            and all(a in fw_nodes for a in u.all_input_nodes)
            for u in readers
        ):
            saved.extend(readers)
        else:
            saved.append(node)
    return saved


# Note [Saving sizes]
# The default partitioner saves what torch's saves, so compiled forward graphs have the
# same outputs: the forward's own values that the backward reads, tensors first, then
# symbolic scalars (Note [Joint graph calling convention]). Size arithmetic the backward
# does (``0 + s0``, slice bounds of a ``cat`` backward) runs in the backward on the saved
# sizes it starts from rather than being precomputed and saved result by result; a tensor
# the backward reads only for its sizes is replaced by those sizes. The min-cut partitioner
# follows the same convention: a size query the forward makes is never recomputed (Note
# [Recomputation policy]) and sizes cost no bytes (Note [Min-cut flow graph]).


def _honour_checkpoint_tags(
    info: JointInfo, read: list[torch.fx.Node], functional_rng: bool
) -> tuple[list[torch.fx.Node], set[torch.fx.Node]]:
    """Replace values tagged for recomputation (activation checkpointing) by their inputs.

    Returns the values to save and the nodes the backward recomputes. See
    Note [Recomputation policy] for which tags are honoured.
    """
    saved: list[torch.fx.Node] = []
    recomputed: set[torch.fx.Node] = set()
    if not any(must_recompute(n) for n in info.nodes):
        return read, recomputed
    mutated = mutated_readers(list(info.nodes))
    stack = list(reversed(read))
    while stack:
        node = stack.pop()
        if node in recomputed:
            continue
        if (
            must_recompute(node)
            and ban_reason(node, node in mutated, functional_rng=functional_rng) is None
        ):
            recomputed.add(node)
            stack.extend(node.all_input_nodes)
        else:
            saved.append(node)
    return sorted_nodes(info, saved), recomputed


def default_partition(
    joint_module: torch.fx.GraphModule,
    joint_inputs: Any,
    *,
    num_fwd_outputs: int,
    static_lifetime_input_indices: Sequence[int] | None = None,
    functionalize_rng: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """Split ``joint_module`` the way eager autograd splits work between forward and backward.

    The forward graph computes what the user's forward computed; every forward value the
    backward reads is saved (a size rather than a tensor when the backward needs only the
    size); the backward graph recomputes nothing, except values activation checkpointing
    tagged for recomputation; a tagged random op replays the forward's draw when RNG is
    functionalized (``functionalize_rng``; None reads the global switch, see
    Note [Functionalized RNG]). Both graphs are free of dead code.
    See Note [Joint graph calling convention] in ``aotkit_schemas``.

    ``joint_inputs`` is unused and other keyword arguments are accepted and ignored, so the
    function can stand in for torch's ``default_partition``.
    """
    del joint_inputs, kwargs
    # See Note [Partitioning at region boundaries]
    joint_module = partition_region_boundaries(
        joint_module, default_partition, functionalize_rng=functionalize_rng
    )
    info = analyze_joint(joint_module, num_fwd_outputs)
    fw_nodes = forward_region(info)
    read = saved_values(info, fw_nodes)
    functional = functional_rng(functionalize_rng)
    saved, recomputed = _honour_checkpoint_tags(info, read, functional)
    bw_allowed = (set(info.nodes) - fw_nodes) | recomputed
    fw, bw = build_modules(
        info,
        saved,
        fw_allowed=fw_nodes | info.fw_required | set(read),
        bw_allowed=bw_allowed,
        static_lifetime_input_indices=static_lifetime_input_indices,
    )
    if functional and any(is_random(n) for n in recomputed):
        replay_recomputed_rng_inplace(fw, bw, num_fwd_outputs)
    return fw, bw


# See Note [Compiler cache keys] in aotkit_schemas
mark_cache_key(default_partition, "aotkit.default_partition")

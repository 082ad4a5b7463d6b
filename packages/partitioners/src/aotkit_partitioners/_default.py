"""The default partitioner: the forward runs what eager forward ran, the rest is backward."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from ._extract import build_modules
from ._joint import JointInfo, analyze_joint, forward_available, is_primal
from ._ops import ban_reason, must_recompute, mutated_readers


def forward_region(info: JointInfo) -> set[torch.fx.Node]:
    """The nodes eager autograd would have run in ``.forward()``.

    With ``partitioner_tag`` metadata (set by a tracer that knows where forward ended) the
    forward is every non-backward node up to the last one tagged ``is_forward``. Without
    tags it is every tangent-free node up to the last ancestor of a forward return: a joint
    traced from ``joint(primals, tangents)`` runs ``f`` to completion before autograd starts,
    so graph order separates the two. Either way the region then takes in the getitems
    and sizes it can compute (see ``forward_available``).
    """
    if info.has_partitioner_tags:
        marks = [
            i
            for i, n in enumerate(info.nodes)
            if n.meta.get("partitioner_tag") == "is_forward" or is_primal(n)
        ]
    else:
        marks = [info.order[n] for n in info.fw_required] + [info.order[p] for p in info.primals]
    last = max(marks, default=-1)
    region = {
        n
        for n in info.nodes[: last + 1]
        if n not in info.tangent_closure and n.meta.get("partitioner_tag") != "is_backward"
    }
    region |= info.fw_required
    return forward_available(info, region)


def _honour_checkpoint_tags(
    info: JointInfo, read: list[torch.fx.Node]
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
        if must_recompute(node) and ban_reason(node, node in mutated) is None:
            recomputed.add(node)
            stack.extend(node.all_input_nodes)
        else:
            saved.append(node)
    return saved, recomputed


def default_partition(
    joint_module: torch.fx.GraphModule,
    joint_inputs: Any,
    *,
    num_fwd_outputs: int,
    static_lifetime_input_indices: Sequence[int] | None = None,
    **kwargs: Any,
) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """Split ``joint_module`` the way eager autograd splits work between forward and backward.

    The forward graph computes what the user's forward computed; every forward value the
    backward reads is saved (a size rather than a tensor when the backward needs only the
    size); the backward graph recomputes nothing, except values activation checkpointing
    tagged for recomputation. Both graphs are free of dead code.
    See Note [Joint graph calling convention] in ``aotkit_schemas``.

    ``joint_inputs`` is unused and other keyword arguments are accepted and ignored, so the
    function can stand in for torch's ``default_partition``.
    """
    del joint_inputs, kwargs
    info = analyze_joint(joint_module, num_fwd_outputs)
    fw_nodes = forward_region(info)
    read = [
        node
        for node in info.nodes
        if node in fw_nodes and any(u in info.bw_required and u not in fw_nodes for u in node.users)
    ]
    saved, recomputed = _honour_checkpoint_tags(info, read)
    bw_allowed = (set(info.nodes) - fw_nodes) | recomputed
    return build_modules(
        info,
        saved,
        fw_allowed=fw_nodes,
        bw_allowed=bw_allowed,
        static_lifetime_input_indices=static_lifetime_input_indices,
    )

"""The extra recomputation ban for backward graphs a fusing compiler compiles.

# Note [Values a fused backward must materialize]
# The min-cut's cost model (Note [Min-cut flow graph]) treats recomputation as free: it
# recomputes a pointwise chain whenever that saves fewer bytes. For a fusing compiler
# (Inductor) recomputation is free only inside a fused kernel. A recomputed value that a
# backward op outside any pointwise fusion reads (a matmul's operand: the layer-norm output
# feeding the next linear layer's weight gradient) must be written to memory by the
# backward, in its own kernel, which then reads every input of the chain again; saving it
# costs the forward nothing extra (the forward writes it for its own matmul anyway).
# So with ``fusing_compiler=True`` (aotkit_inductor) such a value may not be recomputed,
# as torch's min-cut bans it (its ``ban_recompute_materialized_backward``): a non-view
# forward value some backward reader, looking through views, reads other than through a
# pointwise, view or other allowlisted cheap op (a ``cat`` counts as fusible: it is
# written in place by its producers). The cut saves a few more bytes than without the ban
# and the backward runs fewer kernels.
"""

from __future__ import annotations

import torch
import torch.fx

from ._joint import JointInfo
from ._ops import is_allowlisted, is_view, packet

_CAT = torch.ops.aten.cat


def materialized_in_backward(node: torch.fx.Node, info: JointInfo) -> bool:
    """See Note [Values a fused backward must materialize]."""
    if is_view(node):
        return False
    todo = [node]
    seen = {node}
    while todo:
        cur = todo.pop()
        for user in cur.users:
            if user.op == "output":
                continue
            if user not in info.fw_required and not _fusible(user):
                return True
            if is_view(user) and user not in seen:
                seen.add(user)
                todo.append(user)
    return False


def _fusible(user: torch.fx.Node) -> bool:
    return is_allowlisted(user) or (user.op == "call_function" and packet(user) is _CAT)

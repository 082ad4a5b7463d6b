"""Readers of a forward value that come after a kernel boundary: not recomputed.

# Note [Values read far apart]
# A forward value ``v`` with several forward readers, some close to it and some after a
# kernel boundary (a node the forward cannot fuse with what precedes it: a matmul, a
# convolution, a reduction's consumer), is not recomputed at the far readers. The cost
# model alone (Note [Min-cut flow graph]) would happily rebuild them in the backward from
# ``v`` or from values saved around it: a transformer's residual stream
# ``x_{i+1} = x_i + proj(attn(ln(x_i)))`` is then recomputed sum by sum from the first
# block's input and the saved projection outputs (all written by the forward anyway, so
# cheap by bytes), and every LayerNorm's ``x - mean`` and ``* rstd`` with it. The bytes
# saved are the same, but the backward grows by a dozen pointwise nodes per block that a
# fusing compiler must compile and cannot fuse with their far-apart consumers (vit_tiny
# under aotkit_inductor: a backward of 1,434 nodes against torch's 1,273, ~2 s more
# Inductor compile; issue 18). torch's min-cut has the same rule
# (``torch._functorch.config.ban_recompute_used_far_apart``, on by default); aotkit's is
# this one, formulated on its own:
#
# For each forward value ``v`` with forward readers ``R`` (``last`` = the latest of them in
# graph order), the *boundary* of ``v`` is the earliest node ``w`` (no later than ``last``)
# that some forward path from a reader in ``R`` enters through an edge ``u -> w`` that
# ``fusible(u, w)`` rejects; ``last`` if there is none. A reader ``r`` of ``v`` after the
# boundary that could fuse with ``v`` is banned from recomputation (a soft ban: a memory
# budget may lift it, ``HARD_BANS`` in ``_mincut``). Views, sizes and nodes a checkpoint
# policy wants recomputed are left alone: a view costs nothing to recompute, a size no
# bytes to save, and the policy's choice wins, as in torch.
#
# The walk from ``R`` visits nodes in graph order (a heap): every node on a path to ``w``
# comes before ``w``, so when the walk reaches a node at or after the best boundary found so
# far, no earlier boundary remains and it stops. On vit_tiny's residual stream the rule
# bans each residual sum read after the next attention's matmul; the cut then saves each
# LayerNorm's normalized input and ``rstd / n``, as torch does (backward 1,273 nodes).
"""

from __future__ import annotations

import heapq

import torch.fx
from aotkit_schemas import is_sym_node

from ._joint import JointInfo
from ._ops import fusible, is_view, must_recompute

FAR_APART = "read far from the value's other readers"


def _boundary(
    readers: list[torch.fx.Node],
    last: int,
    fw: frozenset[torch.fx.Node],
    order: dict[torch.fx.Node, int],
) -> int:
    """Graph position of the first kernel boundary after ``readers``, at most ``last``.
    See Note [Values read far apart]."""
    best = last
    heap = [(order[r], i) for i, r in enumerate(readers)]
    nodes = list(readers)
    seen = set(readers)
    heapq.heapify(heap)
    while heap:
        pos, i = heapq.heappop(heap)
        if pos >= best:
            break
        u = nodes[i]
        for w in u.users:
            if w not in fw:
                continue
            p = order[w]
            if p >= best:
                continue
            if not fusible(u, w):
                best = p
            elif w not in seen:
                seen.add(w)
                nodes.append(w)
                heapq.heappush(heap, (p, len(nodes) - 1))
    return best


def far_apart_readers(info: JointInfo) -> set[torch.fx.Node]:
    """Forward nodes the backward should not recompute by Note [Values read far apart]."""
    fw = info.fw_required
    order = info.order
    out: set[torch.fx.Node] = set()
    for v in info.nodes:
        if v not in fw:
            continue
        readers = [u for u in v.users if u in fw]
        if len(readers) < 2:
            continue  # one reader: it is the latest, never after the boundary
        last = max(order[u] for u in readers)
        boundary = _boundary(readers, last, fw, order)
        for r in readers:
            if (
                order[r] > boundary
                and r not in out
                and fusible(v, r)
                and not is_view(r)
                and not is_sym_node(r)
                and not must_recompute(r)
            ):
                out.add(r)
    return out

"""The maximum flow behind min-cut, without networkx.

# Note [Min-cut without networkx]
# Min-cut's flow graph (Note [Min-cut flow graph]) has a few hundred to a few thousand
# vertices. networkx solved it (Boykov-Kolmogorov) after building a DiGraph and a residual
# network of dicts, about a fifth of the partitioner's time on BERT. ``source_side`` runs
# Dinic's algorithm on integer lists instead and returns the same partition networkx's
# ``minimum_cut`` returns: the vertices that cannot reach the sink through edges with
# residual capacity left. That set is the same for every maximum flow (the sink side of
# the minimum cut whose sink side is smallest), so the algorithm that found the flow does
# not change it. Edges with capacity None are infinite, as an edge without a capacity is
# for networkx; repeated edges count once, as in a DiGraph (only infinite edges repeat
# here); a source-to-sink path of infinite edges raises ``Unbounded``, as networkx raises
# NetworkXUnbounded. ``tools/bench/same_graphs.py --variant flow`` checks the zoo's graphs
# against networkx's partition.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence

__all__ = ["Unbounded", "source_side"]


class Unbounded(Exception):
    """Some source-to-sink path has only infinite edges."""


def source_side(
    edges: Sequence[tuple[Hashable, Hashable, int | None]], source: Hashable, sink: Hashable
) -> tuple[set[Hashable], set[Hashable]]:
    """(source side of the minimum cut, every vertex). See Note [Min-cut without networkx]."""
    index: dict[Hashable, int] = {}
    # a DiGraph keeps one edge per (u, v), with the last capacity given (None: infinite)
    caps: dict[tuple[int, int], int | None] = {}
    for u, v, c in edges:
        a = index.setdefault(u, len(index))
        b = index.setdefault(v, len(index))
        if c is not None or (a, b) not in caps:
            caps[(a, b)] = c
    vertices = list(index)
    n = len(vertices)
    finite = [c for c in caps.values() if c is not None]
    inf = 3 * sum(finite) + 1  # above any finite cut
    # edge e and its reverse e ^ 1: head vertex and residual capacity
    head: list[int] = []
    cap: list[int] = []
    adj: list[list[int]] = [[] for _ in range(n)]
    infinite: set[int] = set()
    for (a, b), c in caps.items():
        if c is None:
            infinite.add(len(head))
        adj[a].append(len(head))
        head.append(b)
        cap.append(inf if c is None else c)
        adj[b].append(len(head))
        head.append(a)
        cap.append(0)
    s, t = index[source], index[sink]
    if _reaches(adj, head, s, t, infinite):
        raise Unbounded
    while True:
        level = _levels(adj, head, cap, s)
        if level[t] < 0:
            break
        cursor = [0] * n
        while _augment(adj, head, cap, level, cursor, s, t, inf * (len(head) + 1)):
            pass
    # vertices that reach the sink through edges with residual capacity left
    radj: list[list[int]] = [[] for _ in range(n)]
    for e, b in enumerate(head):
        if cap[e] > 0:
            radj[b].append(e)
    reach_sink = {t}
    queue = deque([t])
    while queue:
        v = queue.popleft()
        for e in radj[v]:
            u = head[e ^ 1]
            if u not in reach_sink:
                reach_sink.add(u)
                queue.append(u)
    everything = set(vertices)
    return {vertices[i] for i in range(n) if i not in reach_sink}, everything


def _reaches(adj: list[list[int]], head: list[int], s: int, t: int, usable: set[int]) -> bool:
    """Whether ``t`` is reachable from ``s`` through ``usable`` edges."""
    seen = {s}
    stack = [s]
    while stack:
        v = stack.pop()
        for e in adj[v]:
            if e not in usable:
                continue
            w = head[e]
            if w == t:
                return True
            if w not in seen:
                seen.add(w)
                stack.append(w)
    return False


def _levels(adj: list[list[int]], head: list[int], cap: list[int], s: int) -> list[int]:
    level = [-1] * len(adj)
    level[s] = 0
    queue = deque([s])
    while queue:
        v = queue.popleft()
        for e in adj[v]:
            w = head[e]
            if cap[e] > 0 and level[w] < 0:
                level[w] = level[v] + 1
                queue.append(w)
    return level


def _augment(
    adj: list[list[int]],
    head: list[int],
    cap: list[int],
    level: list[int],
    cursor: list[int],
    s: int,
    t: int,
    limit: int,
) -> bool:
    """Push one augmenting path along the level graph (iteratively); False if none."""
    path: list[int] = []  # edges
    v = s
    while True:
        if v == t:
            pushed = min(cap[e] for e in path) if path else limit
            for e in path:
                cap[e] -= pushed
                cap[e ^ 1] += pushed
            return True
        edges = adj[v]
        while cursor[v] < len(edges):
            e = edges[cursor[v]]
            w = head[e]
            if cap[e] > 0 and level[w] == level[v] + 1:
                break
            cursor[v] += 1
        else:
            # dead end: retreat
            if not path:
                return False
            level[v] = -1
            e = path.pop()
            v = head[e ^ 1]
            cursor[v] += 1
            continue
        path.append(edges[cursor[v]])
        v = head[edges[cursor[v]]]

"""min-cut's own maximum flow gives networkx's partition (Note [Min-cut without networkx])."""

from __future__ import annotations

import random

import networkx as nx
import pytest
from aotkit_partitioners._flow import Unbounded, source_side

S, T = -1, -2


def _networkx(edges: list[tuple[int, int, int | None]]) -> tuple[set[int], set[int]] | None:
    g: nx.DiGraph = nx.DiGraph()
    g.add_edges_from((u, v, {} if c is None else {"capacity": c}) for u, v, c in edges)
    try:
        _, (reachable, _) = nx.minimum_cut(g, S, T, flow_func=nx.algorithms.flow.boykov_kolmogorov)
    except nx.NetworkXUnbounded:
        return None
    return set(reachable), set(g)


def _random_graph(rng: random.Random) -> list[tuple[int, int, int | None]]:
    n = rng.randint(1, 14)
    edges: list[tuple[int, int, int | None]] = []
    for _ in range(rng.randint(1, 40)):
        u = rng.choice([S, *range(n)])
        v = rng.choice([T, *range(n)])
        if u == v:
            continue
        # ties are common in min-cut's costs: small capacities make many equal cuts
        c = None if rng.random() < 0.3 else rng.choice([0, 1, 1, 2, 3, 5, 10**12])
        edges.append((u, v, c))
    edges.append((S, rng.randrange(n), rng.choice([None, 4])))
    edges.append((rng.randrange(n), T, None))
    return edges


@pytest.mark.parametrize("seed", range(400))
def test_same_partition_as_networkx(seed: int) -> None:
    edges = _random_graph(random.Random(seed))
    want = _networkx(edges)
    if want is None:
        with pytest.raises(Unbounded):
            source_side(edges, S, T)
    else:
        assert source_side(edges, S, T) == want


def test_repeated_edges_keep_networkx_capacity() -> None:
    # a DiGraph keeps one edge per pair, with the last capacity given
    edges: list[tuple[int, int, int | None]] = [(S, 0, None), (0, T, 5), (0, T, None), (0, T, 2)]
    assert source_side(edges, S, T) == _networkx(edges)

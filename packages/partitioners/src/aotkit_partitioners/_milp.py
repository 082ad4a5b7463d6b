"""The exact memory-budget solver: a mixed-integer program over the min-cut structure.

See Note [Memory budget] and Note [Min-cut flow graph]. scipy is optional (the ``milp``
extra); it is imported when this solver first runs.
"""

from __future__ import annotations

from typing import Any

import torch.fx

from ._cost import node_flops
from ._mincut import HARD_BANS, CutProblem


def _scipy() -> tuple[Any, Any, Any, Any, Any, Any]:
    """numpy and the scipy pieces, imported on first use (scipy is an optional extra)."""
    try:
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_matrix
    except ImportError as e:
        raise ImportError(
            "solver='milp' needs scipy: pip install 'aotkit-partitioners[milp]'"
        ) from e
    return np, Bounds, LinearConstraint, milp, coo_matrix, None


def solve_budget_milp(problem: CutProblem, target: int) -> list[torch.fx.Node] | None:
    """Minimise recompute FLOPs, then bytes, saving at most ``target`` bytes.

    Variables per candidate ``i``: ``a_i`` (its ``in`` vertex is on the source side: the
    forward has it), ``b_i`` (its ``out`` vertex is on the source side) and ``c_i`` (saved).
    Every infinite edge of the flow graph becomes a constraint, so a feasible point is a
    finite cut. Returns None if the solver does not prove optimality.
    """
    np, Bounds, LinearConstraint, milp, coo_matrix, _ = _scipy()
    cands = problem.candidates
    n = len(cands)
    index = {node: i for i, node in enumerate(cands)}
    a, b, c = 0, n, 2 * n  # variable offsets
    lb = np.zeros(3 * n)
    ub = np.ones(3 * n)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    row_ub: list[float] = []

    def add_row(terms: list[tuple[int, float]], upper: float) -> None:
        r = len(row_ub)
        for col, val in terms:
            rows.append(r)
            cols.append(col)
            vals.append(val)
        row_ub.append(upper)

    flops = np.zeros(n)
    nbytes = np.zeros(n)
    for i, node in enumerate(cands):
        reason = problem.banned.get(node)
        if reason in HARD_BANS:
            lb[a + i] = 1
        else:
            for arg in node.all_input_nodes:
                add_row([(b + index[arg], 1.0), (a + i, -1.0)], 0.0)  # b_arg <= a_i
        if node in problem.demanded:
            ub[b + i] = 0
        size = problem.nbytes[node]
        if size is None:
            ub[c + i] = 0
            add_row([(a + i, 1.0), (b + i, -1.0)], 0.0)  # a_i <= b_i
        else:
            nbytes[i] = size
            add_row([(a + i, 1.0), (b + i, -1.0), (c + i, -1.0)], 0.0)  # c_i >= a_i - b_i
        if node in problem.info.fw_required and reason not in HARD_BANS:
            flops[i] = node_flops(node)

    scale = max(float(flops.max(initial=0.0)), 1.0)
    flops = flops / scale
    bytes_row = np.zeros(3 * n)
    bytes_row[c : c + n] = nbytes
    # A replayed draw saves its generator state: state * (1 - a_i) bytes (See Note
    # [Min-cut flow graph]); the constant moves to the right-hand side.
    states = 0.0
    for node, state in problem.rng_state.items():
        bytes_row[a + index[node]] -= state
        states += state
    base = coo_matrix((vals, (rows, cols)), shape=(len(row_ub), 3 * n)).tocsr()
    structure = LinearConstraint(base, -np.inf, np.asarray(row_ub))
    budget = LinearConstraint(bytes_row[None, :], -np.inf, float(target) - states)
    integrality = np.ones(3 * n)
    bounds = Bounds(lb, ub)
    options = {"mip_rel_gap": 0.0, "time_limit": 60.0, "disp": False}

    # Stage 1: fewest recompute FLOPs, i.e. maximise sum(flops_i * a_i).
    cost1 = np.zeros(3 * n)
    cost1[a : a + n] = -flops
    res1 = milp(
        cost1,
        constraints=[structure, budget],
        integrality=integrality,
        bounds=bounds,
        options=options,
    )
    if res1.status != 0 or res1.x is None:
        return None
    best = float(-cost1 @ res1.x)
    # Stage 2: among those, fewest bytes.
    keep = LinearConstraint(-cost1[None, :], best - 1e-9 * max(best, 1.0), np.inf)
    res2 = milp(
        bytes_row / max(float(target), 1.0),
        constraints=[structure, budget, keep],
        integrality=integrality,
        bounds=bounds,
        options=options,
    )
    x = res2.x if res2.status == 0 and res2.x is not None else res1.x
    return [
        node
        for i, node in enumerate(cands)
        if x[a + i] > 0.5 and x[b + i] < 0.5 and problem.nbytes[node] is not None
    ]

"""The memory-budget partitioner: trade recomputation FLOPs for saved bytes.

# Note [Memory budget]
# ``budget`` in [0, 1] interpolates the bytes the forward may save:
#
#     target = min_bytes + budget * (max_bytes - min_bytes)
#
# ``max_bytes`` is what the min-cut partitioner saves (budget 1 returns its choice exactly).
# ``min_bytes`` is the cheapest cut when every op except graph inputs and side effects may
# be recomputed (random ops too, with functionalized RNG: their generator states are saved
# instead; without it their results are saved); budget 0 returns that cut, which in
# practice saves only the primals (and the states or random results).
#
# In between, the partitioner picks which "expensive" ops (those the min-cut refuses to
# recompute: matmuls, non-allowlisted ops, shrinking reductions) the backward may recompute,
# minimising the recompute FLOPs (torch.utils.flop_counter) subject to saving <= target:
#
# * ``solver="greedy"``: order the expensive ops by FLOPs per byte saved, and take the
#   shortest prefix whose min-cut fits the target (binary search). Allowing more
#   recomputation only removes constraints from the cut, so bytes fall along the prefix.
# * ``solver="milp"``: an exact mixed-integer program (scipy.optimize.milp) over the min-cut
#   structure itself: minimise recompute FLOPs, then bytes, subject to bytes <= target.
#
# Both choose, for each budget, the best solution of a fixed family under a constraint that
# tightens as the budget falls, so the bytes saved never grow as the budget decreases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.fx

from ._cost import node_flops
from ._milp import solve_budget_milp
from ._mincut import (
    HARD_BANS,
    CutProblem,
    build_problem,
    partition_with_saved,
    prepare_joint,
    saved_bytes,
    solve,
)
from ._rng import functional_rng

Solver = Literal["greedy", "milp"]


def expensive_nodes(problem: CutProblem) -> list[torch.fx.Node]:
    """Candidates the min-cut refuses to recompute but a memory budget may."""
    return [n for n in problem.candidates if problem.banned.get(n, "graph input") not in HARD_BANS]


def _greedy(problem: CutProblem, target: int, floor: list[torch.fx.Node]) -> list[torch.fx.Node]:
    items = expensive_nodes(problem)
    order = {n: i for i, n in enumerate(problem.candidates)}
    items.sort(key=lambda n: (node_flops(n) / max(problem.nbytes[n] or 0, 1), order[n]))
    lo, hi = 0, len(items)  # the prefix of length hi fits: it is the budget-0 cut
    best = floor
    while lo < hi:
        mid = (lo + hi) // 2
        saved = solve(problem, allow_recompute=items[:mid])
        if saved_bytes(problem, saved) <= target:
            hi, best = mid, saved
        else:
            lo = mid + 1
    if hi == 0:
        return solve(problem)
    return best


@dataclass(frozen=True)
class MemoryBudgetPartitioner:
    """A partitioner saving at most a ``budget`` fraction of the way from the fewest to the
    min-cut's bytes. See Note [Memory budget]."""

    budget: float
    solver: Solver = "greedy"

    def __post_init__(self) -> None:
        if not 0.0 <= self.budget <= 1.0:
            raise ValueError(f"memory budget must be in [0, 1], got {self.budget}")
        if self.solver not in ("greedy", "milp"):
            raise ValueError(f"solver must be 'greedy' or 'milp', got {self.solver!r}")

    def choose_saved(self, problem: CutProblem) -> list[torch.fx.Node]:
        """The saved values for this budget (in graph order)."""
        at_max = solve(problem)
        if self.budget >= 1.0:
            return at_max
        at_min = solve(problem, allow_recompute=expensive_nodes(problem), prefer_inputs=True)
        max_bytes, min_bytes = saved_bytes(problem, at_max), saved_bytes(problem, at_min)
        if max_bytes <= min_bytes:
            return at_max
        if self.budget <= 0.0:
            return at_min
        target = int(min_bytes + self.budget * (max_bytes - min_bytes))
        if self.solver == "milp":
            found = solve_budget_milp(problem, target)
            if found is not None:
                return found
        return _greedy(problem, target, at_min)

    def __call__(
        self,
        joint_module: torch.fx.GraphModule,
        joint_inputs: Any,
        *,
        num_fwd_outputs: int,
        static_lifetime_input_indices: Sequence[int] | None = None,
        memory_budget: float | None = None,
        solver: Solver | None = None,
        functionalize_rng: bool | None = None,
        **kwargs: Any,
    ) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
        """Partition ``joint_module``; ``memory_budget``/``solver`` override this instance's.

        ``functionalize_rng`` as for ``min_cut_rematerialization_partition``.
        """
        del joint_inputs, kwargs
        if memory_budget is not None or solver is not None:
            chosen = MemoryBudgetPartitioner(
                self.budget if memory_budget is None else memory_budget,
                self.solver if solver is None else solver,
            )
        else:
            chosen = self
        info = prepare_joint(joint_module, num_fwd_outputs)
        problem = build_problem(
            info, static_lifetime_input_indices, functional_rng=functional_rng(functionalize_rng)
        )
        saved = chosen.choose_saved(problem)
        return partition_with_saved(info, problem, saved, static_lifetime_input_indices)


def memory_budget_partition(budget: float, *, solver: Solver = "greedy") -> MemoryBudgetPartitioner:
    """A partitioner that saves at most ``budget`` of the way from the fewest bytes to the
    min-cut's bytes, recomputing as few FLOPs as it can. See Note [Memory budget].

    ``budget=1`` gives ``min_cut_rematerialization_partition``'s choice; ``budget=0``
    recomputes everything it may (saving only the primals in practice). ``solver`` is
    ``"greedy"`` or ``"milp"`` (exact; needs scipy, the ``milp`` extra).
    """
    return MemoryBudgetPartitioner(float(budget), solver)

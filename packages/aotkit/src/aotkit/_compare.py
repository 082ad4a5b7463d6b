"""``aotkit compare``: every partitioner on one joint graph, and the memory/recompute front.

# Note [Comparing partitioners]
# A partition trades memory for compute: each value the forward saves costs bytes kept
# alive until the backward reads it, each value it does not save costs the FLOPs of
# computing it again in the backward. ``compare`` runs every registered partitioner, and
# ``memory_budget_partition`` over a sweep of budgets (0 = recompute all it may, 1 = the
# min-cut's choice), on copies of one joint graph (Note [Inspecting a compilation]), and
# marks the *Pareto front*: the partitions no other partition beats on both saved bytes
# and recompute FLOPs. The picture plots saved bytes against recompute FLOPs, joins the
# front with a line, and shows the table beside the plot.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from aotkit_partitioners import available_partitioners, memory_budget_partition

from ._inspect import Capture, PartitionOutcome, capture, report_table

BUDGETS: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)


def pareto_front(outcomes: Sequence[PartitionOutcome]) -> list[PartitionOutcome]:
    """The outcomes no other outcome beats, that is saves no more bytes and recomputes no
    more FLOPs while doing strictly better on one (ties are all kept), by increasing saved
    bytes."""
    points = [
        (o, o.report.saved_bytes, o.report.recompute_flops)
        for o in outcomes if o.report is not None
    ]

    def beaten(b: int, f: int) -> bool:
        return any(b2 <= b and f2 <= f and (b2, f2) != (b, f) for _, b2, f2 in points)

    front = [(o, b, f) for o, b, f in points if not beaten(b, f)]
    return [o for o, _, _ in sorted(front, key=lambda t: (t[1], t[2]))]


def _label_groups(
    names: Sequence[str], xs: Sequence[float], ys: Sequence[float]
) -> list[tuple[float, float, str]]:
    """One label per cluster of points closer than 15% of the x range and 5% of the y
    range (a label is wide); sweep points are named by their budget only."""
    dx = (max(xs) - min(xs)) or 1.0
    dy = (max(ys) - min(ys)) or 1.0
    order = sorted(range(len(names)), key=lambda i: (ys[i], xs[i]))
    groups: list[list[int]] = []
    for i in order:
        for g in groups:
            j = g[-1]
            if abs(xs[i] - xs[j]) < 0.15 * dx and abs(ys[i] - ys[j]) < 0.05 * dy:
                g.append(i)
                break
        else:
            groups.append([i])
    labels = []
    for g in groups:
        sweep = sorted((names[i][len("memory_budget("):-1] for i in g
                        if names[i].startswith("memory_budget(")), key=float)
        named = [names[i] for i in g if not names[i].startswith("memory_budget(")]
        parts = named + ([f"budget {', '.join(sweep)}"] if sweep else [])
        labels.append((xs[g[0]], ys[g[0]], "\n".join(parts)))
    return labels


def run_all(cap: Capture, budgets: Sequence[float] = BUDGETS) -> list[PartitionOutcome]:
    """Every registered partitioner, then the memory-budget partitioner at each budget."""
    outcomes = [cap.partition(name) for name in available_partitioners()]
    for b in budgets:
        outcomes.append(cap.partition(f"memory_budget({b:g})", memory_budget_partition(b)))
    return outcomes


def draw_pareto(
    outcomes: Sequence[PartitionOutcome],
    path: str | Path,
    *,
    title: str = "memory / recompute trade-off",
    size: tuple[float, float] = (14.0, 6.0),
    dpi: int = 100,
) -> Path:
    """Saved bytes against recompute FLOPs, the Pareto front joined, the table beside.
    See Note [Comparing partitioners]."""
    from ._picture import _pyplot

    plt = _pyplot()
    done = [o for o in outcomes if o.report is not None]
    front = pareto_front(done)
    fig, (ax, tab) = plt.subplots(
        1, 2, figsize=size, dpi=dpi, gridspec_kw={"width_ratios": [1.25, 1]}
    )
    mib = [o.report.saved_bytes / 2**20 for o in done]  # type: ignore[union-attr]
    flops = [o.report.recompute_flops for o in done]  # type: ignore[union-attr]
    sweep = [o.name.startswith("memory_budget(") for o in done]
    ax.scatter([m for m, s in zip(mib, sweep, strict=True) if s],
               [f for f, s in zip(flops, sweep, strict=True) if s],
               s=40, color="#8172B3", label="memory_budget sweep", zorder=3)
    ax.scatter([m for m, s in zip(mib, sweep, strict=True) if not s],
               [f for f, s in zip(flops, sweep, strict=True) if not s],
               s=90, marker="D", color="#DD8452", label="registered partitioners", zorder=4)
    fx = [o.report.saved_bytes / 2**20 for o in front]  # type: ignore[union-attr]
    fy = [o.report.recompute_flops for o in front]  # type: ignore[union-attr]
    ax.step(fx, fy, where="post", color="#2CA02C", lw=2, label="Pareto front", zorder=2)
    for x, y, text in _label_groups([o.name for o in done], mib, [float(f) for f in flops]):
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(7, 5), fontsize=8,
                    va="bottom")
    ax.set_xlabel("saved for backward (MiB)")
    ax.set_ylabel("recomputed in backward (FLOPs)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=9)
    on_front = {id(o) for o in front}
    rows = [
        [o.name, str(o.report.num_saved_tensors), f"{o.report.saved_bytes / 2**20:.3f}",  # type: ignore[union-attr]
         str(len(o.report.recomputed_node_names)), f"{o.report.recompute_flops:.3g}",  # type: ignore[union-attr]
         "yes" if id(o) in on_front else ""]
        for o in done
    ]
    rows += [[o.name, "failed", "", "", "", ""] for o in outcomes if o.report is None]
    tab.axis("off")
    table = tab.table(
        cellText=rows,
        colLabels=["partitioner", "saved", "MiB", "recomputed", "FLOPs", "front"],
        loc="center", cellLoc="right", colLoc="right",
    )
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    table.scale(1, 1.4)
    table.auto_set_column_width(list(range(6)))
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def compare(
    fn_or_module: Callable[..., Any],
    *args: Any,
    budgets: Sequence[float] = BUDGETS,
    picture: str | None = None,
    file: TextIO | None = None,
) -> list[PartitionOutcome]:
    """Run every partitioner and the memory-budget sweep on ``fn_or_module(*args)``'s joint
    graph, print the table with the Pareto front marked, and with ``picture`` draw it.
    See Note [Comparing partitioners]."""
    out = file or sys.stdout
    cap = capture(fn_or_module, *args)
    if cap.joint is None:
        raise ValueError(
            "nothing to compare: no input or parameter requires grad, so aotkit traced an "
            "inference graph only; pass inputs that require grad"
        )
    outcomes = run_all(cap, budgets)
    print(report_table(outcomes), file=out)
    front = pareto_front(outcomes)
    print("Pareto front (saved bytes vs recompute FLOPs): "
          + ", ".join(o.name for o in front), file=out)
    if picture is not None:
        draw_pareto(outcomes, picture)
        print(f"wrote {picture}", file=out)
    return outcomes

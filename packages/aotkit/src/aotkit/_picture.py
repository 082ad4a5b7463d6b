"""The partition picture: what a partitioner saved and recomputed, at a glance.

# Note [Partition picture]
# One figure, two panels sharing one x axis: the joint graph's compute nodes in execution
# order (forward first, then backward).
#   * top: three lanes. "module": contiguous runs of nodes of the same module (from
#     ``nn_module_stack``, see Note [Inspecting a compilation]), cut to the depth that keeps
#     at most ``MAX_SEGMENTS`` runs, so a 2,000-node graph shows a few dozen labelled blocks
#     rather than 2,000 ticks; "saved": a tick at each forward value kept for the backward;
#     "recomputed": a tick at each forward node the backward computes again. The forward
#     and backward regions are shaded across both panels.
#   * bottom: the bytes kept alive for the backward over time: a saved value is alive from
#     the node that makes it (saved graph inputs from the start) to the last backward node
#     that reads it, stacked as saved inputs and saved activations.
# The title carries the partition report's totals. Small graphs (up to ``MAX_NODE_LABELS``
# nodes) also get each node's op name under the axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.fx

from ._inspect import Capture, PartitionOutcome, module_of

if TYPE_CHECKING:
    from matplotlib.axes import Axes

MAX_SEGMENTS = 40
MAX_NODE_LABELS = 60
FORWARD_COLOR = "#4C72B0"
BACKWARD_COLOR = "#DD8452"
SAVED_COLOR = "#2CA02C"
RECOMPUTED_COLOR = "#D62728"
INPUTS_COLOR = "#9DB9A0"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _runs(labels: Sequence[str], depth: int) -> list[tuple[int, int, str]]:
    runs: list[tuple[int, int, str]] = []
    for i, lab in enumerate(labels):
        cut = ".".join(lab.split(".")[:depth]) if lab else (runs[-1][2] if runs else "")
        if runs and runs[-1][2] == cut:
            runs[-1] = (runs[-1][0], i + 1, cut)
        else:
            runs.append((i, i + 1, cut))
    return runs


def _absorb_short(runs: list[tuple[int, int, str]], min_len: int) -> list[tuple[int, int, str]]:
    """Runs shorter than ``min_len`` join the run before them; equal neighbours merge."""
    out: list[tuple[int, int, str]] = []
    for start, stop, lab in runs:
        if out and out[-1][2] == lab:
            out[-1] = (out[-1][0], stop, lab)
        elif out and stop - start < min_len:
            out[-1] = (out[-1][0], stop, out[-1][2])
        else:
            out.append((start, stop, lab))
    return out


def _segments(labels: Sequence[str], max_segments: int) -> list[tuple[int, int, str]]:
    """Runs ``(start, stop, label)`` of equal labels at the deepest module depth that gives
    at most ``max_segments`` runs, once runs too short to see (at most a tenth of the nodes)
    are absorbed into their neighbours; an empty label continues the run before it."""
    depth = max((lab.count(".") + 1 for lab in labels if lab), default=0)
    min_len = max(1, len(labels) // 150)
    while True:
        raw = _runs(labels, depth)
        runs = _absorb_short(raw, min_len)
        absorbed = sum(b - a for a, b, _ in raw if b - a < min_len)
        if (len(runs) <= max_segments and absorbed <= len(labels) // 10) or depth <= 1:
            return runs
        depth -= 1


def _liveness(
    outcome: PartitionOutcome, position: dict[str, int], n_fw: int, n: int
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """(start, stop, bytes) of each saved input and each saved activation. A backward node
    stands at its joint position; one the joint has in its forward (a recomputed node) or
    not at all stands just before the next backward node that has a position."""
    assert outcome.report is not None and outcome.bw_module is not None
    at: dict[str, int] = {}
    following = n - 1
    for node in reversed(outcome.bw_module.graph.nodes):
        p = position.get(node.name)
        if p is not None and p >= n_fw:
            following = p
        at[node.name] = following
    last_use: dict[str, int] = {}
    for node in outcome.bw_module.graph.nodes:
        if node.op == "placeholder":
            ends = [at[u.name] for u in node.users if u.op != "output"]
            last_use[node.name] = max(ends) if ends else n - 1
    made = forward_positions(outcome, position, n_fw)
    inputs, activations = [], []
    for name, size in outcome.report.saved_tensors:
        stop = last_use.get(name, n - 1) + 1
        if name in made:
            activations.append((made[name], stop, size))
        else:
            inputs.append((0, stop, size))
    return inputs, activations


def forward_positions(
    outcome: PartitionOutcome, position: dict[str, int], n_fw: int
) -> dict[str, int]:
    """Where each node of the partitioned forward runs on the joint's time axis: its joint
    position, or for a node the joint has in its backward (work the partitioner moved into
    the forward, e.g. a transposed weight) the position of the forward node before it."""
    assert outcome.fw_module is not None
    made: dict[str, int] = {}
    last = 0
    for node in outcome.fw_module.graph.nodes:
        if node.op != "call_function":
            continue
        p = position.get(node.name)
        if p is not None and p < n_fw:
            last = p
        made[node.name] = last
    return made


def _alive(intervals: Sequence[tuple[int, int, int]], n: int) -> list[float]:
    delta = [0] * (n + 1)
    for start, stop, size in intervals:
        delta[start] += size
        delta[min(stop, n)] -= size
    out: list[float] = []
    total = 0
    for i in range(n):
        total += delta[i]
        out.append(float(total))
    return out


def _forward_length(nodes: Sequence[torch.fx.Node], fw_module: torch.fx.GraphModule) -> int:
    """How many of the joint's nodes (forward first, then backward) are forward work: the
    joint's own tags when it has them, else the partitioned forward's nodes."""
    tags = [nd.meta.get("partitioner_tag") for nd in nodes]
    if any(t == "is_backward" for t in tags):
        return next(i for i, t in enumerate(tags) if t == "is_backward")
    fw_names = {nd.name for nd in fw_module.graph.nodes if nd.op == "call_function"}
    return max((i + 1 for i, nd in enumerate(nodes) if nd.name in fw_names), default=0)


def _unit(peak_bytes: float) -> tuple[str, float]:
    for name, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if peak_bytes >= scale:
            return name, scale
    return "bytes", 1


def _shade(ax: Axes, n_fw: int, n: int) -> None:
    ax.axvspan(-0.5, n_fw - 0.5, color=FORWARD_COLOR, alpha=0.08, lw=0)
    ax.axvspan(n_fw - 0.5, n - 0.5, color=BACKWARD_COLOR, alpha=0.08, lw=0)
    ax.axvline(n_fw - 0.5, color="#555555", lw=1, ls="--")


def draw_partition(
    cap: Capture,
    outcome: PartitionOutcome,
    path: str | Path,
    *,
    size: tuple[float, float] = (14.0, 7.0),
    dpi: int = 100,
) -> Path:
    """Draw ``outcome``'s split of ``cap``'s joint graph to ``path`` (``.png``/``.svg``).
    See Note [Partition picture]."""
    if cap.joint is None or outcome.report is None or outcome.fw_module is None:
        raise ValueError(f"no partition to draw for {outcome.name}: {outcome.error}")
    plt = _pyplot()
    joint: torch.fx.GraphModule = cap.joint
    nodes = [nd for nd in joint.graph.nodes if nd.op == "call_function"]
    n = len(nodes)
    position = {nd.name: i for i, nd in enumerate(nodes)}
    n_fw = _forward_length(nodes, outcome.fw_module)
    report = outcome.report
    made = forward_positions(outcome, position, n_fw)
    saved_at = [made[s] for s, _ in report.saved_tensors if s in made]
    recomputed_at = [position[r] for r in report.recomputed_node_names if r in position]

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=size, dpi=dpi, sharex=True, gridspec_kw={"height_ratios": [1.1, 2]}
    )
    for ax in (top, bottom):
        _shade(ax, n_fw, n)

    # module lane
    labels = module_of(joint, cap.state_names)
    runs = _segments([labels[nd.name] for nd in nodes], MAX_SEGMENTS)
    palette = ["#CFD8E8", "#E8DCCF"]
    for k, (start, stop, lab) in enumerate(runs):
        top.barh(2, stop - start, left=start - 0.5, height=0.8, color=palette[k % 2],
                 edgecolor="white", lw=0.5)
        if lab and (stop - start) / max(n, 1) > 0.025:
            top.text((start + stop - 1) / 2, 2, lab, ha="center", va="center", fontsize=7,
                     rotation=90 if (stop - start) / max(n, 1) < 0.06 else 0, clip_on=True)
    # saved / recomputed lanes
    top.vlines(saved_at, 0.6, 1.4, color=SAVED_COLOR, lw=1.5)
    top.vlines(recomputed_at, -0.4, 0.4, color=RECOMPUTED_COLOR, lw=1.5)
    top.set_yticks([0, 1, 2])
    top.set_yticklabels([
        f"recomputed ({len(recomputed_at)})",
        f"saved ({len(saved_at)} + {report.num_saved_tensors - len(saved_at)} inputs)",
        "module",
    ])
    top.set_ylim(-0.6, 2.6)
    top.text(n_fw / 2, 2.75, f"forward ({n_fw} nodes)", ha="center", va="bottom",
             color=FORWARD_COLOR, fontsize=10, fontweight="bold")
    top.text((n_fw + n) / 2, 2.75, f"backward ({n - n_fw} nodes)", ha="center",
             va="bottom", color=BACKWARD_COLOR, fontsize=10, fontweight="bold")

    # bytes alive for the backward
    inputs, activations = _liveness(outcome, position, n_fw, n)
    xs = list(range(n))
    unit, scale = _unit(max(_alive([*inputs, *activations], n), default=0.0))
    alive_in = [v / scale for v in _alive(inputs, n)]
    alive_act = [v / scale for v in _alive(activations, n)]
    stacked = [a + b for a, b in zip(alive_in, alive_act, strict=True)]
    bottom.fill_between(xs, 0, alive_in, step="mid", color=INPUTS_COLOR,
                        label="saved graph inputs (params, user inputs)")
    bottom.fill_between(xs, alive_in, stacked, step="mid", color=SAVED_COLOR, alpha=0.75,
                        label="saved activations")
    peak = max(stacked, default=0.0)
    bottom.set_ylabel(f"{unit} kept alive for the backward")
    bottom.set_xlabel("joint graph nodes, in execution order")
    bottom.set_ylim(0, peak * 1.15 if peak > 0 else 1)
    bottom.legend(loc="upper right", fontsize=9, framealpha=0.9)
    bottom.set_xlim(-0.5, n - 0.5)
    if n <= MAX_NODE_LABELS:
        bottom.set_xticks(xs)
        bottom.set_xticklabels([nd.name for nd in nodes], rotation=90, fontsize=7)
        for i in saved_at:
            bottom.get_xticklabels()[i].set_color(SAVED_COLOR)
        for i in recomputed_at:
            bottom.get_xticklabels()[i].set_color(RECOMPUTED_COLOR)
    fig.suptitle(
        f"Partition by {outcome.name}: saved {report.num_saved_tensors} tensors "
        f"({report.saved_bytes / 2**20:.2f} MiB), recomputed "
        f"{len(report.recomputed_node_names)} nodes ({report.recompute_flops:.3g} FLOPs); "
        f"forward {report.num_fw_nodes} / backward {report.num_bw_nodes} nodes",
        fontsize=12,
    )
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out

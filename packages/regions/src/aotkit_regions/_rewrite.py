"""Rewriting each repeat of a region as a call of one shared ``invoke_subgraph``.

# Note [Sharing repeated regions]
# ``share_repeated_regions(gm)`` runs on dynamo's graph at the start of
# aot_module_simplified (before the on-disk cache's fingerprint, so the key is the
# rewritten graph's). For each group of regions with one signature (Note [Repeated
# regions]) that no refusal touches (Note [Regions that are not shared]) and that repeats
# at least ``min_repeats()`` times (Note [When sharing pays]), it builds one subgraph from
# the first repeat: a placeholder per input, the region's nodes copied with their meta, a
# tuple of its outputs. The subgraph is registered on ``gm`` as ``aotkit_region_<hash>``
# and every repeat becomes
#     invoke_subgraph(get_attr aotkit_region_<hash>, "aotkit_region_<hash>", *inputs)
# followed by one getitem per output, the same shape as the graphs dynamo makes for
# ``nested_compile_region``. The identifier is a hash of the region's content, never of
# object ids, so it is the same in every process (the on-disk cache keys on it) and two
# regions with one identifier are the same program. torch's invoke_subgraph kernels cache
# the traced forward/backward per identifier, so each distinct region is traced,
# partitioned and compiled once; the repeats call it. The region's operations run the
# same aten ops on the same inputs as before, so results stay bitwise eager's.
# The graph is rewritten in place (dynamo hands the backend its own graph) and linted.
# Graphs that already hold an ``invoke_subgraph`` (user regions, or
# ``mark_repeated_blocks``) are left as they are.
"""

from __future__ import annotations

import contextlib
import logging
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.fx

from ._find import Region, RegionRefused, module_regions, signature
from ._safety import refusal
from ._switch import min_repeats

__all__ = ["RegionReport", "record_region_reports", "share_repeated_regions", "has_invoke_subgraph"]

log = logging.getLogger("aotkit.regions")
PREFIX = "aotkit_region_"
# a region of fewer ops costs more as a call than its retrace: See Note [When sharing pays]
MIN_OPS = 4


@dataclass
class RegionReport:
    """What ``share_repeated_regions`` did to one graph."""

    # identifier -> the module paths of its repeats
    shared: dict[str, list[str]] = field(default_factory=dict)
    # (module class, paths, why not shared)
    refused: list[tuple[str, list[str], str]] = field(default_factory=list)
    # regions with no repeat of the same signature among same-class regions
    alone: list[str] = field(default_factory=list)
    skipped: str | None = None


_RECORDERS: list[list[RegionReport]] = []


@contextlib.contextmanager
def record_region_reports() -> Iterator[list[RegionReport]]:
    """Collect the RegionReport of every graph rewritten inside the block."""
    records: list[RegionReport] = []
    _RECORDERS.append(records)
    try:
        yield records
    finally:
        del _RECORDERS[next(i for i, r in enumerate(_RECORDERS) if r is records)]


def has_invoke_subgraph(graph: torch.fx.Graph) -> bool:
    """Whether ``graph`` (top level) calls ``invoke_subgraph``."""
    hop = torch.ops.higher_order.invoke_subgraph
    return any(n.op == "call_function" and n.target is hop for n in graph.nodes)


def _finish(report: RegionReport) -> RegionReport:
    for records in _RECORDERS:
        records.append(report)
    return report


def share_repeated_regions(gm: torch.fx.GraphModule, threshold: int | None = None) -> RegionReport:
    """Rewrite the repeated regions of ``gm`` in place. See Note [Sharing repeated regions]."""
    report = RegionReport()
    n_min = min_repeats() if threshold is None else threshold
    if n_min == 0:
        report.skipped = "region sharing is off"
        return _finish(report)
    if has_invoke_subgraph(gm.graph):
        report.skipped = "the graph already has nested compile regions"
        log.info("regions: not searched: %s", report.skipped)
        return _finish(report)
    by_class: dict[str, list[Region]] = {}
    for r in module_regions(gm.graph):
        by_class.setdefault(r.cls, []).append(r)
    taken: list[tuple[int, int]] = []  # index ranges of the shared regions
    candidates = sorted(
        (rs for rs in by_class.values() if len(rs) >= n_min), key=lambda rs: (rs[0].depth, rs[0].start)
    )
    plans: list[tuple[str, list[Region]]] = []
    for regions in candidates:
        free = [
            r for r in regions
            if len(r.nodes) >= MIN_OPS and not any(a <= r.start < b for a, b in taken)
        ]
        if len(free) < n_min:
            continue
        groups: dict[str, list[Region]] = {}
        for r in free:
            r.bind()
            why = refusal(r)
            if why is None:
                try:
                    sig = signature(r)
                except RegionRefused as e:
                    why = str(e)
            if why is not None:
                report.refused.append((r.cls, [r.path], why))
                continue
            groups.setdefault(sig, []).append(r)
        _merge_refusals(report)
        for sig, group in groups.items():
            if len(group) < n_min:
                report.alone.extend(r.path for r in group)
                if len(group) > 1 or len(groups) > 1:
                    log.info(
                        "regions: not shared: %d %s with one signature, fewer than %d "
                        "(See Note [When sharing pays])",
                        len(group), group[0].short(), n_min,
                    )
                continue
            for ident, same in _split_by_targets(sig, group):
                plans.append((ident, same))
                taken.extend((r.start, r.end) for r in same)
    for cls, paths, why in report.refused:
        log.info("regions: not shared: %s (%d regions, first %s): %s",
                 cls.rsplit(".", 1)[-1], len(paths), paths[0], why)
    replaced: dict[torch.fx.Node, torch.fx.Node] = {}
    for ident, group in plans:
        _rewrite(gm, ident, group, replaced)
        report.shared[ident] = [r.path for r in group]
        log.info("regions: shared %s: %d repeats of %s, %d ops each",
                 ident, len(group), group[0].short(), len(group[0].nodes))
    if plans:
        gm.graph.lint()
        gm.recompile()
    return _finish(report)


def _merge_refusals(report: RegionReport) -> None:
    """One refusal entry per (class, reason)."""
    merged: dict[tuple[str, str], list[str]] = {}
    for cls, paths, why in report.refused:
        merged.setdefault((cls, why), []).extend(paths)
    report.refused = [(cls, paths, why) for (cls, why), paths in merged.items()]


def _split_by_targets(sig: str, group: list[Region]) -> list[tuple[str, list[Region]]]:
    """Subgroups whose nodes call the very same targets (See Note [Repeated regions])."""
    subgroups: dict[tuple[int, ...], list[Region]] = {}
    for r in group:
        key = tuple(id(n.target) for n in r.nodes if not isinstance(n.target, str))
        subgroups.setdefault(key, []).append(r)
    return [
        (f"{PREFIX}{sig[:16]}" + (f"_{k}" if k else ""), same)
        for k, same in enumerate(subgroups.values())
    ]


def _outside(inside: set[torch.fx.Node]) -> Callable[[torch.fx.Node], bool]:
    return lambda user: user not in inside


def _build_subgraph(region: Region) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for k, inp in enumerate(region.inputs):
        p = graph.placeholder(f"arg{k}")
        p.meta["example_value"] = inp.meta.get("example_value")
        env[inp] = p
    for n in region.nodes:
        env[n] = graph.node_copy(n, lambda x: env[x])
    graph.output(tuple(env[o] for o in region.outputs))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _rewrite(
    gm: torch.fx.GraphModule,
    ident: str,
    group: list[Region],
    replaced: dict[torch.fx.Node, torch.fx.Node],
) -> None:
    """Each region of ``group`` becomes one call; ``replaced`` maps the erased outputs of
    earlier rewrites to their getitems (a later region may read them)."""
    gm.register_module(ident, _build_subgraph(group[0]))
    graph = gm.graph
    hop = torch.ops.higher_order.invoke_subgraph
    for r in group:
        inside = set(r.nodes)
        first = r.nodes[0]
        stack = dict(first.meta.get("nn_module_stack") or {})
        outer = dict(list(stack.items())[: r.depth + 1])
        with graph.inserting_before(first):
            sub = graph.get_attr(ident)
            operands = [replaced.get(i, i) for i in r.inputs]
            call = graph.call_function(hop, (sub, ident, *operands))
            call.meta["example_value"] = tuple(o.meta.get("example_value") for o in r.outputs)
            call.meta["nn_module_stack"] = outer
            for k, o in enumerate(r.outputs):
                item = graph.call_function(operator.getitem, (call, k))
                item.meta = dict(o.meta)
                o.replace_all_uses_with(item, delete_user_cb=_outside(inside))
                replaced[o] = item
        for n in reversed(r.nodes):
            graph.erase_node(n)

"""Check that a compile-speed change leaves aotkit's graphs exactly as they were.

For each zoo model (``zoo.py``'s, built from configs, nothing downloaded), one training
step is compiled through ``aotkit_eager`` twice: with the current code, and with one of the
speed-ups switched back to its slower equivalent (``--variant``). The joint, forward and
backward graphs of every compiled graph must be the same: the same code, and node for node
the same name, op, target, meta keys, value metadata (shape, stride, dtype,
requires_grad, storage offset), tensor_meta flags and partitioner tag. The losses and
gradients of the two steps must be bitwise equal.

Variants:
  flags     the single pass's backward view flags off (Note [Fake-cache keys of the single
            pass's backward] in aotkit_tracing)
  fold      the single pass's layers in dispatch modes of their own, as before Note [One
            dispatch frame for aotkit's trace layers]
  flow      min-cut's maximum flow through networkx (Boykov-Kolmogorov), as before Note
            [Min-cut without networkx] in aotkit_partitioners
  copy      the partitioner's node copies through ``Graph.node_copy`` (Note [Copying
            joint nodes] in aotkit_partitioners)
  farapart  min-cut without Note [Values read far apart] in aotkit_partitioners (the graphs
            are expected to differ where the rule changes the cut: this lists where it does)
  direct    the backward ops' fake kernels through FakeTensorMode's own route, as before
            Note [Decompositions run directly on meta] in aotkit_tracing
  bn        only the forward's batch norm through FakeTensorMode's own route, as before
            Note [The forward's batch norm directly on meta] in aotkit_tracing

Usage:
  uv run --group bench python tools/bench/same_graphs.py --variant flags
  uv run --group bench python tools/bench/same_graphs.py --variant fold --models bert,resnet18
Exit status 1 if any graph differs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.fx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo  # noqa: E402

os.environ.setdefault("AOTKIT_CACHE", "0")


def node_facts(gm: torch.fx.GraphModule) -> list[tuple[Any, ...]]:
    facts = []
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else (val,)
        tm = n.meta.get("tensor_meta")
        tms = tm if isinstance(tm, (tuple, list)) else (tm,)
        facts.append(
            (
                n.name,
                n.op,
                str(n.target),
                tuple(sorted(n.meta)),
                tuple(
                    (tuple(v.shape), v.stride(), v.dtype, v.requires_grad, v.storage_offset())
                    for v in vals
                    if isinstance(v, torch.Tensor)
                ),
                tuple(getattr(t, "requires_grad", None) for t in tms),
                n.meta.get("partitioner_tag"),
            )
        )
    return facts


def networkx_cut(edges: list[tuple[int, int, int | None]]) -> tuple[set[Any], set[Any]]:
    """min-cut's partition of its flow graph as networkx computes it (the reference for
    ``--variant flow``)."""
    import networkx as nx
    from aotkit_partitioners._extract import PartitionError

    g: Any = nx.DiGraph()
    g.add_edges_from((u, v, {} if cap is None else {"capacity": cap}) for u, v, cap in edges)
    try:
        _, (reachable, _) = nx.minimum_cut(
            g, -1, -2, flow_func=nx.algorithms.flow.boykov_kolmogorov
        )
    except nx.NetworkXUnbounded as e:
        raise PartitionError("no finite cut") from e
    return set(reachable), set(g)


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """The slower equivalent of a speed-up, for the duration of the block."""
    patches: list[tuple[Any, str, Any]] = []
    if name == "flags":
        import aotkit_tracing.core._single_pass as sp

        patches.append((sp, "BackwardViewFlags", lambda: None))
    elif name == "fold":
        import aotkit_tracing._rng_replay as rr
        import aotkit_tracing.core._single_pass as sp

        @contextlib.contextmanager
        def own_mode(layer: Any) -> Iterator[None]:
            if layer is None:
                yield
                return
            mode = rr._RngKeys(keying=False)
            mode.layer = layer
            with mode:
                yield

        @contextlib.contextmanager
        def popped(layer: Any = None) -> Iterator[bool]:
            with rr.unkeyed_if_nothing_drew(None) as unkeyed, own_mode(layer):
                yield unkeyed

        patches.append((sp, "trace_layer", own_mode))
        patches.append((sp, "unkeyed_if_nothing_drew", popped))
    elif name == "flow":
        import aotkit_partitioners._mincut as mc

        patches.append((mc, "flow_cut", networkx_cut))
    elif name == "copy":
        import aotkit_partitioners._cse as cse
        import aotkit_partitioners._extract as ex

        def node_copy(graph: torch.fx.Graph, node: torch.fx.Node, env: Any) -> torch.fx.Node:
            return graph.node_copy(node, env.__getitem__)

        patches.append((ex, "copy_node", node_copy))
        patches.append((cse, "copy_node", node_copy))
    elif name == "farapart":
        import torch._functorch.config as functorch_config

        patches.append((functorch_config, "ban_recompute_used_far_apart", False))
    elif name == "direct":
        import aotkit_tracing.core._single_pass as sp
        import aotkit_tracing.core._trace as tr

        def ordinary(mode: Any) -> contextlib.AbstractContextManager[None]:
            return contextlib.nullcontext()

        patches.append((sp, "direct_decompositions", ordinary))
        patches.append((tr, "direct_decompositions", ordinary))
    elif name == "bn":
        import aotkit_tracing.core._direct_decompositions as dd

        bn = torch.ops.aten._native_batch_norm_legit_functional.default
        patches.append((dd, "DIRECT_OPS", dd.DIRECT_OPS - {bn}))
    else:
        raise SystemExit(f"unknown variant {name!r}")
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in patches]
    for obj, attr, value in patches:
        setattr(obj, attr, value)
    try:
        yield
    finally:
        for obj, attr, value in saved:
            setattr(obj, attr, value)


def step(name: str) -> tuple[list[Any], torch.Tensor, list[torch.Tensor]]:
    from aotkit_capture import record_compilations

    torch._dynamo.reset()
    t = zoo.make_trainer(name, "aotkit_eager")
    with record_compilations() as records:
        loss = t.step()
    grads = [p.grad.clone() for p in t.built.params if p.grad is not None]
    return list(records), loss.detach(), grads


def compare(name: str, which: str) -> tuple[list[str], int]:
    """(differences, number of graph modules compared)"""
    new, loss, grads = step(name)
    compared = 0
    with variant(which):
        old, loss_old, grads_old = step(name)
    problems = []
    if len(new) != len(old):
        return [f"{len(new)} compiled graphs, {len(old)} with the variant"], 0
    for k, (a, b) in enumerate(zip(new, old, strict=True)):
        if a.path != b.path:
            problems.append(f"graph {k}: path {a.path} vs {b.path} ({b.path_reason})")
        for mod in ("joint_module", "fw_module", "bw_module", "inference_module"):
            ga, gb = getattr(a, mod, None), getattr(b, mod, None)
            if ga is None and gb is None:
                continue
            if ga is None or gb is None:
                problems.append(f"graph {k} {mod}: missing on one side")
                continue
            compared += 1
            if ga.code != gb.code:
                problems.append(f"graph {k} {mod}: code differs")
            elif node_facts(ga) != node_facts(gb):
                fa, fb = node_facts(ga), node_facts(gb)
                i = next(
                    (i for i, (x, y) in enumerate(zip(fa, fb, strict=False)) if x != y),
                    min(len(fa), len(fb)),
                )
                got = fa[i] if i < len(fa) else None
                want = fb[i] if i < len(fb) else None
                problems.append(f"graph {k} {mod}: node {i} differs: {got} vs {want}")
    if not torch.equal(loss, loss_old):
        problems.append("loss differs")
    if len(grads) != len(grads_old) or not all(
        torch.equal(x, y) for x, y in zip(grads, grads_old, strict=True)
    ):
        problems.append("gradients differ")
    if not compared:
        problems.append("no graph was compared")
    return problems, compared


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--variant", required=True,
        choices=("flags", "fold", "flow", "copy", "direct", "bn", "farapart"),
    )
    ap.add_argument("--models", default=",".join(zoo.DEFAULT_SET))
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    bad = 0
    for name in args.models.split(","):
        problems, compared = compare(name, args.variant)
        verdict = "same" if not problems else "DIFFERENT"
        print(f"{name:18s} {verdict} ({compared} graph modules compared)", flush=True)
        for p in problems:
            print(f"    {p}")
        bad += bool(problems)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

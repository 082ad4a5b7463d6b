"""The min-cut rematerialization partitioner.

# Note [Min-cut flow graph]
# Choosing what to save is a minimum s-t cut. Every candidate joint node ``u`` becomes two
# flow vertices, ``u_in`` and ``u_out``, joined by an edge whose capacity is the cost of
# saving ``u``. Dependencies ``a -> u`` become infinite edges ``a_out -> u_in``.
#
# * source side = values the forward has; sink side = values the backward must compute.
# * ``source -> u_in`` (infinite) for a node the backward may not recompute
#   (see Note [Recomputation policy]); we fold ``u_in`` into the source.
# * ``u_out -> sink`` (infinite) for a tangent-free node that a backward node reads.
#
# A finite cut crosses only ``u_in -> u_out`` edges; those ``u`` are saved, and everything
# between the saved values and the backward is recomputed. Only ancestors of the demanded
# nodes can be cut, so the flow graph holds just them. Tangent-dependent nodes never enter it.
#
# Cost model (capacities are ints, so the cut is exact):
#   capacity(u) = (2 * bytes(u) + unmaterialized_bytes(u)) * BIG + bytes(u) * SCALE
#                 + tiebreak(u) * SUB + [u is a symint]
# (unmaterialized bytes count one and a half times: See Note [Saving values the forward
# materializes anyway])
# bytes come from meta['val'] (symbolic sizes use their hints; a symint costs 0 bytes, it
# is not tensor memory; a static-lifetime input costs 0, it is alive anyway; a tuple, a
# non-tensor or an input the runtime mutates after the forward cannot be saved). ``SUB``
# exceeds the number of symints, ``SCALE`` the sum of the lower terms and ``BIG`` the sum of
# the bytes level and lower, so the cut first minimises weighted tensor bytes, then real
# bytes, and only among cuts equal on both prefers the one saving values
# closest to the backward (tiebreak = 1 + hops to the nearest backward reader; sizes count
# here too), i.e. the one recomputing least: with a weight needed only as ``t(weight)``,
# the view is saved (as torch does) rather than the weight plus a recomputed ``t``; with
# ``cat([b, c])`` read by a backward ``mm``, the ``cat`` is saved with the sizes the
# backward slices it by (as torch does) rather than ``b`` and ``c`` with a ``cat``
# recomputed in the backward to spare two sizes. Last, among cuts equal on both counts, the
# one saving fewest sizes (``0 + s0`` is recomputed from a saved ``s0`` rather than saved
# next to it).
#
# Random ops (with functionalized RNG, Note [Functionalized RNG] in aotkit_schemas): a random
# op ``r`` the backward recomputes needs the generator state the forward drew it from. The
# state is a value the forward has (source side) that must be saved if ``r`` is recomputed:
# an edge ``source -> r_in`` whose capacity is the state's bytes (5,056 on CPU). So the cut
# recomputes a dropout mask only when the mask and whatever else recomputing it would keep
# alive cost more than the state: a mask of a tensor the backward keeps anyway (attention
# probabilities saved for a matmul) is recomputed; a mask of a value saved for nothing else
# usually is not (the bool mask is a quarter of a float32 input).
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from aotkit_schemas import RUNTIME_MUTATED_INPUT_KEY, is_sym_node, mark_cache_key

from ._cost import SYMINT_BYTES, node_bytes
from ._cse import cse_graph, duplicates
from ._extract import PartitionError, build_modules
from ._far_apart import FAR_APART, far_apart_readers
from ._flow import Unbounded, source_side
from ._joint import JointInfo, analyze_joint, ancestors, is_tuple_node, nodes_of
from ._ops import (
    ban_reason,
    fusible,
    is_random,
    materialized_in_backward,
    must_recompute,
    mutated_readers,
)
from ._regions import partition_region_boundaries
from ._rng import functional_rng, replay_recomputed_rng_inplace, rng_state_bytes

_SOURCE = -1
_SINK = -2

# A primal the runtime mutates after the forward is never saved.
# See Note [Joint graph calling convention] in aotkit_schemas.
EPILOGUE_MUTATION_KEY = RUNTIME_MUTATED_INPUT_KEY

# Ban reasons no caller may lift: recomputing would change the result or is impossible.
HARD_BANS = frozenset(
    {
        "graph input",
        "random op",
        "side effect",
        "reads a mutated tensor",
        "not a call_function",
        "checkpoint policy MUST_SAVE",
        # not needed for correctness, but a size costs no bytes: no budget gains by lifting it
        "size the forward computes",
    }
)


@dataclass(frozen=True)
class CutProblem:
    """The candidates of one joint graph and their costs. See Note [Min-cut flow graph]."""

    info: JointInfo
    # in graph order: ancestors of the demanded nodes (tangent-free)
    candidates: tuple[torch.fx.Node, ...]
    # tangent-free nodes whose value a backward node reads
    demanded: frozenset[torch.fx.Node]
    # why each candidate may not be recomputed (absent: it may)
    banned: dict[torch.fx.Node, str]
    # bytes of saving each candidate; None = cannot be saved (a tuple, a non-tensor)
    nbytes: dict[torch.fx.Node, int | None]
    # hops from each candidate to its nearest backward reader
    dist: dict[torch.fx.Node, int]
    # random candidates the backward may replay: bytes of the generator state to save then
    # (empty without functionalized RNG; see Note [Min-cut flow graph])
    rng_state: dict[torch.fx.Node, int] = field(default_factory=dict)


def build_problem(
    info: JointInfo,
    static_lifetime_input_indices: Sequence[int] | None = None,
    *,
    functional_rng: bool = False,
    ban_materialized: bool = True,
    ban_far_apart: bool | None = None,
) -> CutProblem:
    """The cut's candidates and costs. ``ban_far_apart`` applies Note [Values read far
    apart] (None reads ``torch._functorch.config.ban_recompute_used_far_apart``, True by
    default)."""
    closure = info.tangent_closure
    live_bw = info.bw_required
    bw_outputs = set(nodes_of(info.bwd_outputs))
    demanded = {
        n
        for n in info.nodes
        if n not in closure
        and n in live_bw
        and (n in bw_outputs or any(u in closure and u in live_bw for u in n.users))
    }
    cand_set = ancestors(demanded)
    candidates = tuple(n for n in info.nodes if n in cand_set)
    mutated = mutated_readers(list(info.nodes))
    static = {info.primals[i] for i in static_lifetime_input_indices or ()}
    banned: dict[torch.fx.Node, str] = {}
    nbytes: dict[torch.fx.Node, int | None] = {}
    rng_state: dict[torch.fx.Node, int] = {}
    far = far_apart_readers(info) if _ban_far_apart(ban_far_apart) else set()
    for n in candidates:
        if n.op == "placeholder":
            banned[n] = "graph input"
        elif n in info.fw_required:
            reason = ban_reason(n, n in mutated, functional_rng=functional_rng)
            if reason is None and is_random(n):
                # recorded even when the rule below bans it: a memory budget may lift that
                # soft ban, and a recomputed random op must replay the forward's draw
                rng_state[n] = rng_state_bytes(n)
            if (
                reason is None
                and ban_materialized
                and not must_recompute(n)  # a checkpoint policy's choice wins, as in torch
                and materialized_in_backward(n, info.fw_required)
            ):
                reason = "materialized in the backward"  # See Note [Values the backward must materialize]
            if reason is None and n in far:
                reason = FAR_APART  # See Note [Values read far apart]
            if reason is not None:
                banned[n] = reason
        if is_sym_node(n):
            nbytes[n] = SYMINT_BYTES
        elif (
            is_tuple_node(n)
            or not _is_tensor(n)
            or n.meta.get(EPILOGUE_MUTATION_KEY)
            or (must_recompute(n) and banned.get(n) is None)
        ):
            nbytes[n] = None
        else:
            nbytes[n] = 0 if n in static else node_bytes(n)
    dist: dict[torch.fx.Node, int] = {}
    for n in reversed(candidates):
        d = 0 if n in demanded else 1 << 30
        for u in n.users:
            du = dist.get(u)
            if du is not None and du + 1 < d:
                d = du + 1
        dist[n] = d
    return CutProblem(info, candidates, frozenset(demanded), banned, nbytes, dist, rng_state)


def saved_bytes(problem: CutProblem, saved: Collection[torch.fx.Node]) -> int:
    """Bytes the cost model charges for saving ``saved`` (and the generator states of the
    random ops the backward then replays; see Note [Min-cut flow graph])."""
    total = sum(problem.nbytes[n] or 0 for n in saved)
    if problem.rng_state:
        kept = set(saved)
        replayed = ancestors(problem.demanded - kept, stop=kept) - kept
        total += sum(b for n, b in problem.rng_state.items() if n in replayed)
    return total


def _materialized(node: torch.fx.Node) -> bool:
    """A graph input, or a value some reader cannot fuse with its producer: the forward
    writes it to memory whether or not it is saved. See Note [Saving values the forward
    materializes anyway]."""
    if node.op == "placeholder":
        return True
    return not all(fusible(node, u) for u in node.users)


# Note [Saving values the forward materializes anyway]
# A saved value the forward writes to memory anyway is cheaper than one it would not: an
# input (alive for the caller), or the output of an op a fusing compiler must materialize
# for a non-pointwise reader. A value read only by pointwise ops would otherwise live in
# registers of a fused kernel: saving it costs its memory *and* an extra write in the
# forward. So such a value's bytes count one and a half times (torch's min-cut: twice).
# ``split`` of an input whose halves feed ``sin``/``cos``: saving the input (and recomputing
# the halves and their pointwise backward inputs) beats saving ``neg(sin(.))`` and
# ``cos(.)``. A decomposed BatchNorm after a convolution: the backward needs ``x - mean``
# (and ``invstd``); saving the convolution's output ``x`` and the per-channel ``mean`` beats
# saving ``x - mean``, although the latter spares the mean's few bytes: the forward would
# write an activation-sized tensor more (micro_convnet's and resnet18's forward under
# aotkit_inductor, one per BatchNorm, before this rule replaced a "bytes first, then
# unmaterialized bytes" order; torch's choice). Not twice, as torch: gpt2's forward would
# then save its two embeddings (48 KB) rather than their sum (32 KB, read only by pointwise
# ops), 1.2% more bytes than torch in all. Among cuts equal in weighted bytes, the one
# saving fewer real bytes wins (gpt2's sum: 32 KB counted 48, beats the two embeddings' 48),
# then the distance tiebreak of Note [Min-cut flow graph] (torch instead multiplies each
# weight by 1.1 per hop from the backward). Fusing is judged as torch's min-cut judges it,
# on both ends (``fusible``): the output of an op no kernel fuses (a matmul, a convolution)
# is materialized even when only pointwise ops read it. So for a decomposed GELU backward,
# whose tangent-free part (erf, exp, muls) reads only the linear's output, that output is
# saved and the derivative computed in the backward, as torch does, rather than the
# derivative computed in the forward and saved (the same bytes, but a forward larger by a
# dozen nodes for Inductor to compile: micro_mlp's forward 70 nodes, torch's 39).


def _is_tensor(node: torch.fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.Tensor) or "tensor_meta" in node.meta


def solve(
    problem: CutProblem,
    *,
    allow_recompute: Collection[torch.fx.Node] = (),
    forbid_recompute: Collection[torch.fx.Node] = (),
    prefer_inputs: bool = False,
) -> list[torch.fx.Node]:
    """Solve the cut; returns the saved nodes in graph order.

    ``allow_recompute`` lifts the ban on those nodes (never a ban in ``HARD_BANS``);
    ``forbid_recompute`` bans more. The memory-budget partitioner uses both.
    ``prefer_inputs`` breaks byte ties toward saving graph inputs rather than values
    computed from them (the tiebreak of graph inputs becomes 0).
    See Note [Min-cut flow graph] for the graph and Note [Flow graph pruning] for what is
    left out of it.
    """
    cands = problem.candidates
    if not cands:
        return []
    index = {n: i for i, n in enumerate(cands)}
    # Three lexicographic levels (Note [Min-cut flow graph]): bytes, then distance to the
    # backward, then the number of sizes saved. ``sub`` exceeds the number of sizes and
    # ``scale`` the sum of the lower levels. Without symints ``sub`` is 1: costs as before.
    is_size = [is_sym_node(n) for n in cands]
    sub = sum(is_size) + 1
    scale = (max(problem.dist.values()) + 2) * (len(cands) + 1) * sub
    # First level (See Note [Saving values the forward materializes anyway]): bytes, those
    # of saved values only pointwise/view ops read (which a fusing compiler would not write
    # to memory unless saved) counted 1.5 times (doubled: ints); second level: bytes. ``big`` exceeds the sum
    # of the second level and the lower ones.
    unmat = [0 if _materialized(n) else (problem.nbytes[n] or 0) for n in cands]
    big = (sum(problem.nbytes[n] or 0 for n in cands) + 1) * scale
    allowed = set(allow_recompute)
    forbidden = set(forbid_recompute)
    demanded = problem.demanded
    # (tail, head, capacity or None for infinite)
    edges: list[tuple[int, int, int | None]] = []
    banned = [False] * len(cands)
    forced: set[int] = set()
    # the vertex standing for each candidate's ``in`` side; None: known to be on the sink side
    in_v: list[int | None] = [None] * len(cands)
    sink_side_out = set()  # candidates whose ``out`` vertex is on the sink side
    for i, n in enumerate(cands):
        reason = problem.banned.get(n)
        banned[i] = n in forbidden or (
            reason is not None and (n not in allowed or reason in HARD_BANS)
        )
        size = problem.nbytes[n]
        tiebreak = 0 if prefer_inputs and n.op == "placeholder" else problem.dist[n] + 1
        tiebreak = tiebreak * sub + is_size[i]
        cap = None if size is None else (2 * size + unmat[i]) * big + size * scale + tiebreak
        if n in demanded:
            sink_side_out.add(i)
            if banned[i]:
                if cap is None:
                    raise PartitionError(
                        f"{n.name} is needed by the backward but can be neither saved nor "
                        "recomputed"
                    )
                forced.add(i)
                continue
        inputs = n.all_input_nodes
        state = None if banned[i] else problem.rng_state.get(n)
        if banned[i]:
            in_v[i] = _SOURCE
        elif state is not None:
            # a replayed draw needs its generator state: see Note [Min-cut flow graph]
            in_v[i] = 2 * i
            edges.append((_SOURCE, 2 * i, state * (2 * big + scale) + tiebreak))
            for a in inputs:
                j = index[a]
                if j not in sink_side_out:
                    edges.append((2 * j + 1, 2 * i, None))
        elif len(inputs) == 1:
            j = index[inputs[0]]
            in_v[i] = None if j in sink_side_out else 2 * j + 1
        else:
            in_v[i] = 2 * i
            for a in inputs:
                j = index[a]
                if j not in sink_side_out:
                    edges.append((2 * j + 1, 2 * i, None))
        head = in_v[i]
        if head is not None:
            edges.append((head, 2 * i + 1, cap))
        if n in demanded:
            edges.append((2 * i + 1, _SINK, None))
    kept = _prune(edges)
    source_side, in_graph = flow_cut(kept) if kept else (set(), set())
    return [
        n
        for i, n in enumerate(cands)
        if i in forced
        or (
            2 * i + 1 in in_graph
            and 2 * i + 1 not in source_side
            and (banned[i] or in_v[i] in source_side)
        )
    ]


# Note [Flow graph pruning]
# The max-flow runs on as small a graph as possible; dropping these parts does not change
# the minimum cut:
# * a banned node the backward reads directly must be saved (its ``out`` vertex is joined
#   to both terminals); it is saved without entering the graph, and edges out of it vanish;
# * a demanded node's ``out`` vertex is on the sink side, so edges leaving it never cross
#   the cut: only its edge to the sink is kept;
# * a recomputable node with a single input ``a`` needs no ``in`` vertex: ``a_out -> u_in``
#   is infinite, so ``u_in`` is always on ``a_out``'s side; its capacity edge starts at
#   ``a_out`` instead (views and unary pointwise ops, most of the graph, lose a vertex);
# * a vertex the source cannot reach, or that cannot reach the sink, carries no flow.


def _prune(edges: list[tuple[int, int, int | None]]) -> list[tuple[int, int, int | None]]:
    """Keep the edges on some source-to-sink path. See Note [Flow graph pruning]."""
    succ: dict[int, list[int]] = {}
    pred: dict[int, list[int]] = {}
    for u, v, _ in edges:
        succ.setdefault(u, []).append(v)
        pred.setdefault(v, []).append(u)

    def reach(start: int, adj: dict[int, list[int]]) -> set[int]:
        seen = {start}
        stack = [start]
        while stack:
            for w in adj.get(stack.pop(), ()):
                if w not in seen:
                    seen.add(w)
                    stack.append(w)
        return seen

    live = reach(_SOURCE, succ) & reach(_SINK, pred)
    if _SINK not in live:
        return []
    return [e for e in edges if e[0] in live and e[1] in live]


def flow_cut(edges: list[tuple[int, int, int | None]]) -> tuple[set[Any], set[Any]]:
    """(source side of the minimum cut, every vertex) of the flow graph. See Note [Min-cut
    without networkx]."""
    try:
        return source_side(edges, _SOURCE, _SINK)
    except Unbounded as e:
        raise PartitionError(
            "no finite cut: some value the backward needs can be neither saved nor recomputed"
        ) from e


def _backward_dependencies(graph: torch.fx.Graph, num_fwd_outputs: int) -> set[torch.fx.Node]:
    out = graph.find_nodes(op="output")[0].args[0]
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    return ancestors(nodes_of(outs[num_fwd_outputs:]))


def prepare_joint(joint_module: torch.fx.GraphModule, num_fwd_outputs: int) -> JointInfo:
    """CSE the joint graph (on a copy), then classify its nodes.

    A forward-only value is never merged with one the backward depends on: merging them
    could turn a value the backward would recompute cheaply into one the forward must save.
    """
    bw_deps = _backward_dependencies(joint_module.graph, num_fwd_outputs)

    def group(node: torch.fx.Node) -> Hashable:
        return node in bw_deps

    rep = duplicates(joint_module.graph, group=group)
    # With nothing to merge, read the joint graph itself (it is never modified).
    graph = cse_graph(joint_module.graph, rep=rep) if rep else joint_module.graph
    return analyze_joint(joint_module, num_fwd_outputs, graph=graph)


def partition_with_saved(
    info: JointInfo,
    problem: CutProblem,
    saved: Sequence[torch.fx.Node],
    static_lifetime_input_indices: Sequence[int] | None,
) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """Build the graphs for a chosen saved set, checking no banned node is recomputed.

    Random ops the backward recomputes replay the forward's draw (Note [Functionalized RNG]).
    """
    fw_allowed = set(info.nodes) - info.tangent_closure
    never_in_bw = {n for n, reason in problem.banned.items() if reason in HARD_BANS}
    bw_allowed = set(info.nodes) - (never_in_bw - set(saved))
    fw, bw = build_modules(
        info,
        saved,
        fw_allowed=fw_allowed,
        bw_allowed=bw_allowed,
        static_lifetime_input_indices=static_lifetime_input_indices,
        late_recompute=True,
    )
    if problem.rng_state:
        replay_recomputed_rng_inplace(fw, bw, len(info.fwd_outputs))
    return fw, bw


def _ban_materialized(value: bool | None) -> bool:
    if value is not None:
        return value
    import torch._functorch.config as functorch_config

    return bool(getattr(functorch_config, "ban_recompute_materialized_backward", True))


def _ban_far_apart(value: bool | None) -> bool:
    if value is not None:
        return value
    import torch._functorch.config as functorch_config

    return bool(getattr(functorch_config, "ban_recompute_used_far_apart", True))


def min_cut_rematerialization_partition(
    joint_module: torch.fx.GraphModule,
    joint_inputs: Any,
    *,
    num_fwd_outputs: int,
    compiler: str = "inductor",
    static_lifetime_input_indices: Sequence[int] | None = None,
    functionalize_rng: bool | None = None,
    ban_recompute_materialized_backward: bool | None = None,
    ban_recompute_used_far_apart: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """Split ``joint_module`` saving as few bytes as possible for the backward.

    The backward recomputes chains of cheap pointwise and view ops when that lowers the
    bytes saved; it never recomputes matmuls, convolutions, attention or shrinking
    reductions. Random ops are recomputed only with functionalized RNG
    (``functionalize_rng``; None reads ``aotkit_schemas.functionalize_rng_enabled()``),
    replaying the forward's draw. See Note [Min-cut flow graph], Note [Recomputation
    policy] and Note [Functionalized RNG].
    Like torch's, it does not recompute a value a backward reader cannot fuse (the backward
    would have to write it to memory anyway): See Note [Values the backward must
    materialize]. ``ban_recompute_materialized_backward=False`` lifts that rule; None reads
    torch's ``torch._functorch.config.ban_recompute_materialized_backward`` (True by
    default).
    Nor does it recompute a forward value's readers that come after a kernel boundary (See
    Note [Values read far apart]); ``ban_recompute_used_far_apart=False`` lifts that rule,
    None reads ``torch._functorch.config.ban_recompute_used_far_apart`` (True by default).
    ``joint_module`` is not modified; ``joint_inputs``, ``compiler`` and other keyword
    arguments are accepted for compatibility with torch's signature and ignored.
    """
    del joint_inputs, compiler, kwargs
    # See Note [Partitioning at region boundaries]
    joint_module = partition_region_boundaries(
        joint_module, min_cut_rematerialization_partition, functionalize_rng=functionalize_rng,
        ban_recompute_materialized_backward=ban_recompute_materialized_backward,
        ban_recompute_used_far_apart=ban_recompute_used_far_apart,
    )
    info = prepare_joint(joint_module, num_fwd_outputs)
    problem = build_problem(
        info,
        static_lifetime_input_indices,
        functional_rng=functional_rng(functionalize_rng),
        ban_materialized=_ban_materialized(ban_recompute_materialized_backward),
        ban_far_apart=ban_recompute_used_far_apart,
    )
    saved = solve(problem)
    fw, bw = partition_with_saved(info, problem, saved, static_lifetime_input_indices)
    return _raise_getitems(fw), _raise_getitems(bw)


def _raise_getitems(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Move every ``getitem`` right after the multi-output node it reads, keeping the
    getitems' relative order, as torch's min-cut does: a multi-output node's results are
    then unpacked (and the tuple freed) at once, and the graph text is torch's."""
    getitems = gm.graph.find_nodes(op="call_function", target=operator.getitem)
    if not getitems:
        return gm
    for node in reversed(getitems):
        parents = node.all_input_nodes
        if len(parents) == 1:
            parents[0].append(node)
    gm.recompile()
    return gm


# See Note [Compiler cache keys] in aotkit_schemas
mark_cache_key(min_cut_rematerialization_partition, "aotkit.min_cut_rematerialization_partition")

"""Reading a joint graph: which nodes belong to the forward, which to the backward.

See Note [Joint graph calling convention] in ``aotkit_schemas._protocols``.

# Note [Forward and backward regions]
# Every partitioner starts from the same three sets of joint-graph nodes:
#
# * ``tangent_closure``: the tangents and every node that depends on one. These can only
#   run in the backward graph.
# * ``fw_required``: the ancestors of the forward returns (plus forward side effects). These
#   must run in the forward graph.
# * ``bw_required``: the ancestors of the input gradients. Anything outside
#   ``fw_required | bw_required`` is dead and never appears in either graph; in particular a
#   random op whose result nobody reads is dropped rather than copied into the backward.
#
# A node in ``bw_required - tangent_closure`` (say ``t(weight)`` feeding a backward ``mm``)
# can be computed in either graph; partitioners differ only in how they decide that.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch._higher_order_ops.effects import with_effects
from torch._prims.rng_prims import run_and_save_rng_state

_BACKWARD_PLACEHOLDER_PREFIXES = ("tangents", "bwd_seed", "bwd_base_offset")


def is_tangent(node: torch.fx.Node) -> bool:
    """A placeholder fed to the backward graph (a tangent or a backward RNG seed)."""
    return node.op == "placeholder" and str(node.target).startswith(_BACKWARD_PLACEHOLDER_PREFIXES)


def is_primal(node: torch.fx.Node) -> bool:
    """A placeholder fed to the forward graph."""
    return node.op == "placeholder" and not is_tangent(node)


def is_tuple_node(node: torch.fx.Node) -> bool:
    """True for a multi-output op (its value is a tuple read through ``getitem``)."""
    return isinstance(node.meta.get("val"), (tuple, list))


def is_getitem(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is operator.getitem


def has_side_effect(node: torch.fx.Node) -> bool:
    """An op that must run even when nothing reads its result (mutation, assert).

    Random ops are *not* side effects here: a random op whose value is unused is dead.
    """
    return is_impure(node, impure_random=False)


_IMPURE_CACHE: dict[tuple[torch._ops.OpOverload, bool], bool] = {}


def is_impure(node: torch.fx.Node, *, impure_random: bool) -> bool:
    """``node.is_impure``, cached per ATen overload (whose answer ignores the arguments)."""
    if node.op != "call_function":
        return False
    target = node.target
    if target is run_and_save_rng_state:
        # a draw, whatever fx says of higher-order ops. See Note [Functionalized RNG].
        return impure_random
    if target is with_effects:
        # an effectful op runs once per call, in its own graph: never recomputed (See
        # Note [Effect tokens] in aotkit_tracing)
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return bool(node.is_impure(impure_random=impure_random))
    key = (target, impure_random)
    hit = _IMPURE_CACHE.get(key)
    if hit is None:
        hit = _IMPURE_CACHE[key] = bool(node.is_impure(impure_random=impure_random))
    return hit


def _partitioner_tag(node: torch.fx.Node) -> str | None:
    tag = node.meta.get("partitioner_tag")
    return tag if isinstance(tag, str) else None


def nodes_of(values: Iterable[Any]) -> list[torch.fx.Node]:
    return [v for v in values if isinstance(v, torch.fx.Node)]


def ancestors(
    roots: Iterable[torch.fx.Node],
    stop: frozenset[torch.fx.Node] | set[torch.fx.Node] = frozenset(),
) -> set[torch.fx.Node]:
    """All nodes reachable from ``roots`` through inputs; ``stop`` nodes are not expanded."""
    seen: set[torch.fx.Node] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node in stop:
            continue
        stack.extend(node.all_input_nodes)
    return seen


@dataclass(frozen=True)
class JointInfo:
    """The regions of a joint graph. See Note [Forward and backward regions]."""

    # the module the joint graph came from (owner of its get_attr targets)
    root: torch.fx.GraphModule
    graph: torch.fx.Graph
    # every node except the output node, in graph (topological) order
    nodes: tuple[torch.fx.Node, ...]
    order: dict[torch.fx.Node, int]
    primals: tuple[torch.fx.Node, ...]
    # length = # backward placeholders (tangents first, then any backward RNG seeds)
    tangents: tuple[torch.fx.Node, ...]
    # length = num_fwd_outputs
    fwd_outputs: tuple[Any, ...]
    # length = # primals (None for a primal that does not require grad)
    bwd_outputs: tuple[Any, ...]
    tangent_closure: frozenset[torch.fx.Node]
    # side-effecting nodes, in graph order: they run even though nothing reads them
    fw_effects: tuple[torch.fx.Node, ...]
    bw_effects: tuple[torch.fx.Node, ...]
    fw_required: frozenset[torch.fx.Node]
    bw_required: frozenset[torch.fx.Node]

    def __post_init__(self) -> None:
        overlap = self.fw_required & self.tangent_closure
        if overlap:
            names = sorted(n.name for n in overlap)[:5]
            raise ValueError(f"forward returns depend on tangents: {names}")

    @property
    def has_partitioner_tags(self) -> bool:
        return any(_partitioner_tag(n) is not None for n in self.nodes)


def _outputs(graph: torch.fx.Graph) -> list[Any]:
    out = graph.find_nodes(op="output")[0].args[0]
    return list(out) if isinstance(out, (list, tuple)) else [out]


def analyze_joint(
    gm: torch.fx.GraphModule, num_fwd_outputs: int, *, graph: torch.fx.Graph | None = None
) -> JointInfo:
    """Classify the nodes of ``graph`` (default ``gm.graph``). Never modifies either."""
    graph = gm.graph if graph is None else graph
    nodes = tuple(n for n in graph.nodes if n.op != "output")
    order = {n: i for i, n in enumerate(nodes)}
    outputs = _outputs(graph)
    if not 0 <= num_fwd_outputs <= len(outputs):
        raise ValueError(
            f"num_fwd_outputs={num_fwd_outputs} but the joint graph returns {len(outputs)} values"
        )
    primals = tuple(n for n in nodes if is_primal(n))
    tangents = tuple(n for n in nodes if is_tangent(n))
    fwd_outputs = tuple(outputs[:num_fwd_outputs])
    bwd_outputs = tuple(outputs[num_fwd_outputs:])

    closure: set[torch.fx.Node] = set()
    for node in nodes:
        if (
            is_tangent(node)
            or _partitioner_tag(node) == "must_be_in_backward"
            or any(a in closure for a in node.all_input_nodes)
        ):
            closure.add(node)

    effects = [n for n in nodes if has_side_effect(n)]
    fw_effects = tuple(n for n in effects if n not in closure)
    bw_effects = tuple(n for n in effects if n in closure)
    return JointInfo(
        root=gm,
        graph=graph,
        nodes=nodes,
        order=order,
        primals=primals,
        tangents=tangents,
        fwd_outputs=fwd_outputs,
        bwd_outputs=bwd_outputs,
        tangent_closure=frozenset(closure),
        fw_effects=fw_effects,
        bw_effects=bw_effects,
        fw_required=frozenset(ancestors(nodes_of(fwd_outputs) + list(fw_effects))),
        bw_required=frozenset(ancestors(nodes_of(bwd_outputs) + list(bw_effects))),
    )


def forward_available(info: JointInfo, region: set[torch.fx.Node]) -> set[torch.fx.Node]:
    """Grow a forward region by the ``getitem``s of its nodes (a tuple is never saved, its
    items are).

    Symbolic scalars are *not* pulled in: size arithmetic the backward does on forward
    sizes stays in the backward, which receives the sizes it starts from (see
    ``default_partition``).
    """
    grown = set(region)
    for node in info.nodes:
        if node in grown or not is_getitem(node) or node in info.tangent_closure:
            continue
        if all(a in grown for a in node.all_input_nodes):
            grown.add(node)
    return grown


def sorted_nodes(info: JointInfo, nodes: Iterable[torch.fx.Node]) -> list[torch.fx.Node]:
    return sorted(set(nodes), key=info.order.__getitem__)


def unique(nodes: Sequence[torch.fx.Node]) -> list[torch.fx.Node]:
    return list(dict.fromkeys(nodes))

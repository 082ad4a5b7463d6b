"""Autograd's detach nodes for saved outputs, added to native joint traces.

# Note [Detach nodes of saved outputs]
# When autograd saves an output of the op that produced it (tanh saves its result), the
# SavedVariable keeps a shallow copy of it, and unpacking it in the backward makes another.
# For tensors with a Python dispatch key (torch's Python FunctionalTensor) each copy
# dispatches ``aten.detach``, so a joint traced with the Python mode records
# ``detach = detach(tanh)`` right after the op, ``detach_1 = detach(detach)`` where the
# backward starts the node, and the backward formula reads ``detach_1``. After
# partitioning, the forward returns ``detach`` and the backward takes a placeholder of that
# name. The C++ Functionalize key copies without dispatching, so a native trace (See Note
# [Native functionalization] in aotkit_functional) records neither. To give torch's
# graphs, names included, a native trace:
#   * after the forward, walks the autograd graph of the outputs and records, per node, the
#     saved tensors that are its own differentiable outputs (they unpack to a tensor whose
#     grad_fn is the node; non-differentiable outputs, like layer norm's mean and rstd, are
#     saved as they are and get no detach, as in torch);
#   * during the backward, records with node pre- and post-hooks which graph nodes each such
#     node's formula created;
#   * afterwards, ``match_python_mode_graph`` inserts the first detach after the op that
#     produced the value (after its getitems) and the second before the formula's first
#     node, makes the formula read the second, and names every detach in graph order
#     (``detach``, ``detach_1``, ...), as make_fx names them in the Python mode (a graph
#     that already has detach nodes is rebuilt to get the names right).
# On the corpus, the native forward and backward graphs read exactly as the Python mode's
# for all but one program (tests/test_native_functionalization.py).
# Saves made by autograd nodes the outputs do not reach are not seen; their detaches would
# be dead in torch's joint and are gone from its forward and backward graphs anyway. A
# backward that runs a node twice (the per-output retries of Note [Backward paths through
# stale saved values]) leaves the graph as traced.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot

_DETACH = torch.ops.aten.detach.default


@dataclass
class _NodeSaves:
    """One autograd node that saved some of its own outputs."""

    values: list[torch.fx.Node]
    # graph nodes its backward formula created, and the last node before them
    before: torch.fx.Node | None = None
    formula: set[torch.fx.Node] = field(default_factory=set)
    runs: int = 0


class SavedOutputRecorder:
    """See Note [Detach nodes of saved outputs]. Use inside the make_fx trace: ``watch``
    after the forward, then run the backward, then ``close``."""

    def __init__(self) -> None:
        self.saves: list[_NodeSaves] = []
        self._handles: list[Any] = []

    def watch(self, outputs: Sequence[Any]) -> None:
        mode = get_proxy_mode()
        if mode is None:
            return
        tracer = mode.tracer
        graph: torch.fx.Graph = tracer.graph
        seen: set[int] = set()
        stack: list[Any] = [
            o.grad_fn for o in outputs if isinstance(o, torch.Tensor) and o.grad_fn is not None
        ]
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            stack.extend(fn for fn, _ in node.next_functions)
            values = [
                v for v in (_graph_value(t, tracer) for t in _own_saved_outputs(node))
                if v is not None
            ]
            if values:
                self._hook(node, _NodeSaves(values), graph)

    def _hook(self, node: Any, saves: _NodeSaves, graph: torch.fx.Graph) -> None:
        self.saves.append(saves)

        def pre(grad_outputs: Any) -> None:
            saves.runs += 1
            saves.before = last_computed(graph)

        def post(grad_inputs: Any, grad_outputs: Any) -> None:
            n = saves.before.next if saves.before is not None else None
            while n is not None and n.op != "root":
                saves.formula.add(n)
                n = n.next

        self._handles += [node.register_prehook(pre), node.register_hook(post)]

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _own_saved_outputs(node: Any) -> list[torch.Tensor]:
    if hasattr(node, "saved_tensors") and not hasattr(node, "_saved_self"):
        try:
            saved: Sequence[Any] = node.saved_tensors  # a custom autograd.Function
        except RuntimeError:
            return []
        return [t for t in saved if isinstance(t, torch.Tensor) and t.grad_fn is node]
    kind = type(node)
    names = _saved_names.get(kind)
    if names is None:
        names = _saved_names[kind] = tuple(n for n in dir(kind) if n.startswith("_saved_"))
    out = []
    for name in names:
        t = getattr(node, name)
        if isinstance(t, torch.Tensor) and t.grad_fn is node:
            out.append(t)
    return out


# autograd node class -> its ``_saved_*`` properties (``dir`` is slow)
_saved_names: dict[type, tuple[str, ...]] = {}


def _graph_value(t: torch.Tensor, tracer: Any) -> torch.fx.Node | None:
    # the wrapper's current value, without syncing (a sync could record view replays)
    inner = torch._from_functional_tensor(t) if torch._is_functional_tensor(t) else t
    proxy = get_proxy_slot(inner, tracer, None)
    node = getattr(proxy, "proxy", proxy)
    node = getattr(node, "node", None)
    return node if isinstance(node, torch.fx.Node) else None


def last_computed(graph: torch.fx.Graph) -> torch.fx.Node | None:
    """The last node that is not a placeholder (tangent placeholders are made after the
    forward, but belong at the top)."""
    for n in reversed(graph.nodes):
        if n.op != "placeholder":
            last: torch.fx.Node = n
            return last
    return None


# Note [Forward and backward tags]
# torch's joint traces tag every node made while the forward runs ``partitioner_tag:
# is_forward`` and every node of the backward ``is_backward``; its default partitioner puts
# in the forward every non-tangent node up to the last forward-tagged one. aotkit's joint
# traces record where the forward ended and tag the same way (``tag_forward_and_backward``),
# so that a node made by the forward after its last output-producing op (the detach of a
# saved output, a kept input mutation) stays in the forward graph, as in torch's.
# Where the forward ended is recorded as the nodes made so far (``nodes_made_so_far``), not
# as the last of them: make_fx's dead-code elimination drops unused size arithmetic, and
# under dynamic shapes the forward's last node is often such a node (``ne`` of a size
# guard). The end is the last node made by the forward that survived (``forward_end``).
# Resolving a dropped node instead tagged the whole backward ``is_forward``, and the
# default partitioner then ran the backward's tangent-free nodes (``t(t_1)``, the transpose
# of a Linear weight's transpose) in the forward and saved their results, where torch's
# saves the forward's own ``t`` values.
# Placeholders are tagged as torch's are (its post-forward pass tags every node the
# trace has made so far, the tangent placeholders ``is_backward``, the rest
# ``is_forward``): primals ``is_forward``, tangents ``is_backward``. aotkit's
# partitioners count primals as forward and tangents as backward either way.


def nodes_made_so_far() -> list[torch.fx.Node]:
    """The nodes of the graph make_fx is building, in order: a mark of where tracing is,
    read after tracing with ``forward_end``. See Note [Forward and backward tags]."""
    mode = get_proxy_mode()
    assert mode is not None, "called inside make_fx"
    return list(mode.tracer.graph.nodes)


def forward_end(graph: torch.fx.Graph, made: Sequence[torch.fx.Node]) -> torch.fx.Node:
    """The last non-placeholder node of ``made`` that is still in ``graph`` (the first node
    of ``graph`` when there is none: a forward that ran no op returns its inputs).
    See Note [Forward and backward tags]."""
    alive = set(graph.nodes)
    for n in reversed(made):
        if n.op != "placeholder" and n in alive:
            return n
    first: torch.fx.Node = next(iter(graph.nodes))
    return first


def tag_forward_and_backward(graph: torch.fx.Graph, forward_end: torch.fx.Node) -> None:
    """Tag the nodes up to ``forward_end`` as forward, the rest as backward; primal
    placeholders as forward, tangent ones as backward (the output stays untagged). See
    Note [Forward and backward tags]."""
    tag = "is_forward"
    for n in graph.nodes:
        if n.op == "placeholder":
            n.meta["partitioner_tag"] = (
                "is_backward" if str(n.target).startswith("tangents") else "is_forward"
            )
            continue
        # a backward-only write keeps its tag (See Note [Data mutations in the backward])
        if n.op not in ("placeholder", "output") and n.meta.get("partitioner_tag") != (
            "must_be_in_backward"
        ):
            n.meta["partitioner_tag"] = tag
        if n is forward_end:
            tag = "is_backward"


def match_python_mode_graph(gm: torch.fx.GraphModule, recorder: SavedOutputRecorder) -> None:
    """Make a native joint trace read as the Python mode's: add the detach nodes of Note
    [Detach nodes of saved outputs], and leave out keyword arguments that are None by
    default (the C++ key passes ``attn_mask=None`` where the Python mode passes nothing)."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.kwargs and isinstance(node.target, torch._ops.OpOverload):
            _drop_default_none_kwargs(node)
    _add_saved_output_detaches(gm, recorder)
    gm.recompile()


def _drop_default_none_kwargs(node: torch.fx.Node) -> None:
    defaults = _none_default_kwargs(node.target)
    if any(v is None and k in defaults for k, v in node.kwargs.items()):
        node.kwargs = {k: v for k, v in node.kwargs.items() if not (v is None and k in defaults)}


_none_defaults: dict[Any, frozenset[str]] = {}


def _none_default_kwargs(op: Any) -> frozenset[str]:
    names = _none_defaults.get(op)
    if names is None:
        names = _none_defaults[op] = frozenset(
            a.name for a in op._schema.arguments
            if a.kwarg_only and a.has_default_value() and a.default_value is None
        )
    return names


def _add_saved_output_detaches(gm: torch.fx.GraphModule, recorder: SavedOutputRecorder) -> None:
    saves = [s for s in recorder.saves if s.runs == 1 and s.before is not None]
    if not saves or any(s.runs > 1 for s in recorder.saves):
        return
    graph = gm.graph
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    # (anchor, kind, item): insert after ``anchor``; saves before unpacks at one anchor
    events: list[tuple[int, int, int, Any]] = []
    for s in saves:
        for v in s.values:
            events.append((order[_after_getitems(v)], 0, order[v], v))
        assert s.before is not None
        events.append((order[s.before], 1, len(events), s))
    events.sort(key=lambda e: e[:3])
    if any(n.op == "call_function" and n.target is _DETACH for n in graph.nodes):
        # names must follow graph order: rebuild (rare: a detach the program asked for)
        _rebuild_with_detaches(gm, events)
        return
    first: dict[torch.fx.Node, torch.fx.Node] = {}
    cursor: torch.fx.Node | None = None
    last_anchor = -1
    for anchor_index, kind, _, item in events:
        if anchor_index != last_anchor:
            cursor, last_anchor = None, anchor_index
        anchor = cursor or nodes[anchor_index]
        if kind == 0:
            if item in first:
                continue
            cursor = first[item] = _insert_detach(graph, anchor, item, item, "is_forward")
            continue
        for v in item.values:
            cursor = d = _insert_detach(graph, cursor or anchor, first[v], v, "is_backward")
            for user in list(v.users):
                if user in item.formula:
                    user.replace_input_with(v, d)


def _insert_detach(
    graph: torch.fx.Graph, after: torch.fx.Node, source: torch.fx.Node, value: torch.fx.Node,
    tag: str,
) -> torch.fx.Node:
    with graph.inserting_after(after):
        d = graph.create_node("call_function", _DETACH, (source,), {}, name="detach")
    _set_meta(d, value, tag)
    return d


def _set_meta(d: torch.fx.Node, value: torch.fx.Node, tag: str) -> None:
    # a detach is the same fake tensor as far as the graph's readers care (sizes, strides,
    # storage); sharing the example value saves a fake-tensor dispatch per node
    # ... and it comes from the same source line (See Note [Preserved node meta])
    for key in ("val", "tensor_meta", "stack_trace", "nn_module_stack"):
        if key in value.meta:
            d.meta[key] = value.meta[key]
    # See Note [Forward and backward tags]: the first detach is made in the forward
    d.meta["partitioner_tag"] = tag


def _rebuild_with_detaches(gm: torch.fx.GraphModule, events: list[tuple[int, int, int, Any]]) -> None:
    """The graph copied node by node with the detaches inserted, every detach named in
    graph order."""
    old = gm.graph
    at: dict[int, list[tuple[int, Any]]] = {}
    for anchor_index, kind, _, item in events:
        at.setdefault(anchor_index, []).append((kind, item))
    reads: dict[torch.fx.Node, _NodeSaves] = {}
    for _, kind, _, item in events:
        if kind == 1:
            for n in item.formula:
                reads[n] = item
    new = torch.fx.Graph()
    new._codegen = old._codegen
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    first: dict[torch.fx.Node, torch.fx.Node] = {}
    unpacked: dict[int, dict[torch.fx.Node, torch.fx.Node]] = {}

    def detach_of(source: torch.fx.Node, value: torch.fx.Node, tag: str) -> torch.fx.Node:
        d = new.create_node("call_function", _DETACH, (source,), {}, name="detach")
        _set_meta(d, value, tag)
        return d

    for i, node in enumerate(old.nodes):
        s = reads.get(node)
        mapping = unpacked.get(id(s), {}) if s is not None else {}

        def arg(n: torch.fx.Node, mapping: dict[torch.fx.Node, torch.fx.Node] = mapping) -> torch.fx.Node:
            return mapping.get(n) or env[n]

        if node.op == "call_function" and node.target is _DETACH:
            copied = new.create_node(
                "call_function", _DETACH, torch.fx.node.map_arg(node.args, arg), {}, name="detach"
            )
            copied.meta = dict(node.meta)
        else:
            copied = new.node_copy(node, arg)
        env[node] = copied
        for kind, item in at.get(i, ()):
            if kind == 0:
                if item not in first:
                    first[item] = detach_of(env[item], item, "is_forward")
            else:
                unpacked[id(item)] = {
                    v: detach_of(first[v], v, "is_backward") for v in item.values
                }
    gm.graph = new


def _after_getitems(v: torch.fx.Node) -> torch.fx.Node:
    """``v``, or the last getitem of the multi-output op ``v`` is a getitem of."""
    if v.op == "call_function" and v.target is operator.getitem:
        producer = v.args[0]
        assert isinstance(producer, torch.fx.Node)
        last = v
        for user in producer.users:
            if user.target is operator.getitem and last < user:
                last = user
        return last
    return v

"""Common-subexpression elimination for joint graphs (a pure pass)."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import Any

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

from ._extract import copy_node
from ._joint import is_impure
from ._ops import is_mutating

_ATOMS = (bool, int, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


class _Unhashable(Exception):
    pass


def _freeze(arg: Any, rep: dict[torch.fx.Node, torch.fx.Node]) -> Hashable:
    """A hashable key for an FX argument; scalars keep their type (``1`` vs ``True``)."""
    kind = type(arg)
    if kind is torch.fx.Node:
        node: torch.fx.Node = rep.get(arg, arg)
        return node
    if kind is tuple or kind is list:
        return (kind, *[_freeze(a, rep) for a in arg])
    if isinstance(arg, (list, tuple)):
        # FX stores list arguments as its immutable_list (a list subclass): a shape, a
        # dimension list. Refusing them kept every ``view``/``full``/``sum(dims)`` unmerged.
        base = list if isinstance(arg, list) else tuple
        return (base, *[_freeze(a, rep) for a in arg])
    if kind is int or kind is bool or kind is str or arg is None:
        return (kind, arg)
    if kind is float:
        # repr keeps 0.0 and -0.0 apart; NaN never equals itself, so never merge it
        if math.isnan(arg):
            raise _Unhashable
        return (kind, repr(arg))
    if isinstance(arg, _ATOMS):
        return (kind, arg)
    if isinstance(arg, dict):
        return (dict, *((k, _freeze(v, rep)) for k, v in sorted(arg.items())))
    if isinstance(arg, slice):
        return (slice, _freeze((arg.start, arg.stop, arg.step), rep))
    raise _Unhashable


def duplicates(
    graph: torch.fx.Graph,
    *,
    group: Callable[[torch.fx.Node], Hashable] | None = None,
) -> dict[torch.fx.Node, torch.fx.Node]:
    """Map each redundant node of ``graph`` to the earlier node computing the same value.

    Two ``call_function`` nodes compute the same value when their targets, arguments (after
    merging) and ``group(node)`` agree, and no mutation lies between them (See Note [CSE
    across mutations]). Random ops and ops with side effects are left alone.
    """
    rep: dict[torch.fx.Node, torch.fx.Node] = {}
    seen: dict[Hashable, torch.fx.Node] = {}
    bases = _mutation_bases(graph) | _aliasing_outputs(graph)
    region = 0
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if is_mutating(node):
            region += 1
            continue
        if is_impure(node, impure_random=True) or node in bases:
            continue
        try:
            key = (
                node.target,
                _freeze(node.args, rep),
                _freeze(node.kwargs, rep),
                group(node) if group is not None else None,
                region,
            )
        except _Unhashable:
            continue
        first = seen.setdefault(key, node)
        if first is not node:
            rep[node] = first
    return rep


# Note [CSE across mutations]
# A graph may mutate tensors: torch's inductor-style traces keep the copy of a mutated buffer
# (batch norm's running statistics) in the graph, as ``aten.copy_`` into the input. A value
# computed before a mutation and the same expression computed after it may differ, so
# identical calls are merged only within one mutation region: the stretch of nodes between
# two mutating calls, as torch's ``fx_graph_cse`` does. (Refusing to merge anything in such a
# graph left every model with batch norm un-CSE'd: resnet18's backward handed Inductor 44
# more nodes than torch's, twenty scalar ``full`` among them.) A mutating call is never
# merged, and neither is a value that a functionalized mutation (``auto_functionalized``)
# takes as its base: Inductor re-inplaces it, and two such bases must stay two buffers.


def _mutation_bases(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The nodes ``auto_functionalized``(``_v2``) calls of ``graph`` take as mutable bases."""
    hops = torch.ops.higher_order
    v1 = getattr(hops, "auto_functionalized", None)
    v2 = getattr(hops, "auto_functionalized_v2", None)
    bases: set[torch.fx.Node] = set()
    if v2 is not None:
        for n in graph.find_nodes(op="call_function", target=v2):
            _add_nodes(n.kwargs.get("_all_bases", ()), bases)
    if v1 is not None:
        for n in graph.find_nodes(op="call_function", target=v1):
            op = n.args[0] if n.args else None
            schema = getattr(op, "_schema", None)
            for a in schema.arguments if schema is not None else ():
                if a.alias_info is not None and a.alias_info.is_write:
                    _add_nodes(n.kwargs.get(a.name), bases)
    return bases


# Note [CSE keeps outputs apart]
# Two outputs computed by identical calls (``return x.sin(), x.sin()``, two ``zeros``) are
# two tensors in eager mode: writing to one leaves the other alone. Merged, the graph would
# return one tensor twice. So a node whose value shares storage with a graph output (the
# output itself or a view of it) is never merged, as in torch's ``fx_graph_cse``; a node
# without a ``val`` is kept apart when it is itself an output.


def _aliasing_outputs(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The nodes of ``graph`` whose value is, or shares storage with, a graph output. See
    Note [CSE keeps outputs apart]."""
    outputs = graph.find_nodes(op="output")
    if not outputs:
        return set()
    outs = set(outputs[0].all_input_nodes)
    storages = {s for s in map(_storage, outs) if s is not None}
    kept = set(outs)
    if storages:
        for node in graph.nodes:
            st = _storage(node)
            if st is not None and st in storages:
                kept.add(node)
    return kept


def _storage(node: torch.fx.Node) -> Any:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return StorageWeakRef(val.untyped_storage())  # type: ignore[no-untyped-call]
    except (NotImplementedError, RuntimeError):  # sparse, nested: no storage to compare
        return None


def _add_nodes(value: Any, into: set[torch.fx.Node]) -> None:
    for v in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(v, torch.fx.Node):
            into.add(v)


def cse(
    gm: torch.fx.GraphModule,
    *,
    group: Callable[[torch.fx.Node], Hashable] | None = None,
) -> torch.fx.GraphModule:
    """Return a copy of ``gm`` in which identical pure calls are computed once.

    See ``cse_graph``; this wraps its result in a GraphModule with ``gm``'s attributes.
    """
    out = torch.fx.GraphModule(gm, cse_graph(gm.graph, group=group), class_name=type(gm).__name__)
    out.meta = dict(gm.meta)
    return out


def cse_graph(
    graph: torch.fx.Graph,
    *,
    group: Callable[[torch.fx.Node], Hashable] | None = None,
    rep: dict[torch.fx.Node, torch.fx.Node] | None = None,
) -> torch.fx.Graph:
    """Return a copy of ``graph`` in which identical pure calls are computed once.

    The first of a set of identical nodes survives under its own name (see ``duplicates``,
    whose result may be passed as ``rep``). ``graph`` is not modified.

    Before::

        t = aten.t(primals_2); addmm = aten.addmm(primals_3, primals_1, t)
        t_5 = aten.t(primals_2); mm = aten.mm(tangents_1, t_5)

    After::

        t = aten.t(primals_2); addmm = aten.addmm(primals_3, primals_1, t)
        mm = aten.mm(tangents_1, t)
    """
    rep = duplicates(graph, group=group) if rep is None else rep
    new_graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in graph.nodes:
        if node in rep:
            env[node] = env[rep[node]]
        else:
            env[node] = copy_node(new_graph, node, env)  # See Note [Copying joint nodes]
    return new_graph

"""Common-subexpression elimination for joint graphs (a pure pass)."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import Any

import torch
import torch.fx

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
    merging) and ``group(node)`` agree. Random ops, ops with side effects and graphs that
    mutate tensors are left alone.
    """
    nodes = list(graph.nodes)
    if any(is_mutating(n) for n in nodes):
        return {}
    rep: dict[torch.fx.Node, torch.fx.Node] = {}
    seen: dict[Hashable, torch.fx.Node] = {}
    for node in nodes:
        if node.op != "call_function" or is_impure(node, impure_random=True):
            continue
        try:
            key = (
                node.target,
                _freeze(node.args, rep),
                _freeze(node.kwargs, rep),
                group(node) if group is not None else None,
            )
        except _Unhashable:
            continue
        first = seen.setdefault(key, node)
        if first is not node:
            rep[node] = first
    return rep


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

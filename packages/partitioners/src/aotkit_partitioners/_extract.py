"""Build the forward and backward GraphModules once the saved values are chosen.

Every partitioner ends here, so the calling convention is implemented exactly once.
See Note [Joint graph calling convention] in ``aotkit_schemas._protocols``.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Sequence
from typing import Any

import torch
import torch.fx
from aotkit_schemas import is_sym_node
from torch.fx._lazy_graph_module import _make_graph_module
from torch.fx.immutable_collections import immutable_dict
from torch.fx.node import map_arg

from ._joint import JointInfo, ancestors, nodes_of, sorted_nodes, unique
from ._schedule import late_order


class PartitionError(RuntimeError):
    """A partition asked for a value that neither graph can compute."""


def _body(
    info: JointInfo,
    inputs: Sequence[torch.fx.Node],
    roots: Sequence[torch.fx.Node],
    allowed: Collection[torch.fx.Node] | None,
) -> list[torch.fx.Node]:
    input_set = set(inputs)
    needed = ancestors(roots, stop=input_set)
    body = sorted_nodes(info, needed - input_set)
    for node in body:
        if node.op == "placeholder":
            raise PartitionError(
                f"{node.name} is needed to compute {[r.name for r in roots][:4]} "
                "but is not an input of this graph"
            )
        if allowed is not None and node not in allowed:
            raise PartitionError(f"{node.name} cannot be computed in this graph")
    return body


def extract_graph(
    info: JointInfo,
    inputs: Sequence[torch.fx.Node],
    outputs: Sequence[Any],
    *,
    allowed: Collection[torch.fx.Node] | None = None,
    extra_roots: Sequence[torch.fx.Node] = (),
    late: Collection[torch.fx.Node] = (),
) -> torch.fx.Graph:
    """Copy the part of the joint graph that computes ``outputs`` from ``inputs``.

    ``inputs`` become placeholders (keeping their names and a copy of their meta), in the
    given order. Only ancestors of ``outputs`` (and of ``extra_roots``, side-effecting ops)
    are copied, so the result holds no dead code. Nodes run in joint order, except that
    ``late`` nodes are delayed to their first use (see ``late_order``). When ``allowed`` is
    given, every copied node must belong to it.

    Before (joint; inputs = [addmm, tangents_1], outputs = [mul_1])::

        addmm = addmm(primals_3, primals_1, t); gelu = gelu(addmm)
        mul_1 = mul(tangents_1, gelu_backward(tangents_1, addmm))

    After::

        addmm = placeholder(); tangents_1 = placeholder()
        mul_1 = mul(tangents_1, gelu_backward(tangents_1, addmm))
    """
    if len(set(inputs)) != len(inputs):
        raise PartitionError("graph inputs must be distinct nodes")
    body = _body(info, inputs, nodes_of(outputs) + list(extra_roots), allowed)
    if late:
        body = late_order(body, late)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in inputs:
        new = graph.placeholder(node.name)
        new.meta = dict(node.meta)
        env[node] = new
    for node in body:
        env[node] = copy_node(graph, node, env)
    graph.output(tuple(env[v] if isinstance(v, torch.fx.Node) else v for v in outputs))
    if not late and not any("recompute" in n.meta for n in info.nodes):
        _reserve_names_like_torch(graph, info, inputs, set(body))
    return graph


# Note [Copying joint nodes]
# ``Graph.node_copy`` goes through ``create_node``, which walks every argument with pytree
# looking for raw SymInts to warn about: a third of the partitioner's time on BERT. A
# joint node's arguments passed that walk when the joint was traced, and a copy replaces
# only its Node arguments by Nodes, so ``copy_node`` skips it and otherwise does what
# ``node_copy`` does (the same name, op, target, arguments, type and shallow meta copy,
# the same namespace and lookup-table entries). ``tools/bench/same_graphs.py --variant
# copy`` checks the zoo's graphs against ``node_copy``'s.


def copy_node(
    graph: torch.fx.Graph, node: torch.fx.Node, env: dict[torch.fx.Node, torch.fx.Node]
) -> torch.fx.Node:
    """``graph.node_copy(node, env.__getitem__)``, without the argument walk. See Note
    [Copying joint nodes]."""
    if graph.owning_module is not None:  # it may have node-creation hooks
        return graph.node_copy(node, env.__getitem__)
    args = map_arg(node.args, env.__getitem__)
    kwargs = map_arg(node.kwargs, env.__getitem__)
    assert isinstance(args, tuple) and isinstance(kwargs, dict)
    namespace = graph._graph_namespace
    name = namespace.create_name(node.name, None)
    new = torch.fx.Node(
        graph, name, node.op, node.target, args, kwargs or immutable_dict(), node.type
    )
    namespace.associate_name_with_obj(name, new)
    graph._insert(new)
    graph._find_nodes_lookup_table.insert(new)
    graph._len += 1
    new.meta = copy.copy(node.meta)
    return new


# Note [Names of the extracted graphs]
# torch's partitioners copy every joint node computable from a graph's inputs and then
# drop the dead ones; the dropped nodes' names stay taken in the graph's namespace, so a
# node added to the graph later (inlined saved-tensors hooks, See Note [Inlined
# saved-tensors hooks] in aotkit_capture; a compiler's pass) gets a suffix past them. aotkit
# copies only what the outputs need: the namespace is rebuilt as torch's would be
# (placeholders, then the nodes torch would have copied, in joint order), so later nodes
# get torch's names too. Not done where torch rebuilds the backward in autograd's order
# (min-cut, recompute tags), which leaves only the live names.


def _reserve_names_like_torch(
    graph: torch.fx.Graph,
    info: JointInfo,
    inputs: Sequence[torch.fx.Node],
    copied: Collection[torch.fx.Node],
) -> None:
    valid = set(inputs)
    names = [n.name for n in inputs]
    for node in info.nodes:
        if node in valid or node.op in ("placeholder", "output"):
            continue
        mutable = isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable
        if node in copied or (
            not mutable and all(a in valid for a in node.all_input_nodes)
        ):
            valid.add(node)
            names.append(node.name)
    namespace = torch.fx.graph._Namespace()
    for name in names:
        namespace.create_name(name, None)
    namespace.create_name("output", None)
    old = graph._graph_namespace
    if all(n.name in namespace._used_names for n in graph.nodes):
        namespace._obj_to_name = dict(old._obj_to_name)
        graph._graph_namespace = namespace


def symbol_bindings(
    info: JointInfo,
    values: Sequence[torch.fx.Node],
    available: Collection[torch.fx.Node],
) -> list[torch.fx.Node]:
    """Forward nodes that bind the free symbols in the shapes of ``values``.

    A backward compiler reasons about a saved tensor of shape ``(s0, 8)`` only if ``s0`` is
    bound by one of its inputs, so the node that binds ``s0`` is saved too.
    """
    # symbolic_shapes imports sympy: See Note [Import cost] in aotkit_frontends
    from torch.fx.experimental.symbolic_shapes import free_symbols, is_symbol_binding_fx_node

    bindings: dict[Any, torch.fx.Node] = {}
    for node in info.nodes:
        if not isinstance(node.meta.get("val"), torch.SymInt) or node not in available:
            continue
        symbol = is_symbol_binding_fx_node(node)
        if symbol is not None and symbol not in bindings:
            bindings[symbol] = node
    if not bindings:
        return []
    found: list[torch.fx.Node] = []
    for value in values:
        val = value.meta.get("val")
        if val is None:
            continue
        for symbol in sorted(free_symbols(val), key=lambda s: s.name):
            if symbol in bindings:
                found.append(bindings[symbol])
    return found


def build_modules(
    info: JointInfo,
    saved: Sequence[torch.fx.Node],
    *,
    fw_allowed: Collection[torch.fx.Node],
    bw_allowed: Collection[torch.fx.Node] | None = None,
    static_lifetime_input_indices: Sequence[int] | None = None,
    late_recompute: bool = False,
) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """Split the joint graph given the forward nodes whose values the backward receives.

    ``saved`` may mix tensors and symbolic scalars; the result follows the calling
    convention (tensors, then symints). Tensors are saved in graph order, symints in the
    order given, after the nodes binding the symbols of saved shapes as torch orders them:
    saved symints that bind a symbol, then the bindings added here, then the other saved
    symints. ``fw_allowed`` is every node the forward
    may compute; ``bw_allowed`` (when given) every node the backward may compute besides
    its inputs. A saved value the backward turns out not to read is dropped, and the
    nodes binding the symbols in backward input shapes are added. With ``late_recompute``
    the forward nodes the backward recomputes are scheduled just before their first use.
    """
    saved = unique(saved)
    bw_roots = list(info.bw_effects)
    fw_roots = list(info.fw_effects)

    # Keep only the saved values the backward reads.
    read = ancestors(nodes_of(info.bwd_outputs) + bw_roots, stop=set(saved) | set(info.tangents))
    tensors = sorted_nodes(info, (n for n in saved if n in read and not is_sym_node(n)))
    symints = [n for n in saved if n in read and is_sym_node(n)]
    from torch.fx.experimental.symbolic_shapes import is_symbol_binding_fx_node  # Import cost

    binding = [n for n in symints if is_symbol_binding_fx_node(n) is not None]
    derived = [n for n in symints if is_symbol_binding_fx_node(n) is None]
    have = {is_symbol_binding_fx_node(n) for n in binding}
    bound = symbol_bindings(info, derived + tensors + list(info.tangents), fw_allowed)
    bound = [b for b in bound if is_symbol_binding_fx_node(b) not in have]
    symints = unique(binding + bound + derived)

    fw_graph = extract_graph(
        info,
        list(info.primals),
        list(info.fwd_outputs) + tensors + symints,
        allowed=fw_allowed,
        extra_roots=fw_roots,
    )
    late = [n for n in info.nodes if n not in info.tangent_closure] if late_recompute else ()
    bw_graph = extract_graph(
        info,
        symints + tensors + list(info.tangents),
        info.bwd_outputs,
        allowed=bw_allowed,
        extra_roots=bw_roots,
        late=late,
    )
    # stamped whenever the caller says which are static (an empty list too: then none is),
    # as torch's partitioners do; read by aotkit_inductor's compilers
    if static_lifetime_input_indices is not None:
        static = set(static_lifetime_input_indices)
        primal_index = {p.name: i for i, p in enumerate(info.primals)}
        for graph in (fw_graph, bw_graph):
            for node in graph.find_nodes(op="placeholder"):
                if node.name in primal_index:
                    node.meta["is_static_input"] = primal_index[node.name] in static
    for node in bw_graph.nodes:
        if node.op in ("call_function", "get_attr"):
            node.meta["autograd_backward"] = True
    # Like torch's partitioners: lazy modules (code generated on first call) when torch's
    # _use_lazy_graph_module flag is set, as torch.compile does; ordinary ones otherwise.
    fw = _make_graph_module(info.root, fw_graph, class_name="ForwardGraph")
    bw = _make_graph_module(info.root, bw_graph, class_name="BackwardGraph")
    fw.meta = dict(info.root.meta)
    bw.meta = dict(info.root.meta)
    return fw, bw

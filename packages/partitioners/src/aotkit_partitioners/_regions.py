"""Partitioning at the boundary of ``invoke_subgraph`` regions (``nested_compile_region``).

# Note [Partitioning at region boundaries]
# torch's autograd kernel of ``invoke_subgraph`` puts, in a joint trace, a forward call
# ``invoke_subgraph(fw_graph, "fw_<id>", *primals) -> fw_outs`` and a backward call
# ``invoke_subgraph(joint_graph, "bw_<id>_<n>", *primals, *tangents) -> (*grads, *fw_outs)``
# whose subgraph is the region's whole joint: left so, the backward recomputes every
# region's forward (matmuls included) and the forward saves only the region's inputs. The
# pair is matched by ``node.meta["custom"]["call_id"]``. Like torch's AOTAutograd
# (``run_joint_graph_passes_on_hops``), every partitioner here first rewrites each pair:
#   * the region's joint (``bw_<id>`` subgraph) is given the joint calling convention
#     (placeholders ``primals_N`` / ``tangents_N``, outputs ``(*fw_outs, *grads)``) and split
#     by the same partitioner, **once per distinct backward identifier**: every repeat of a
#     layer shares the partitioned pair;
#   * the forward call becomes ``invoke_subgraph(partitioned_fw_<id>, ...)`` returning
#     ``(*fw_outs, *saved_tensors, *saved_symints)``, the backward call
#     ``invoke_subgraph(partitioned_bw_<id>, *saved_symints, *saved_tensors, *tangents)``
#     returning the grads; both graphs refer to one ``get_attr`` module per distinct region,
#     so Inductor lowers each region once (its ``invoke_subgraph`` lowering caches the
#     lowered subgraph per attribute);
#   * a forward call without a backward of its own (its outputs need no gradient) whose
#     identifier has a partitioned pair calls the partitioned forward too (the extra
#     outputs are dead).
# The outer partitioner then sees HOP nodes it never recomputes: the forward call runs in
# the forward graph, its saved getitems are saved values, the backward call runs in the
# backward. The caller's joint is not modified (the rewrite works on a copy). Nested
# regions inside a region's subgraph are left as they are (torch does the same).
"""

from __future__ import annotations

import copy
import itertools
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from aotkit_schemas import is_sym_node

__all__ = ["partition_region_boundaries", "region_partition_count"]

_invoke_subgraph: Any = torch.ops.higher_order.invoke_subgraph

# number of distinct region joints partitioned, for tests (See Note [Partitioning at
# region boundaries])
_COUNTS = {"partitioned": 0}


def region_partition_count() -> int:
    """How many distinct region joints the partitioners have split in this process."""
    return _COUNTS["partitioned"]


def _is_invoke(node: torch.fx.Node) -> bool:
    return (
        node.op == "call_function"
        and node.target is _invoke_subgraph
        and isinstance(node.args[1], str)
    )


def _call_id(node: torch.fx.Node) -> Any:
    return node.meta.get("custom", {}).get("call_id")


def _submodule(gm: torch.fx.GraphModule, attr: Any) -> torch.fx.GraphModule:
    if not isinstance(attr, torch.fx.Node) or attr.op != "get_attr":
        raise TypeError(f"invoke_subgraph's subgraph is not a get_attr node: {attr!r}")
    sub = getattr(gm, str(attr.target))
    if not isinstance(sub, torch.fx.GraphModule):
        raise TypeError(f"invoke_subgraph's subgraph {attr.target} is not a GraphModule")
    return sub


def _outputs(gm: torch.fx.GraphModule) -> list[Any]:
    return list(gm.graph.find_nodes(op="output")[0].args[0])


def _as_joint(mod: torch.fx.GraphModule, num_primals: int, num_fw_outs: int) -> torch.fx.GraphModule:
    """The region's joint ``(*primals, *tangents) -> (*grads, *fw_outs)`` in the joint
    calling convention: ``primals_N``/``tangents_N`` placeholders, ``(*fw_outs, *grads)``."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    primals, tangents = itertools.count(1), itertools.count(1)
    placeholders = 0
    for node in mod.graph.nodes:
        if node.op == "placeholder":
            name = (
                f"primals_{next(primals)}" if placeholders < num_primals
                else f"tangents_{next(tangents)}"
            )
            placeholders += 1
            env[node] = graph.placeholder(name)
            env[node].meta = copy.copy(node.meta)
        elif node.op == "output":
            outs = list(node.args[0])
            order = outs[len(outs) - num_fw_outs :] + outs[: len(outs) - num_fw_outs]
            graph.output(tuple(env[n] if isinstance(n, torch.fx.Node) else n for n in order))
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
    graph.lint()
    return torch.fx.GraphModule(mod, graph)


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    new = torch.fx.GraphModule(gm, graph)
    new.meta = dict(gm.meta)
    return new


def partition_region_boundaries(
    joint: torch.fx.GraphModule,
    partition: Callable[..., tuple[torch.fx.GraphModule, torch.fx.GraphModule]],
    **partition_kwargs: Any,
) -> torch.fx.GraphModule:
    """``joint`` with every paired forward/backward ``invoke_subgraph`` call split at the
    region boundary by ``partition`` (once per distinct region); ``joint`` itself when it
    has no such pair. See Note [Partitioning at region boundaries]."""
    fws = [n for n in joint.graph.nodes if _is_invoke(n) and n.args[1].startswith("fw")]
    bws = [n for n in joint.graph.nodes if _is_invoke(n) and n.args[1].startswith("bw")]
    if not bws:
        return joint
    gm = _copy(joint)
    names = {n.name: n for n in gm.graph.nodes}
    fws = [names[n.name] for n in fws]
    bws = [names[n.name] for n in bws]
    fw_by_call = {_call_id(n): n for n in fws if _call_id(n) is not None}
    pairs: list[tuple[torch.fx.Node, torch.fx.Node]] = []
    for bw in bws:
        fw = fw_by_call.get(_call_id(bw))
        if fw is None:
            raise RuntimeError(
                f"aotkit cannot pair the backward invoke_subgraph call {bw.args[1]!r} with its "
                "forward call (no forward call with its call_id); "
                "See Note [Partitioning at region boundaries]"
            )
        pairs.append((fw, bw))

    # region identifier (the backward's, without "bw") -> partitioned pair and counts
    done: dict[str, tuple[str, str, int, int, int, int]] = {}
    fw_ident_to_key: dict[str, str] = {}
    for fw, bw in pairs:
        key = str(bw.args[1]).removeprefix("bw")
        fw_ident_to_key.setdefault(str(fw.args[1]), key)
        if key in done:
            continue
        fw_gm = _submodule(gm, fw.args[0])
        n_in = len(fw_gm.graph.find_nodes(op="placeholder"))
        n_out = len(_outputs(fw_gm))
        region_joint = _as_joint(_submodule(gm, bw.args[0]), n_in, n_out)
        new_fw, new_bw = partition(region_joint, [], num_fwd_outputs=n_out, **partition_kwargs)
        _COUNTS["partitioned"] += 1
        extra = _outputs(new_fw)[n_out:]
        n_sym = sum(1 for n in extra if isinstance(n, torch.fx.Node) and is_sym_node(n))
        fw_name, bw_name = f"partitioned_fw{key}", f"partitioned_bw{key}"
        gm.register_module(fw_name, new_fw)
        gm.register_module(bw_name, new_bw)
        done[key] = (fw_name, bw_name, n_in, n_out, len(extra) - n_sym, n_sym)

    def new_call(old: torch.fx.Node, attr_name: str, sub: torch.fx.GraphModule,
                 operands: list[Any]) -> torch.fx.Node:
        with gm.graph.inserting_before(old):
            attr = gm.graph.get_attr(attr_name)
            attr.meta = copy.copy(old.args[0].meta) if isinstance(old.args[0], torch.fx.Node) else {}
            call = gm.graph.call_function(_invoke_subgraph, (attr, attr_name, *operands))
        call.meta = copy.copy(old.meta)
        call.meta["val"] = tuple(
            n.meta.get("val") if isinstance(n, torch.fx.Node) else None for n in _outputs(sub)
        )
        call.meta.pop("eager_input_vals", None)
        return call

    for fw, bw in pairs:
        key = str(bw.args[1]).removeprefix("bw")
        fw_name, bw_name, n_in, n_out, n_saved, n_sym = done[key]
        new_fw, new_bw = getattr(gm, fw_name), getattr(gm, bw_name)
        call = new_call(fw, fw_name, new_fw, list(fw.args[2:]))
        extras: list[torch.fx.Node] = []
        with gm.graph.inserting_after(call):
            for i in reversed(range(n_out, n_out + n_saved + n_sym)):
                item = gm.graph.call_function(operator.getitem, (call, i))
                item.meta = copy.copy(call.meta)
                item.meta["val"] = call.meta["val"][i]
                extras.insert(0, item)
        fw.replace_all_uses_with(call)
        gm.graph.erase_node(fw)
        saved, syms = extras[:n_saved], extras[n_saved:]
        tangents = list(bw.args[2 + n_in :])
        bcall = new_call(bw, bw_name, new_bw, [*syms, *saved, *tangents])
        bw.replace_all_uses_with(bcall)
        gm.graph.erase_node(bw)

    paired = {fw for fw, _ in pairs}
    for fw in fws:
        if fw in paired or str(fw.args[1]) not in fw_ident_to_key:
            continue
        fw_name = done[fw_ident_to_key[str(fw.args[1])]][0]
        call = new_call(fw, fw_name, getattr(gm, fw_name), list(fw.args[2:]))
        fw.replace_all_uses_with(call)
        gm.graph.erase_node(fw)

    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    return gm

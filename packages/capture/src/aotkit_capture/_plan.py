"""What the runtime needs besides the graphs, read off the compiled graphs and metadata.

Shared by a fresh compilation and a compilation restored from the on-disk cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from aotkit_functional import as_plain_tensor
from aotkit_schemas import OutputType, ViewAndMutationMeta, graph_outputs


def plain_view_outputs(gm: torch.fx.GraphModule, meta: ViewAndMutationMeta) -> tuple[int, ...]:
    """Forward-return positions of non_alias outputs that ``gm`` computes as a view of an
    intermediate no other forward return views. See Note [unsafe_view_alias outputs] in
    aotkit_runtime. (Non-alias views of a shared intermediate, ``y[0], y[1]`` without
    grad, stay views of it, as in eager.)"""
    n_mut = meta.num_mutated_inp_runtime_indices
    values = graph_outputs(gm)[: meta.num_forward_returns]
    regenerated = {n_mut + j for j, o in enumerate(meta.output_info) if o.is_regenerated_alias}
    roots = [
        _view_root(v) if isinstance(v, torch.fx.Node) and i not in regenerated else None
        for i, v in enumerate(values)
    ]
    positions = []
    for j, info in enumerate(meta.output_info):
        i = n_mut + j
        node = values[i] if i < len(values) else None
        if info.output_type is not OutputType.non_alias or not isinstance(node, torch.fx.Node):
            continue
        root = roots[i]
        if (
            _is_view_node(node)
            and root is not None
            and root.op != "placeholder"
            and roots.count(root) == 1
        ):
            positions.append(i)
    return tuple(positions)


def _view_root(node: torch.fx.Node) -> torch.fx.Node:
    while _is_view_node(node) and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def _is_view_node(node: torch.fx.Node) -> bool:
    return (
        node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and node.target.is_view
    )


def returning_plain_tensors(
    compiled: Callable[[list[Any]], Sequence[Any]], positions: tuple[int, ...]
) -> Callable[[list[Any]], Sequence[Any]]:
    """Return the outputs at ``positions`` as plain tensors when they are views (of graph
    intermediates), as eager does. See Note [unsafe_view_alias outputs] in aotkit_runtime."""

    def run(args: list[Any]) -> Sequence[Any]:
        outs = list(compiled(args))
        for i in positions:
            o = outs[i]
            if isinstance(o, torch.Tensor) and o._is_view():
                outs[i] = as_plain_tensor(o)
        return outs

    return run


def tangent_dependencies(
    bw_module: torch.fx.GraphModule, n_saved: int, n_tangents: int
) -> tuple[frozenset[int], ...] | None:
    """For every backward output, the tangents it is computed from (None when the
    backward's placeholders do not follow the calling convention).

    See Note [Gradients through unused outputs] in aotkit_runtime.
    """
    placeholders = [n for n in bw_module.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != n_saved + n_tangents:
        return None
    deps: dict[torch.fx.Node, frozenset[int]] = {
        n: frozenset({k}) for k, n in enumerate(placeholders[n_saved:])
    }
    for node in bw_module.graph.nodes:
        if node not in deps:
            deps[node] = frozenset().union(*(deps[a] for a in node.all_input_nodes))
    return tuple(
        deps[o] if isinstance(o, torch.fx.Node) else frozenset() for o in graph_outputs(bw_module)
    )


def gradless_inputs(
    bw_module: torch.fx.GraphModule, fake: Sequence[Any], meta: ViewAndMutationMeta
) -> tuple[int, ...]:
    """Inputs that require grad but for which the backward graph returns None.

    See Note [Inputs the backward never reaches] in aotkit_runtime. When every input that
    requires grad is such an input, the ones not returned as (views of) themselves stay
    attached: the node must keep an input that requires grad for its outputs to.
    """
    grads = graph_outputs(bw_module)
    if len(grads) != len(fake):
        return ()
    needs = [i for i, a in enumerate(fake) if isinstance(a, torch.Tensor) and a.requires_grad]
    gradless = [i for i in needs if grads[i] is None]
    if len(gradless) < len(needs):
        return tuple(gradless)
    returned = {
        o.base_idx
        for o in meta.output_info
        if o.output_type in (OutputType.is_input, OutputType.alias_of_input)
    }
    detached = tuple(i for i in gradless if i in returned)
    return detached if len(detached) < len(needs) else ()


def static_tangent_like(
    meta: ViewAndMutationMeta,
) -> tuple[tuple[torch.Size, torch.dtype, torch.device] | None, ...] | None:
    """(shape, dtype, device) of every tangent, or None when a shape is symbolic."""
    result: list[tuple[torch.Size, torch.dtype, torch.device] | None] = []
    for t in meta.traced_tangents:
        if not isinstance(t, torch.Tensor):
            result.append(None)
            continue
        if not all(type(d) is int for d in t.shape):
            return None
        result.append((torch.Size(t.shape), t.dtype, t.device))
    return tuple(result)

"""Facts the runtime plan reads off the compiled graphs (positions of plain views, the
tangents each gradient depends on, inputs the backward never reaches), for
``compile_flat``. Graphs that thread effect tokens pass their token counts, so the
positions skip them (See Note [Effect tokens])."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from aotkit_functional import as_plain_tensor
from aotkit_schemas import OutputType, ViewAndMutationMeta, aliases_despite_schema, graph_outputs

from ._examples import requires_grad_flags


def plain_view_outputs(
    gm: torch.fx.GraphModule, meta: ViewAndMutationMeta, n_tokens: int = 0
) -> tuple[int, ...]:
    """Forward-return positions of non_alias outputs that ``gm`` computes as a view of an
    intermediate no other forward return views. See Note [unsafe_view_alias outputs] in
    aotkit_runtime. (Non-alias views of a shared intermediate, ``y[0], y[1]`` without
    grad, stay views of it, as in eager.)"""
    n_mut = meta.num_mutated_inp_runtime_indices
    values = graph_outputs(gm)[n_tokens : n_tokens + meta.num_forward_returns]
    regenerated = {n_mut + j for j, o in enumerate(meta.output_info) if o.is_regenerated_alias}
    roots = [
        view_root(v) if isinstance(v, torch.fx.Node) and i not in regenerated else None
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
            is_view_node(node)
            and root is not None
            and root.op != "placeholder"
            and roots.count(root) == 1
        ):
            positions.append(i)
    return tuple(positions)


def view_root(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose memory ``node``'s value lives in: views are followed to their first
    argument, and so are ops that alias despite their schema (``_unsafe_view``, which
    functionalization emits when it replays a ``reshape`` after a mutation: two outputs
    rooted at one ``add`` through it share memory, as eager's two views of one base). See
    Note [Ops that alias despite their schema] in aotkit_schemas."""
    while (
        is_view_node(node) or _aliases_despite_schema(node)
    ) and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def is_view_node(node: torch.fx.Node) -> bool:
    return (
        node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and node.target.is_view
    )


def _aliases_despite_schema(node: torch.fx.Node) -> bool:
    return (
        node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and aliases_despite_schema(node.target)
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
    bw_module: torch.fx.GraphModule, n_saved: int, n_tangents: int, n_tokens: int = 0
) -> tuple[frozenset[int], ...] | None:
    """For every backward output, the tangents it is computed from (None when the
    backward's placeholders do not follow the calling convention).

    See Note [Gradients through unused outputs] in aotkit_runtime.
    """
    placeholders = [n for n in bw_module.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != n_saved + n_tangents + n_tokens:
        return None
    deps: dict[torch.fx.Node, frozenset[int]] = {
        n: frozenset({k}) for k, n in enumerate(placeholders[n_saved : n_saved + n_tangents])
    }
    for node in bw_module.graph.nodes:
        if node not in deps:
            deps[node] = frozenset().union(*(deps[a] for a in node.all_input_nodes))
    grads = graph_outputs(bw_module)
    return tuple(
        deps[o] if isinstance(o, torch.fx.Node) else frozenset()
        for o in grads[: len(grads) - n_tokens]
    )


def gradless_inputs(
    bw_module: torch.fx.GraphModule, fake: Sequence[Any], meta: ViewAndMutationMeta, n_tok: int = 0
) -> tuple[int, ...]:
    """Inputs that require grad but for which the backward graph returns None.

    See Note [Inputs the backward never reaches] in aotkit_runtime. When every input that
    requires grad is such an input, the ones not returned as (views of) themselves stay
    attached: the node must keep an input that requires grad for its outputs to.
    """
    grads = graph_outputs(bw_module)
    grads = grads[: len(grads) - n_tok]
    if len(grads) != len(fake):
        return ()
    needs = [i for i, rg in enumerate(requires_grad_flags(fake)) if rg]
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

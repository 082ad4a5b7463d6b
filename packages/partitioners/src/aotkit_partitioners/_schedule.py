"""Scheduling recomputation in the backward graph."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch.fx


def late_order(
    body: Sequence[torch.fx.Node], late: Collection[torch.fx.Node]
) -> list[torch.fx.Node]:
    """Reorder ``body`` (topologically sorted) so ``late`` nodes run just before first use.

    Graphs are extracted in joint order, which puts every recomputed forward node before the
    first backward node, so all recomputed values would be alive at once. Here each ``late``
    node is delayed until a node outside ``late`` (or the end of the graph) needs it.

    Before (``sin``, ``cos`` late)::

        sin = sin(x); cos = cos(x); a = mul(tangents_1, cos); b = mul(a, sin)

    After::

        cos = cos(x); a = mul(tangents_1, cos); sin = sin(x); b = mul(a, sin)
    """
    in_body = set(body)
    delayed = set(late) & in_body
    done: set[torch.fx.Node] = set()
    order: list[torch.fx.Node] = []

    def emit(node: torch.fx.Node) -> None:
        stack = [node]
        while stack:
            top = stack[-1]
            if top in done:
                stack.pop()
                continue
            pending = [a for a in top.all_input_nodes if a in in_body and a not in done]
            if pending:
                stack.extend(reversed(pending))
                continue
            stack.pop()
            done.add(top)
            order.append(top)

    for node in body:
        if node not in delayed:
            emit(node)
    for node in body:
        emit(node)
    return order

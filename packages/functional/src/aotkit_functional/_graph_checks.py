"""Checks that a graph handed to a compiler is functional ATen."""

from __future__ import annotations

import torch
import torch.fx

_ALLOWED_MUTABLE = {"copy_", "set_"}


def mutable_ops_in_graph(graph: torch.fx.Graph, *, allow_input_copies: bool = False) -> list[str]:
    """Names of nodes that call a mutable (in-place or out=) operator.

    With ``allow_input_copies``, a trailing ``copy_`` (or ``set_``) into a placeholder is
    allowed: that is how ``keep_inference_input_mutations`` keeps an input mutation in the
    graph.
    """
    placeholders = {n for n in graph.nodes if n.op == "placeholder"}
    bad: list[str] = []
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if not node.target._schema.is_mutable:
            continue
        name = node.target._schema.name.split("::")[-1]
        if (
            allow_input_copies
            and name in _ALLOWED_MUTABLE
            and node.args
            and node.args[0] in placeholders
        ):
            continue
        bad.append(f"{node.name} ({node.target})")
    return bad


def assert_functional_graph(graph: torch.fx.Graph, *, allow_input_copies: bool = False) -> None:
    """Raise if the graph contains a mutable op (see ``mutable_ops_in_graph``)."""
    bad = mutable_ops_in_graph(graph, allow_input_copies=allow_input_copies)
    if bad:
        raise AssertionError("graph is not functional; mutable ops: " + ", ".join(bad))

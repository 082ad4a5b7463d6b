"""Source-line metadata (``stack_trace``, ``nn_module_stack``) on every node of every graph.

# Note [Preserved node meta]
# A graph a user hands in (dynamo's, or any ``torch.fx`` GraphModule traced with
# ``record_stack_traces``) carries, on each node, the source line that made it
# (``stack_trace``) and the modules it ran in (``nn_module_stack``). As in torch, aotkit
# keeps them on the nodes of the graphs it traces:
#   * forward nodes: the module is run node by node with ``torch.fx.Interpreter`` under
#     ``fx.traceback.preserve_node_meta()``; make_fx copies the current node's meta onto
#     each node it records (``aotkit_frontends._simplified``), under autograd's anomaly
#     mode, which stores that meta's stack in every ``grad_fn`` it creates;
#   * backward nodes: ``backward_node_meta`` hooks every ``grad_fn`` of the forward so that
#     the nodes its backward formula records carry the forward node's stack trace, as in
#     torch (the gradient accumulation after it is marked with torch's special stack);
#   * nodes added by mutation handling (the trailing ``copy_`` into a mutated input) take
#     the meta of the value they copy (``propagate_mutation_meta``).
# Graphs from plain Python functions carry no stack traces, as in torch.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.fx
import torch.fx.traceback as fx_traceback

_META_FIELDS = ("stack_trace", "nn_module_stack", "source_fn_stack")


def _grad_fns(outputs: Sequence[Any]) -> list[Any]:
    roots = [o.grad_fn for o in outputs if isinstance(o, torch.Tensor) and o.grad_fn is not None]
    seen: set[Any] = set()
    order: list[Any] = []
    stack: list[Any] = list(roots)
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        order.append(fn)
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return order


@contextlib.contextmanager
def backward_node_meta(outputs: Sequence[Any]) -> Iterator[None]:
    """While differentiating ``outputs``, give each backward node the stack trace of the
    forward op it differentiates. A no-op unless the forward recorded stack traces. See
    Note [Preserved node meta]."""
    fns = _grad_fns(outputs)
    stacks = [(fn, fn.metadata.get("traceback_")) for fn in fns]
    if not any(stack for _, stack in stacks):
        yield
        return
    handles: list[Any] = []

    def prehook(stack: list[str]) -> Any:
        def hook(grad_outputs: Any) -> None:
            fx_traceback.set_stack_trace(stack)

        return hook

    def posthook(stack: list[str]) -> Any:
        def hook(grad_inputs: Any, grad_outputs: Any) -> None:
            fx_traceback.set_stack_trace(stack)

        return hook

    for fn, stack in stacks:
        if not stack:
            continue
        handles.append(fn.register_prehook(prehook(list(stack))))
        handles.append(
            fn.register_hook(posthook([*stack, fx_traceback.GRADIENT_ACC_SPECIAL_STACK]))
        )
    try:
        with fx_traceback.preserve_node_meta():
            yield
    finally:
        for h in handles:
            h.remove()


def propagate_mutation_meta(graph: torch.fx.Graph) -> None:
    """Give each ``copy_`` into a placeholder (an input mutation kept in the graph) the
    source metadata of the value it copies. See Note [Preserved node meta]."""
    for node in graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten.copy_.default:
            continue
        dst, src = node.args[0], node.args[1]
        if not (isinstance(dst, torch.fx.Node) and dst.op == "placeholder"):
            continue
        if not isinstance(src, torch.fx.Node):
            continue
        for field in _META_FIELDS:
            if field in src.meta and field not in node.meta:
                node.meta[field] = src.meta[field]


def call_preserving_node_meta(mod: torch.nn.Module, *args: Any) -> Any:
    """``mod(*args)``; a GraphModule runs node by node so that the nodes traced from each
    of its nodes keep that node's source metadata. See Note [Preserved node meta]."""
    if not isinstance(mod, torch.fx.GraphModule):
        return mod(*args)
    if not any(n.meta.get("stack_trace") or n.meta.get("nn_module_stack") for n in mod.graph.nodes):
        return mod(*args)
    with fx_traceback.preserve_node_meta(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Anomaly Detection has been enabled")
        # anomaly mode stores the current node's stack in each grad_fn, for the backward
        with torch.autograd.detect_anomaly(check_nan=False):
            return torch.fx.Interpreter(mod).run(*args)

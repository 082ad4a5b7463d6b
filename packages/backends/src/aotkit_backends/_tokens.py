"""Unlifting effect tokens for compilers that want no token inputs (Inductor).

# Note [Unlifted tokens for Inductor]
# aotkit's graphs with effectful ops take effect tokens as inputs and return them as
# outputs (See Note [Effect tokens] in aotkit_tracing), as torch's do by default. torch
# compiles with Inductor under ``unlift_effect_tokens=True``: Inductor's graphs make their
# tokens with ``prims._make_token()`` and hand the chains' ends to ``prims._sink_tokens``.
# ``inductor_compiler`` does the same on a copy of the graph it gets (a token input is a
# placeholder used only as the token of ``with_effects`` calls; a token output is
# ``with_effects(...)[0]``), and keeps the graph's calling convention around the compiled
# result: it drops the token arguments and returns ``None`` where the graph returned a
# token, as torch's runtime passes ``None`` for each token.
# A token that a ``torch.cond`` takes as an operand (See Note [Effect tokens through
# torch.cond] in aotkit_tracing) cannot be unlifted: Inductor lowers a token to ``None``,
# which its cond lowering cannot place on a device. Such a graph raises
# ``TokensThroughHigherOrderOpError``, naming the cond and the remedy, before Inductor
# runs.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch._higher_order_ops.effects import with_effects


def _is_effects(node: Any) -> bool:
    return (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and node.target is with_effects
    )


def _is_token_output(node: Any) -> bool:
    if not (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and node.target is operator.getitem
    ):
        return False
    index = node.args[1]
    return isinstance(index, int) and index == 0 and _is_effects(node.args[0])


class TokensThroughHigherOrderOpError(NotImplementedError):
    """An effect token is an operand of a higher-order operator Inductor cannot lower with
    one. See Note [Unlifted tokens for Inductor]."""


TOKENS_THROUGH_HOP_MESSAGE = (
    "aotkit_inductor cannot compile an effectful operator inside {hop}: the effect "
    "token threaded through {hop}'s branches (See Note [Effect tokens through "
    "torch.cond]) would be an operand of {hop}, and Inductor lowers effect tokens to "
    "None. Remedy: compile this function with a non-Inductor compiler (aot_function's "
    "nop, torch.compile(backend=\"aotkit_eager\")), or move the effectful call out of "
    "{hop}."
)


def _check_no_token_operands(gm: torch.fx.GraphModule) -> None:
    """Raise for a higher-order operator whose subgraphs call ``with_effects``: its
    tokens are threaded through it as operands."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is with_effects:
            continue
        if not isinstance(node.target, torch._ops.HigherOrderOperator):
            continue
        for arg in node.all_input_nodes:
            sub = getattr(gm, str(arg.target), None) if arg.op == "get_attr" else None
            if not isinstance(sub, torch.fx.GraphModule):
                continue
            if any(
                isinstance(m, torch.fx.GraphModule) and any(_is_effects(n) for n in m.graph.nodes)
                for m in sub.modules()
            ):
                hop = f"torch.ops.higher_order.{node.target._name}"
                raise TokensThroughHigherOrderOpError(TOKENS_THROUGH_HOP_MESSAGE.format(hop=hop))


@dataclass(frozen=True)
class UnliftedTokens:
    """A graph with its tokens unlifted, and where they were."""

    gm: torch.fx.GraphModule
    # positions of the token placeholders / token outputs in the original graph
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]

    def example_inputs(self, example_inputs: Sequence[Any]) -> list[Any]:
        drop = set(self.inputs)
        return [a for i, a in enumerate(example_inputs) if i not in drop]

    def lifted_call(self, compiled: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
        """``compiled`` (boxed, for ``gm``) called with the original graph's convention."""
        drop = set(self.inputs)
        outputs = sorted(self.outputs)

        def run(args: list[Any]) -> Any:
            kept = [a for i, a in enumerate(args) if i not in drop]
            args.clear()
            outs = list(compiled(kept))
            for j in outputs:
                outs.insert(j, None)
            return outs

        run._boxed_call = True  # type: ignore[attr-defined]
        return run


def unlift_tokens(gm: torch.fx.GraphModule) -> UnliftedTokens | None:
    """A copy of ``gm`` without token inputs and outputs (None: ``gm`` has none). See Note
    [Unlifted tokens for Inductor]."""
    graph = gm.graph
    _check_no_token_operands(gm)
    placeholders = list(graph.find_nodes(op="placeholder"))
    token_in = tuple(
        i
        for i, p in enumerate(placeholders)
        if p.users and all(_is_effects(u) and u.args[0] is p for u in p.users)
    )
    output = graph.output_node()
    outs = output.args[0]
    if not isinstance(outs, list | tuple):
        return None
    token_out = tuple(j for j, o in enumerate(outs) if _is_token_output(o))
    if not token_in and not token_out:
        return None
    new_graph = copy.deepcopy(graph)
    new_placeholders = list(new_graph.find_nodes(op="placeholder"))
    first_op = next(n for n in new_graph.nodes if n.op != "placeholder")
    for i in token_in:
        p = new_placeholders[i]
        with new_graph.inserting_before(first_op):
            token = new_graph.call_function(torch.ops.prims._make_token.default, ())
        token.meta["val"] = p.meta.get("val")
        p.replace_all_uses_with(token)
        new_graph.erase_node(p)
    new_output = new_graph.output_node()
    new_outs = list(new_output.args[0])  # type: ignore[arg-type]
    if token_out:
        with new_graph.inserting_before(new_output):
            sink = new_graph.call_function(
                torch.ops.prims._sink_tokens.default, ([new_outs[j] for j in token_out],)
            )
        sink.meta["val"] = None
    kept = [o for j, o in enumerate(new_outs) if j not in set(token_out)]
    new_output.args = (type(outs)(kept),)
    new_graph.lint()
    return UnliftedTokens(torch.fx.GraphModule(gm, new_graph), token_in, token_out)

"""Effect tokens: keeping side-effectful ops once per call and in program order.

# Note [Effect tokens]
# Some ops have ordered side effects and no data dependence to keep them in place:
# ``aten._print``, ``aten._linalg_check_errors`` (the linalg error checks), ops registered
# with ``torch._higher_order_ops.effects._register_effectful_op(op, EffectType.ORDERED)``
# and custom ops that take a TorchBind object. A functional graph would be free to drop,
# reorder or duplicate them, so, as torch does, each one is traced as
#
#     token_out, *results = with_effects(token_in, op, *args)
#
# and the tokens (empty tensors) chain the ops of one effect type together. Invariants:
#   * Discovery: the metadata pass runs with token discovery on
#     (``functionalized(allow_token_discovery=True)``); the effect types it met, in that
#     order, are ``ViewAndMutationMeta.tokens`` (torch's field). Its forward must meet no
#     other: a trace that finds one raises.
#   * Forward: the forward (or inference) graph takes one token per entry of
#     ``meta.tokens`` as its leading inputs and returns the last token of each chain as
#     its leading outputs: ``(*tokens, *primals) -> (*tokens, *forward_returns,
#     *saved)``. In the joint the tokens are the first primals (``primals_1``, ...; export's
#     inference graph: ``arg0_1``, ...), as in torch.
#   * Backward: the backward's effectful ops get their own chain, started by a token
#     discovered while the joint traces the backward: the placeholder
#     ``tangents_token``. The backward takes it after the tangents and returns the chain's
#     end after the gradients; ``meta.num_backward_tokens`` counts them. Forward tokens
#     are never saved for the backward.
#   * Runtime (``aotkit_runtime.forward_with_tokens``/``backward_with_tokens``): every
#     call passes an empty tensor for each token (``with_effects`` ignores its value; the
#     order lives in the graph; torch passes ``None``, which a cond that threads the token
#     refuses: See Note [Effect tokens through torch.cond]) and drops the returned tokens,
#     so tokens never reach
#     the user's outputs, the autograd.Function, the partition's saved values or the
#     epilogue. Each effectful op runs once per call: forward effects in the forward,
#     backward effects in the backward, in program order.
#   * Inductor, which wants no token inputs, gets graphs with the tokens unlifted (a
#     token placeholder becomes ``prims._make_token()``, token outputs go to
#     ``prims._sink_tokens``) behind the same calling convention; See Note [Unlifted
#     tokens for Inductor] in aotkit_backends.
#   * The native paths (the single pass, the C++ Functionalize key) do not thread tokens:
#     an effectful op sends a program to the Python mode, with that reason recorded (See
#     Note [Why a graph took the path it took]). Joint exports with effectful ops raise
#     an error that says so.
#   * Tensor subclasses: the desugared graphs (See Note [Tensor subclasses are desugared]
#     in aotkit_schemas) thread the tokens the same way, tokens first and plain; an
#     effectful op a subclass's ``__torch_dispatch__`` runs once per inner tensor is one
#     ``with_effects`` per inner tensor on the same chain, as in torch.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from typing import Any

import torch
from aotkit_schemas import ViewAndMutationMeta
from torch._higher_order_ops.effects import with_effects
from torch._subclasses.functional_tensor import FunctionalTensorMode


def num_tokens(meta: ViewAndMutationMeta) -> int:
    """The number of forward token inputs (and outputs)."""
    return len(meta.tokens)


def token_inputs(meta: ViewAndMutationMeta) -> list[torch.Tensor]:
    """Example values of the forward's token inputs (empty tensors, fake when a fake mode
    is active, as the tracing context makes it)."""
    return [torch.tensor([]) for _ in meta.tokens]


def install_tokens(mode: Any, meta: ViewAndMutationMeta, f_tokens: Sequence[Any]) -> None:
    """Start every forward effect chain of ``mode`` from the (functional) token inputs."""
    if not isinstance(mode, FunctionalTensorMode):
        assert not f_tokens, "effect tokens need the Python functionalization mode"
        return
    for key, token in zip(meta.tokens, f_tokens, strict=True):
        mode._tokens[key] = token


def forward_tokens(mode: Any, meta: ViewAndMutationMeta) -> list[Any]:
    """The end of every forward chain, in ``meta.tokens`` order (functional tensors)."""
    if not isinstance(mode, FunctionalTensorMode):
        return []
    extra = [k for k in mode._tokens if k not in meta.tokens]
    if extra:
        raise RuntimeError(
            f"aotkit: the trace met effectful ops of effect {extra} that the metadata pass "
            "did not; the function is not deterministic under tracing. See Note [Effect "
            "tokens]."
        )
    return [mode._tokens[k] for k in meta.tokens]


def begin_backward(mode: Any) -> None:
    """Give the backward its own chains: later effectful ops discover fresh tokens (a
    ``tangents_token`` placeholder each) instead of continuing the forward's."""
    if isinstance(mode, FunctionalTensorMode):
        mode._tokens_forward_output = mode._tokens
        mode._tokens = {}


def backward_tokens(mode: Any) -> list[Any]:
    """The end of every backward chain (functional tensors)."""
    if not isinstance(mode, FunctionalTensorMode):
        return []
    return list(mode._tokens.values())


def with_backward_tokens(meta: ViewAndMutationMeta, count: int) -> ViewAndMutationMeta:
    """``meta`` recording ``count`` backward tokens."""
    if count == meta.num_backward_tokens:
        return meta
    return dataclasses.replace(meta, num_backward_tokens=count)


def count_backward_tokens(joint: torch.fx.GraphModule) -> int:
    """How many token placeholders the joint's backward discovered."""
    return sum(
        1
        for n in joint.graph.find_nodes(op="placeholder")
        if str(n.target).startswith("tangents_token")
    )


def drop_unused_effect_results(gm: torch.fx.GraphModule) -> None:
    """Erase the unused ``getitem`` nodes of ``with_effects`` calls (the ``None`` result
    of an op that returns nothing), which torch's graphs do not have."""
    changed = False
    for node in list(gm.graph.nodes):
        if (
            node.op == "call_function"
            and node.target is operator.getitem
            and not node.users
            and isinstance(node.args[0], torch.fx.Node)
            and node.args[0].target is with_effects
        ):
            gm.graph.erase_node(node)
            changed = True
    if changed:
        gm.recompile()

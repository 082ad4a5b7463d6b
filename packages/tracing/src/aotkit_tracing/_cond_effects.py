"""Effect tokens threaded through ``torch.cond``'s branches.

# Note [Effect tokens through torch.cond]
# An effectful op (Note [Effect tokens]) inside a ``torch.cond`` branch must run when,
# and only when, eager runs it, in order with the graph's other effectful ops. torch's
# functionalization rule for cond does not thread tokens: the branch's op met the outer
# token (a tensor of another trace, baked into the subgraph as a fake constant) or made
# one of its own, and the graph failed when it ran. aotkit's rule, used only while
# aotkit compiles on this thread (``inside_a_trace``; torch's rule otherwise), is
# ``cond_with_tokens``:
#   * A cond whose branches hold an effectful op (a node whose target ``has_effects``,
#     in the branch graphs or their nested graphs; dynamo hands cond its branches as
#     graphs) takes the effect's token as its first operand, and both branches return
#     the chain's end as their first output: the branch with the op returns its
#     ``with_effects`` token, the other a ``clone`` of the token it got (a branch may
#     not return an alias of its input). The cond's first result continues the graph's
#     chain; the user's outputs follow it. A cond without effectful ops is torch's.
#   * The token comes from the mode's chain: the forward's token input, or, while the
#     joint traces the backward, a fresh ``tangents_token`` placeholder (the backward's
#     chain of Note [Effect tokens]); the metadata pass discovers the effect type as
#     for any effectful op, so ``meta.tokens`` counts it.
#   * The backward: eager's cond differentiates a branch by running the branch again
#     inside its backward (cond's autograd recomputes the forward), so eager runs the
#     effectful op once in the forward and once more in the backward. The compiled
#     backward's cond gets its branches the same way, and threads the backward's
#     token: the same side effects, in the same order, as eager.
#   * At run time the token operands must be tensors (cond refuses ``None`` operands),
#     so graphs are called with an empty tensor per token (``aotkit_runtime``'s
#     ``EFFECT_TOKEN``), never ``None``.
#   * The rule is installed when aotkit_tracing is imported, so every compile key
#     (the on-disk one reads the kernels registered outside torch) sees it, in the
#     process that stores an entry and in the one that reads it.
#   * One effect type only (torch has one, ``ORDERED``). An effectful op the scan cannot
#     see (reached through a Python function the branch graph does not show) still
#     makes a token inside the branch, and ``check_no_effects_in_subgraphs`` raises the
#     clear error of Note [Higher-order operators]: a ``with_effects`` in a subgraph is
#     accepted only when its token is the subgraph's own placeholder or the chain from it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch._higher_order_ops.effects import has_effects, new_token_tensor
from torch._subclasses.functional_tensor import (
    FunctionalTensor,
    FunctionalTensorMode,
    PythonFunctionalizeAPI,
)

__all__ = ["branches_effects", "install_cond_effects"]

_installed = [False]
_install_lock = threading.Lock()


def _target_has_effects(target: Any) -> bool:
    if isinstance(target, torch._ops.OpOverloadPacket):
        names = target.overloads()  # type: ignore[no-untyped-call]
        return any(has_effects(getattr(target, name)) for name in names)
    return has_effects(target)


def branches_effects(*branches: Any) -> bool:
    """Whether any branch graph (or a graph nested in one) calls an effectful op."""
    for branch in branches:
        if not isinstance(branch, torch.nn.Module):
            continue
        for sub in branch.modules():
            if not isinstance(sub, torch.fx.GraphModule):
                continue
            for node in sub.graph.nodes:
                if node.op == "call_function" and _target_has_effects(node.target):
                    return True
    return False


def _chain_token(mode: FunctionalTensorMode, key: Any) -> Any:
    """The current token of effect ``key``'s chain, discovered as torch discovers one for
    an effectful op when the chain has none yet. See Note [Effect tokens through
    torch.cond]."""
    tokens: dict[Any, Any] = mode._tokens
    if key in tokens:
        return tokens[key]
    if not mode._allow_token_discovery:
        raise AssertionError(f"aotkit: no token for the effect {key} of a torch.cond branch")
    from torch.fx.experimental.proxy_tensor import (
        disable_proxy_modes_tracing,
        track_tensor_tree,
    )

    proxy_mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY)
    if proxy_mode is None:
        tokens[key] = new_token_tensor()
        return tokens[key]
    # discovered while the joint traces the backward: the backward chain's placeholder
    with disable_proxy_modes_tracing():
        token = new_token_tensor()
    proxy = proxy_mode.tracer.create_proxy(
        "placeholder", "tangents_token", (), {}, name="tangents_token"
    )
    track_tensor_tree(token, proxy, constant=None, tracer=proxy_mode.tracer)
    tokens[key] = token
    return token


def _threaded(mode: FunctionalTensorMode, key: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
    def branch(token: Any, *args: Any) -> tuple[Any, ...]:
        tokens: dict[Any, Any] = mode._tokens
        had, saved = key in tokens, tokens.get(key)
        tokens[key] = token
        try:
            out = fn(*args)
            end = tokens[key]
        finally:
            if had:
                tokens[key] = saved
            else:
                tokens.pop(key, None)
        if end is token:
            end = token.clone()  # never an alias of the branch's input
        rest = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        return (end, *rest)

    return branch


def cond_with_tokens(
    original: Callable[..., Any], inside_a_trace: Callable[[], bool]
) -> Callable[..., Any]:
    """cond's functionalization rule with effect tokens threaded. See Note [Effect
    tokens through torch.cond]."""

    def rule(mode: Any, pred: Any, true_fn: Any, false_fn: Any, inputs: Any) -> Any:
        if (
            not inside_a_trace()
            or not isinstance(mode, FunctionalTensorMode)
            or not branches_effects(true_fn, false_fn)
        ):
            return original(mode, pred, true_fn, false_fn, inputs)
        from torch._library.effects import EffectType

        key = EffectType.ORDERED
        token = _chain_token(mode, key)
        if not isinstance(token, FunctionalTensor):
            token = PythonFunctionalizeAPI(mode).wrap_tensors((token,))[0]
        out = original(
            mode,
            pred,
            _threaded(mode, key, true_fn),
            _threaded(mode, key, false_fn),
            (token, *inputs),
        )
        mode._tokens[key] = out[0]
        rest = out[1:]
        return list(rest) if isinstance(out, list) else tuple(rest)

    return rule


def install_cond_effects(inside_a_trace: Callable[[], bool]) -> None:
    """Install ``cond_with_tokens`` as cond's rule for torch's Python functionalization
    mode, once per process (when aotkit_tracing is imported); it defers to torch's rule
    outside aotkit's compilations."""
    if _installed[0]:
        return
    with _install_lock:
        if _installed[0]:
            return
        from torch._higher_order_ops.cond import cond_op

        table = cond_op.python_key_table
        original = table[FunctionalTensorMode]
        table[FunctionalTensorMode] = cond_with_tokens(original, inside_a_trace)
        cond_op._dispatch_cache.clear()
        _installed[0] = True

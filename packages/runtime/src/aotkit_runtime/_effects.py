"""Calling graphs that thread effect tokens. See Note [Effect tokens] in aotkit_tracing.

A forward (or inference) graph with effectful ops takes ``num_tokens`` leading token
inputs and returns as many leading token outputs; a backward takes its tokens after the
tangents and returns them after the gradients. Each call passes ``EFFECT_TOKEN``, one
shared empty tensor, for every token (``with_effects`` ignores the value: the order is in
the graph; torch passes ``None``, which a ``torch.cond`` that threads the token refuses as
an operand: See Note [Effect tokens through torch.cond] in aotkit_tracing) and drops the
returned tokens, so the rest of the runtime sees the usual calling convention.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._call import as_list_caller

# the value of every token input: graphs never write it (they are functional)
EFFECT_TOKEN = torch.empty(0)


def _boxed(fn: Callable[[list[Any]], Sequence[Any]]) -> Callable[[list[Any]], Sequence[Any]]:
    fn._boxed_call = True  # type: ignore[attr-defined]
    return fn


def forward_with_tokens(compiled: Callable[..., Any], num_tokens: int) -> Callable[..., Any]:
    """``compiled`` called as a token-free forward: ``(*args) -> (*returns)`` (boxed)."""
    if num_tokens == 0:
        return compiled
    call = as_list_caller(compiled)
    none_tokens = [EFFECT_TOKEN] * num_tokens

    def run(args: list[Any]) -> Sequence[Any]:
        outs = call([*none_tokens, *args])
        return outs[num_tokens:]

    return _boxed(run)


def backward_with_tokens(compiled: Callable[..., Any], num_tokens: int) -> Callable[..., Any]:
    """``compiled`` called as a token-free backward: ``(*saved, *tangents) -> (*grads)``
    (boxed)."""
    if num_tokens == 0:
        return compiled
    call = as_list_caller(compiled)
    none_tokens = [EFFECT_TOKEN] * num_tokens

    def run(args: list[Any]) -> Sequence[Any]:
        all_args = [*args, *none_tokens]
        if isinstance(args, list):
            args.clear()  # the boxed convention: the saved activations may be freed early
        outs = call(all_args)
        return outs[: len(outs) - num_tokens]

    return _boxed(run)

"""Calling a compiled graph under either calling convention.

# Note [Boxed calling convention]
# A compiled graph is either called as ``fn(*args)`` or, when it carries
# ``_boxed_call = True``, as ``fn(args_list)``; a boxed callee may clear the list to free
# inputs early. The runtime always builds a fresh list for a boxed call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch.fx


def is_boxed(fn: Callable[..., Any]) -> bool:
    return bool(getattr(fn, "_boxed_call", False))


def as_list_caller(fn: Callable[..., Any]) -> Callable[[list[Any]], Sequence[Any]]:
    """Return ``g(args_list) -> outputs`` for a compiled graph of either convention.

    See Note [Boxed calling convention].
    """
    if is_boxed(fn):
        return fn
    if isinstance(fn, torch.fx.GraphModule) and not fn._forward_hooks and not fn._forward_pre_hooks:
        # Skip nn.Module.__call__; the generated forward is what runs either way.
        fn = fn.forward

    def unboxed(args: list[Any]) -> Sequence[Any]:
        out = fn(*args)
        return out if isinstance(out, (list, tuple)) else (out,)

    return unboxed

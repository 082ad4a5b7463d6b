"""Calling a compiled graph under either calling convention.

See Note [Boxed calling convention] in aotkit_schemas.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch.fx
from aotkit_schemas import is_boxed, unboxed_entry


def as_list_caller(fn: Callable[..., Any]) -> Callable[[list[Any]], Sequence[Any]]:
    """Return ``g(args_list) -> outputs`` for a compiled graph of either convention.

    A boxed graph with an unboxed entry is called through that entry (no boxing frame,
    and the list is left as it is); ``g`` is ``fn`` itself only for a boxed graph without
    one, which may clear the list. See Note [Boxed calling convention].
    """
    direct = unboxed_entry(fn)
    if direct is not None:

        def call_direct(args: list[Any]) -> Sequence[Any]:
            return direct(*args)  # type: ignore[no-any-return]

        return call_direct
    if is_boxed(fn):
        return fn
    if isinstance(fn, torch.fx.GraphModule) and not fn._forward_hooks and not fn._forward_pre_hooks:
        # Skip nn.Module.__call__; the generated forward is what runs either way.
        fn = fn.forward

    def unboxed(args: list[Any]) -> Sequence[Any]:
        out = fn(*args)
        return out if isinstance(out, (list, tuple)) else (out,)

    return unboxed

"""The boxed calling convention: a compiled graph takes its inputs as one list.

# Note [Boxed calling convention]
# A compiled graph may be "boxed": it carries ``_boxed_call = True`` and is called as
# ``compiled(args)`` with a single ``list`` of inputs instead of ``compiled(*args)``.
# Taking the list lets the callee drop its references to the inputs while it runs
# (``args.clear()``), so an input that is dead after its last use inside the graph can be
# freed early. The contract, shared with torch's AOTAutograd:
#   * the caller builds a fresh list for every call and never reads it afterwards; the
#     callee may clear it, but must not otherwise change it;
#   * the callee returns its outputs, never the list it was given;
#   * a compiler whose result lacks ``_boxed_call`` is called with ``*args``; runtimes
#     warn about it, so every aotkit compiler returns a boxed callable.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch.fx

BoxedCallable = Callable[[list[Any]], Any]

# make_boxed_func copies only these attributes, like torch's ``simple_wraps``: the boxed
# function keeps its own __name__, __qualname__ and __module__, which makes tracebacks and
# profiles show the wrapper instead of pretending to be the wrapped callable.
_WRAPPER_ASSIGNMENTS = ("__doc__", "__annotations__", "__type_params__")


def make_boxed_func(f: Callable[..., Any]) -> BoxedCallable:
    """Wrap ``f(*args)`` as a boxed callable ``g(args)``. See Note [Boxed calling convention].

    Same behaviour as torch's ``make_boxed_func``: ``g`` unpacks the list and calls ``f``;
    it does not clear the list itself. ``g`` gets ``f``'s ``__doc__``, ``__annotations__``
    and instance ``__dict__``, ``g.__wrapped__`` is ``f``, and ``g._boxed_call`` is True.
    Like torch's, it boxes whatever it is given, so do not pass a callable that is boxed
    already.
    """

    @functools.wraps(f, assigned=_WRAPPER_ASSIGNMENTS)
    def g(args: list[Any]) -> Any:
        return f(*args)

    g._boxed_call = True  # type: ignore[attr-defined]
    return g


def is_boxed(f: Callable[..., Any]) -> bool:
    """Whether ``f`` follows Note [Boxed calling convention]."""
    return getattr(f, "_boxed_call", False) is True


def make_boxed_compiler(
    compiler: Callable[[torch.fx.GraphModule, Any], Callable[..., Any]],
) -> Callable[[torch.fx.GraphModule, Sequence[Any]], BoxedCallable]:
    """Turn a compiler that returns an unboxed callable into one that returns a boxed one.

    The result has ``compiler``'s name and docstring (``functools.wraps``), like torch's.
    One deliberate difference: when ``compiler`` already returns a boxed callable, it is
    returned as it is. torch's version boxes it a second time, which breaks it.
    """

    @functools.wraps(compiler)
    def boxed_compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> BoxedCallable:
        compiled = compiler(gm, example_inputs)
        if is_boxed(compiled):
            return compiled
        return make_boxed_func(compiled)

    return boxed_compiler

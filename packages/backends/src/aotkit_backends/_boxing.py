"""The boxed calling convention: a compiled graph takes its inputs as one list.

See Note [Boxed calling convention] in aotkit_schemas. Every aotkit compiler returns a
boxed callable.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch.fx
from aotkit_schemas import is_boxed as is_boxed

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

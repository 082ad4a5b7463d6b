"""The no-op compiler: run the graph as it is."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch.fx
from aotkit_schemas import (
    mark_cache_key,
    mark_example_inputs_unused,
    mark_graph_reader,
    mark_lazy_unboxed_entry,
    mark_stealing_entry,
)
from torch.fx._lazy_graph_module import _LazyGraphModule

from ._boxing import BoxedCallable, make_boxed_func
from ._fast_graph import graph_function


def nop(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> BoxedCallable:
    """Run ``gm`` as it is, boxed: the reference compiler for checking accuracy.

    Same contract as torch's ``functorch.compile.nop``: ``nop(gm, inputs)(list(args))``
    computes ``gm(*args)`` and does not clear the list; ``example_inputs`` is ignored, and
    ``result.__wrapped__`` is ``gm``. The ops run through ``graph_function(gm)``: the same
    ATen ops in the same order, each called through its cheapest Python entry point
    (See Note [Graph functions]); it also offers a stealing entry that frees each input at
    its last use (See Note [Boxed calling convention]). Each entry is generated when first
    used, so a caller that only ever uses one of them pays for one. A module with hooks,
    or a graph the generator does not handle, runs through ``gm`` itself. nop reads only
    ``gm.graph`` (See Note [Compilers that read only the graph]).
    """
    if gm._forward_hooks or gm._forward_pre_hooks:
        return make_boxed_func(gm)
    built: list[Callable[..., Any]] = []

    def unboxed() -> Callable[..., Any]:
        if not built:
            fn = graph_function(gm)
            if fn is None:
                _LazyGraphModule.force_recompile(gm)
                fn = gm.forward
            built.append(fn)
        return built[0]

    def boxed(args: list[Any]) -> Any:
        return (built[0] if built else unboxed())(*args)

    boxed._boxed_call = True  # type: ignore[attr-defined]
    boxed.__wrapped__ = gm  # type: ignore[attr-defined]
    mark_lazy_unboxed_entry(boxed, unboxed)
    mark_stealing_entry(boxed, lambda: graph_function(gm, steal_args=True))
    return boxed


mark_graph_reader(nop)
mark_example_inputs_unused(nop)  # See Note [Compilers that ignore their example inputs]
mark_cache_key(nop, "aotkit.nop")

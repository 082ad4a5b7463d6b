"""Ops whose result may share an argument's memory though their schema says it is fresh.

# Note [Ops that alias despite their schema]
# An op's schema annotates the returns that alias an argument (``view(Tensor(a) self, ...)
# -> Tensor(a)``), and graph passes follow those to tell which graph values share memory.
# A few ops return a view of their first argument with a schema that promises a fresh
# tensor: ``aten._unsafe_view`` (what ``reshape`` of a copy and ``matmul`` on a 3-d input
# return, and what functionalization emits when it replays a ``reshape`` view after a
# mutation), ``unsafe_split``/``unsafe_split_with_sizes`` and a few composite ops. Taking
# their results for fresh memory was wrong twice:
#   * nop's graph functions added in place into a saved activation (See Note [In-place
#     accumulation in graph functions] in aotkit_backends);
#   * two outputs of an inference graph rooted at one ``add`` through ``_unsafe_view``
#     looked like views of two different intermediates, and both were returned as plain
#     tensors where eager returns two views of one base (See Note [unsafe_view_alias
#     outputs] in aotkit_runtime).
# Every pass that follows aliases through a graph follows these ops to their first
# argument as it follows the schema-annotated views.
"""

from __future__ import annotations

import torch

ALIASES_DESPITE_SCHEMA = frozenset({
    "aten::_unsafe_view",
    "aten::unsafe_split",
    "aten::unsafe_split_with_sizes",
    "aten::_reshape_from_tensor",
    "aten::broadcast_tensors",
    "aten::lift",
})


def aliases_despite_schema(op: torch._ops.OpOverload) -> bool:
    """Whether ``op``'s result may share its first argument's memory though no return of
    its schema is annotated as an alias. See Note [Ops that alias despite their schema]."""
    return op._schema.name in ALIASES_DESPITE_SCHEMA

"""Which additions of a graph may write into their first operand.

# Note [In-place accumulation in graph functions]
# Eager autograd sums the gradients that reach a tensor from several uses in place (its
# input buffer does ``add_`` into a gradient it owns). A functional backward graph spells
# the same sum ``add(a, b)``, which allocates and writes a new tensor: on a transformer
# layer that alone makes the compiled step several percent slower than eager. With grad
# mode off (how aotkit runs every compiled forward, backward and inference graph), a graph
# function computes ``add.Tensor(a, b)`` as ``a.add_(b)`` when nobody can tell:
#   * ``a``'s memory was allocated by this graph: its storage root (following view ops
#     and ``getitem`` of view-returning ops back to the producer) is an op whose schema
#     returns fresh tensors, never a graph input or attribute;
#   * nothing that shares that memory (``a``, the root, any view of it) is used after
#     the addition, so in particular none of it is a graph output, and ``b`` is not a view
#     of it;
#   * the result has ``a``'s shape, strides, dtype and device (no broadcasting into ``a``,
#     no type promotion), read off the nodes' ``val`` metadata with static sizes (See Note
#     [Static value specs] in aotkit_schemas), and ``a`` is dense and non-overlapping.
# The same kernel writes the same values (bitwise); only the allocation is saved. Graphs
# with a mutable op, or with a call whose aliasing is unknown (a higher-order op, a
# torch-level call, ``operator.iadd`` on tensors), are left alone. The generated function
# reads grad mode once on entry and each such line picks ``add_`` or ``add``: with grad
# mode on the graph runs unchanged, since autograd may have saved ``a``. A line of a plain
# ``add(a, b)`` makes that pick in one call, ``add_reusing(add, a, b, no_grad)``: a
# conditional expression per line made ``compile()`` of the generated source about 20%
# slower (compare.py's pointwise forward: 24 such lines of 147), and a warm start from
# the on-disk cache pays ``compile()`` for every graph. Lines with other arguments
# (``alpha=``) keep the conditional expression.
#
# Schemas do not tell every alias: ``aten._unsafe_view`` (what ``matmul`` on a 3-d input
# returns, so every ``nn.Linear`` of a transformer) returns a view of its input with a
# schema that promises a fresh tensor, and so do ``unsafe_split``/``unsafe_split_with_sizes``
# and a few composite ops. Taking them for fresh memory wrote the sum into a saved
# activation: tanh-GELU (``x + 0.044715 * x**3`` on the Linear's ``_unsafe_view``) turned
# the forward's ``addmm``, saved for a min-cut backward that recomputes the GELU from it,
# into ``x + 0.044715 * x**3``, and aotkit_eager trained albert, gpt_neo, gptj, phi and
# mobilebert with wrong gradients. These ops are followed to their first argument as the
# schema-annotated views are (See Note [Ops that alias despite their schema] in
# aotkit_schemas).
#
# Because a wrong guess here corrupts a saved activation in silence, the static analysis
# is backed by a check at run time: ``a.add_(b)`` runs only when no other tensor shares
# ``a``'s storage at that moment (``sole_owner``: the storage's use count equals that of a
# tensor that owns its memory alone, measured once per process). A view, an
# ``_unsafe_view``, a saved output or any other alias the schemas did not reveal keeps the
# count higher, and the line falls back to the out-of-place ``add``: same values, one
# allocation more. The check costs about half a microsecond per such line.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from aotkit_schemas import aliases_despite_schema, dense_and_non_overlapping, static_value_spec

_ADD = torch.ops.aten.add.Tensor
_ADD_IN_PLACE = torch._C.TensorBase.add_
_SCALARS = (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)


# per overload: (its schema is mutable, one of its returns aliases an input, it returns
# several tensors); reading a schema builds Python objects for all its arguments, and a
# graph calls few distinct ops
_SCHEMA_FACTS: dict[torch._ops.OpOverload, tuple[bool, bool, bool]] = {}

def _storage_use_count(t: torch.Tensor) -> int:
    return int(torch._C._storage_Use_Count(t.untyped_storage()._cdata))


# the use count a tensor that alone owns its storage reports while it is being asked
# (the Python storage object made for the question holds a reference too)
_SOLE_USE_COUNT = _storage_use_count(torch.empty(1))


def sole_owner(t: torch.Tensor) -> bool:
    """Whether no other tensor shares ``t``'s storage right now. See Note [In-place
    accumulation in graph functions]."""
    return type(t) is torch.Tensor and _storage_use_count(t) == _SOLE_USE_COUNT


def add_reusing(plain: Any, a: Any, b: Any, no_grad: bool) -> Any:
    """``a.add_(b)`` when grad mode is off and ``a`` owns its storage alone, else
    ``plain(a, b)`` (the call the graph makes). See Note [In-place accumulation in graph
    functions]."""
    # ``sole_owner(a)``, inline: this runs once per such line of every call
    if no_grad and type(a) is torch.Tensor and _storage_use_count(a) == _SOLE_USE_COUNT:
        return _ADD_IN_PLACE(a, b)
    return plain(a, b)


def _schema_facts(op: torch._ops.OpOverload) -> tuple[bool, bool, bool]:
    facts = _SCHEMA_FACTS.get(op)
    if facts is None:
        schema = op._schema
        returns = schema.returns
        facts = _SCHEMA_FACTS[op] = (
            schema.is_mutable,
            aliases_despite_schema(op) or any(r.alias_info is not None for r in returns),
            len(returns) != 1 or isinstance(returns[0].type, torch.ListType),
        )
    return facts


def in_place_adds(nodes: Sequence[torch.fx.Node]) -> set[torch.fx.Node]:
    """The ``add.Tensor`` nodes that may be computed as ``args[0].add_(args[1])`` with grad
    mode off. See Note [In-place accumulation in graph functions]."""
    # a graph without additions has none to find: no schema is read (the first read of
    # an operator's schema in a process is costly, and a warm start pays it per operator)
    if not any(node.target is _ADD for node in nodes):
        return set()
    index = {n: i for i, n in enumerate(nodes)}
    root: dict[torch.fx.Node, torch.fx.Node] = {}
    fresh: set[torch.fx.Node] = set()  # roots whose memory the graph allocated
    for node in nodes:
        root[node] = node
        if node.op != "call_function":
            continue
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            mutable, returns_alias, _ = _schema_facts(target)
            if mutable:
                return set()
            if not returns_alias:
                fresh.add(node)
            elif node.args and isinstance(node.args[0], torch.fx.Node):
                root[node] = root[node.args[0]]
            else:
                return set()  # an alias of something we cannot name
        elif target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            producer = node.args[0]
            # one fresh tensor of a multi-output op; read off the schema, not the value
            # (a graph restored from the on-disk cache builds a value at its first read)
            made_by = producer.target
            if (
                producer in fresh
                and isinstance(made_by, torch._ops.OpOverload)
                and _schema_facts(made_by)[2]
            ):
                fresh.add(node)
            else:
                root[node] = root[producer]
        elif not isinstance(node.meta.get("val"), _SCALARS):
            # a higher-order op, a torch-level call, operator.iadd on tensors, ...: its
            # aliasing is unknown (size arithmetic on SymInts is fine)
            return set()
    last_use: dict[torch.fx.Node, int] = {}
    for node in nodes:
        for inp in node.all_input_nodes:
            r = root[inp]
            last_use[r] = max(last_use.get(r, -1), index[node])
    found: set[torch.fx.Node] = set()
    for node in nodes:
        if node.target is not _ADD or node.op != "call_function":
            continue
        a = node.args[0]
        b = node.args[1] if len(node.args) > 1 else node.kwargs.get("other")
        if not isinstance(a, torch.fx.Node) or root[a] not in fresh:
            continue
        if last_use.get(root[a], -1) > index[node]:
            continue
        if isinstance(b, torch.fx.Node) and root[b] is root[a]:
            continue
        # See Note [Static value specs] in aotkit_schemas: no deferred value is built
        spec = static_value_spec(a)
        if spec is None or spec != static_value_spec(node):
            continue
        if not dense_and_non_overlapping(spec[0], spec[1]):
            continue
        found.add(node)
    return found

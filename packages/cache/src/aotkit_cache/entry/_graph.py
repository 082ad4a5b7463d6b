"""Graphs in the on-disk cache: FX graphs as JSON and back (See Note [On-disk compile
cache] in ``aotkit_cache._files``).

# Note [Graph nodes in the cache JSON]
# A graph is ``{"nodes": [...], "vals": [...]}`` (plus ``"subgraphs"`` and
# ``"constants"`` when it has them: See Note [Higher-order operators in the on-disk cache]
# and Note [Tensor constants in the on-disk cache]; ``"vals"``: See Note [The value table
# of a cached graph]). A node is an array, in graph order:
#     [op, name, target, args, kwargs, val]     or, with extras, [..., val, {extras}]
#   * ``op``: "placeholder", "call_function", "get_attr" or "output";
#   * ``target``: a placeholder's or get_attr's target string; a call's operator as
#     ``"op:<ns>::<name>.<overload>"`` (an ATen-style overload, looked up through
#     ``torch.ops``), ``"py:<name>"`` (a closed table of Python operators) or ``"hop:<name>"``;
#     null for the output;
#   * ``args``: an array of argument forms (the node's args tuple); ``kwargs``: an array of
#     ``[name, form]`` pairs in the node's order (the order shows in the graph's code);
#   * ``val``: the node's value as an index into ``"vals"``; null for the output and a
#     get_attr;
#   * extras: ``{"static": bool}`` on a placeholder (See Note [Static input stamps of
#     cached graphs]), ``{"user_visible": [...]}`` on the output (See Note [User-visible
#     output stamps of cached graphs]); no other key is read, and any other is refused.
# Argument forms keep the common cases bare, since a warm start parses and rebuilds every
# node (format 3's one-key objects per node and per argument made the parse and the
# rebuild of compare.py's convnet 40% slower): null, booleans and integers are
# themselves; a string is the name of an earlier node; an array is a Python list of forms.
# Everything else is a one-key object: ``{"s": str}`` a string literal, ``{"t": [...]}`` a
# tuple, ``{"f": float.hex()}`` a float, ``{"dtype"}``, ``{"device"}``, ``{"layout"}``,
# ``{"mf"}`` (memory format), ``{"op"}`` (an overload argument of a higher-order operator),
# ``{"d": [[key, form], ...]}`` (a dict with string keys).
# Every form is checked as it is read: a string naming no earlier node of the same graph,
# an unknown tag, a value of the wrong JSON type rejects the graph (CacheFormatError).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from aotkit_schemas import (
    CacheFormatError,
    TensorSpec,
    Uncacheable,
    descriptor_from_json,
    descriptor_to_json,
    dtype_from_name,
    dtype_name,
)
from torch.fx._lazy_graph_module import _make_graph_module, _use_lazy_graph_module

from aotkit_cache.key._constants import attach_constants, constants_to_json
from aotkit_cache.key._symbolic import SymbolicForm

from ._fake_mode import FakeModeLike
from ._hops import (
    check_subgraph_reads,
    hop_target_from_json,
    hop_target_to_json,
    is_attribute_name,
    owner_from_json,
    rng_state_json,
    rng_state_values,
    subgraphs_to_json,
)
from ._stamps import output_stamp_from_json, output_stamp_to_json
from ._value_table import ValueTable, ValueTableWriter
from ._values import add_node, parse_device, put_meta

_PY_TARGETS: dict[str, Callable[..., Any]] = {
    f"operator.{name}": getattr(operator, name)
    for name in ("getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg",
                 "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "not_")
}
_PY_TARGETS.update({
    f"torch.{name}": getattr(torch, name)
    for name in ("sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_sqrt", "sym_ite")
    if hasattr(torch, name)
})
_PY_TARGETS["math.sqrt"] = math.sqrt
_PY_TARGET_NAMES = {id(v): k for k, v in _PY_TARGETS.items()}
_LAYOUTS = {str(v).removeprefix("torch."): v for v in (torch.strided, torch.sparse_coo)}
_FORMATS = {
    str(v).removeprefix("torch."): v
    for v in (torch.contiguous_format, torch.channels_last, torch.preserve_format,
              torch.channels_last_3d)
}


def _target_to_json(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"op:{target._schema.name}.{target._overloadname}"
    name = _PY_TARGET_NAMES.get(id(target))
    if name is None:
        hop = hop_target_to_json(target)  # See Note [Higher-order operators in the on-disk cache]
        if hop is not None:
            return hop
        raise Uncacheable(f"graph target {target!r} has no cache form")
    return f"py:{name}"


# operators already looked up by this process (``torch.ops`` attribute lookups build op
# packets and overloads; a graph names the same few operators many times)
_OP_TARGETS: dict[str, Any] = {}


def _target_from_json(name: Any) -> Any:
    if not isinstance(name, str):
        raise CacheFormatError("a node target must be a string")
    known = _OP_TARGETS.get(name)
    if known is not None:
        return known
    if name.startswith("py:") and name[3:] in _PY_TARGETS:
        return _PY_TARGETS[name[3:]]
    if name.startswith("hop:"):
        return hop_target_from_json(name)
    if name.startswith("op:") and "::" in name:
        qual, _, overload = name[3:].rpartition(".")
        ns, _, op = qual.partition("::")
        try:
            packet = getattr(getattr(torch.ops, ns), op)
            target = getattr(packet, overload)
        except (AttributeError, RuntimeError) as e:
            raise CacheFormatError(f"unknown operator {name!r}") from e
        if isinstance(target, torch._ops.OpOverload):
            _OP_TARGETS[name] = target
            return target
    raise CacheFormatError(f"unknown node target {name!r}")


def _arg_to_json(a: Any) -> Any:
    """See Note [Graph nodes in the cache JSON]."""
    if isinstance(a, torch.fx.Node):
        return a.name
    if a is None or isinstance(a, (bool, int)):
        return a
    if isinstance(a, str):
        return {"s": a}
    if isinstance(a, float):
        return {"f": a.hex()}
    if isinstance(a, list):
        return [_arg_to_json(x) for x in a]
    if isinstance(a, tuple):
        return {"t": [_arg_to_json(x) for x in a]}
    if isinstance(a, torch.dtype):
        return {"dtype": dtype_name(a)}
    if isinstance(a, torch.device):
        return {"device": str(a)}
    if isinstance(a, torch.layout) and str(a).removeprefix("torch.") in _LAYOUTS:
        return {"layout": str(a).removeprefix("torch.")}
    if isinstance(a, torch.memory_format) and str(a).removeprefix("torch.") in _FORMATS:
        return {"mf": str(a).removeprefix("torch.")}
    # arguments only higher-order operators take (See Note [Higher-order operators in the
    # on-disk cache])
    if isinstance(a, torch._ops.OpOverload):
        return {"op": _target_to_json(a)}
    if isinstance(a, dict) and all(type(k) is str for k in a):
        return {"d": [[k, _arg_to_json(v)] for k, v in a.items()]}
    raise Uncacheable(f"graph argument {type(a).__name__} has no cache form")


def _arg_from_json(a: Any, env: dict[str, torch.fx.Node]) -> Any:
    """See Note [Graph nodes in the cache JSON]."""
    kind = type(a)
    if kind is str:
        node = env.get(a)
        if node is None:
            raise CacheFormatError(f"graph argument {a!r} names no earlier node")
        return node
    if a is None or kind is int or kind is bool:
        return a
    if kind is list:
        return [_arg_from_json(x, env) for x in a]
    if kind is dict and len(a) == 1:
        (tag, v), = a.items()
        if tag == "t" and type(v) is list:
            return tuple([_arg_from_json(x, env) for x in v])
        if tag == "s" and type(v) is str:
            return v
        if tag == "f" and type(v) is str:
            try:
                return float.fromhex(v)
            except ValueError as e:
                raise CacheFormatError(f"bad float {v!r}") from e
        if tag == "dtype" and type(v) is str:
            return dtype_from_name(v)
        if tag == "device" and type(v) is str:
            return parse_device(v)
        if tag == "layout" and v in _LAYOUTS:
            return _LAYOUTS[v]
        if tag == "mf" and v in _FORMATS:
            return _FORMATS[v]
        if tag == "op" and type(v) is str and v.startswith("op:"):
            return _target_from_json(v)
        if tag == "d" and type(v) is list:
            return _pairs_from_json(v, env)
    raise CacheFormatError(f"bad graph argument {a!r}")


def _pairs_from_json(items: Any, env: dict[str, torch.fx.Node]) -> dict[str, Any]:
    """A dict from ``[[key, form], ...]`` (a dict argument, a node's kwargs)."""
    out: dict[str, Any] = {}
    for item in items:
        if type(item) is not list or len(item) != 2 or type(item[0]) is not str:
            raise CacheFormatError("bad dict argument")
        if item[0] in out:
            raise CacheFormatError("a dict argument repeats a key")
        out[item[0]] = _arg_from_json(item[1], env)
    return out


def _val_to_json(val: Any, form: SymbolicForm | None) -> Any:
    if isinstance(val, torch.Tensor):
        spec = TensorSpec.of(val)
        if not spec.is_static:
            if form is None:
                raise Uncacheable("a graph value has symbolic sizes")
            # See Note [Dynamic shapes in the on-disk cache]
            sym = form.tensor(val)
            sym["dtype"], sym["device"] = dtype_name(val.dtype), str(val.device)
            return {"ST": sym, "rg": val.requires_grad}
        return {"T": spec.to_json(), "rg": val.requires_grad}
    if isinstance(val, torch.SymInt):
        if form is None:
            raise Uncacheable("a graph value is a SymInt")
        return {"si": form.tree(val)}
    if isinstance(val, (list, tuple)):
        return {"l": [_val_to_json(v, form) for v in val]}
    if val is None or isinstance(val, (bool, int, float)):
        return {"s": None if val is None else type(val).__name__}
    raise Uncacheable(f"a graph value of type {type(val).__name__} has no cache form")


# Note [Static input stamps of cached graphs]
# The partitioners stamp each primal placeholder with ``meta["is_static_input"]`` (whether
# it keeps its address from call to call), and aotkit_inductor reads the stamps to hand
# Inductor torch's ``static_input_idxs`` (See Note [Static inputs of aotkit_inductor's
# graphs] in aotkit_backends). The indices are part of Inductor's FX-graph-cache key, so a
# restored graph carries the stamps: without them a warm start compiles with other
# indices than the cold one and misses the Inductor artifact the entry stored.
_STATIC_INPUT_KEY = "is_static_input"


def graph_to_json(gm: torch.fx.GraphModule, form: SymbolicForm | None = None) -> dict[str, Any]:
    """``gm``'s graph in the form of Note [Graph nodes in the cache JSON]; ``form``
    converts symbolic sizes (See Note [Dynamic shapes in the on-disk cache])."""
    nodes = []
    vals = ValueTableWriter()  # See Note [The value table of a cached graph]
    rng = rng_state_values(gm)  # See Note [RNG state operators in the on-disk cache]
    for node in gm.graph.nodes:
        op = node.op
        if op not in ("placeholder", "call_function", "output", "get_attr"):
            raise Uncacheable(f"graph node {node.name} is a {op}")
        target = (
            _target_to_json(node.target) if op == "call_function"
            else None if op == "output" else str(node.target)
        )
        val = None
        if node in rng:
            v = node.meta.get("val")
            val = vals.ref(
                rng_state_json(v) if rng[node] == "state"
                else {"l": [rng_state_json(v[0]), _val_to_json(v[1], form)]}
            )
        elif op not in ("output", "get_attr"):
            val = vals.ref(_val_to_json(node.meta.get("val"), form))
        entry: list[Any] = [
            op, node.name, target, [_arg_to_json(a) for a in node.args],
            [[k, _arg_to_json(v)] for k, v in node.kwargs.items()], val,
        ]
        extras: dict[str, Any] = {}
        static = node.meta.get(_STATIC_INPUT_KEY)
        if op == "placeholder" and isinstance(static, bool):
            extras["static"] = static  # See Note [Static input stamps of cached graphs]
        if op == "output":
            output_stamp_to_json(node, extras)
        if "desc" in node.meta:  # See Note [Graph descriptors] in aotkit_schemas
            d = node.meta["desc"]
            extras["desc"] = (
                [descriptor_to_json(x) for x in d] if op == "output" else descriptor_to_json(d)
            )
        if extras:
            entry.append(extras)
        nodes.append(entry)
    subgraphs = subgraphs_to_json(gm, lambda sub: graph_to_json(sub, form))
    # See Note [Higher-order operators in the on-disk cache]
    out: dict[str, Any] = {"nodes": nodes, "vals": vals.values}
    if subgraphs:
        out["subgraphs"] = subgraphs
    constants = constants_to_json(gm)  # See Note [Tensor constants in the on-disk cache]
    if constants:
        out["constants"] = constants
    return out


_EXTRAS = {
    "placeholder": frozenset({"static", "desc"}), "output": frozenset({"user_visible", "desc"})
}


def graph_from_json(
    d: Any, fake_mode: FakeModeLike, symbols: dict[str, Any] | None = None
) -> torch.fx.GraphModule:
    """The GraphModule ``graph_to_json`` described; node values become fakes in
    ``fake_mode``, symbolic sizes are evaluated with ``symbols``. Raises CacheFormatError
    (See Note [Graph nodes in the cache JSON])."""
    if not isinstance(d, dict) or not isinstance(d.get("nodes"), list):
        raise CacheFormatError("a graph must be an object with a node list")
    graph = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}
    values = ValueTable(d.get("vals"), fake_mode, symbols)
    for entry in d["nodes"]:
        if type(entry) is not list or len(entry) not in (6, 7):
            raise CacheFormatError("a node must be an array of 6 or 7 items")
        op, name, target, args_raw, kwargs_raw, val = entry[:6]
        if type(name) is not str or name in env:
            raise CacheFormatError(f"bad node name {name!r}")
        if type(args_raw) is not list or type(kwargs_raw) is not list:
            raise CacheFormatError(f"bad arguments of node {name}")
        args = tuple([_arg_from_json(a, env) for a in args_raw])
        kwargs = _pairs_from_json(kwargs_raw, env) if kwargs_raw else {}
        if op == "call_function":
            target = _target_from_json(target)
        elif op in ("placeholder", "get_attr"):
            if type(target) is not str:
                raise CacheFormatError(f"a {op}'s target must be a string")
        elif op == "output":
            if target is not None:
                raise CacheFormatError("the output node's target must be null")
            target = "output"
        else:
            raise CacheFormatError(f"node op {op!r} is not cached")
        extras = entry[6] if len(entry) == 7 else {}
        if type(extras) is not dict or not extras.keys() <= _EXTRAS.get(op, frozenset()):
            raise CacheFormatError(f"bad extras of node {name}")
        node = add_node(graph, op, target, args, kwargs, name)
        if node.name != name:
            raise CacheFormatError(f"node name {name!r} is not a valid identifier")
        if op == "call_function" or op == "placeholder":
            values.set_value(node, val)
        elif val is not None:
            raise CacheFormatError(f"a {op} node has no value")
        if op == "placeholder" and "static" in extras:
            static = extras["static"]
            if not isinstance(static, bool):
                raise CacheFormatError(f"bad static flag of input {name}")
            put_meta(node, _STATIC_INPUT_KEY, static)
        elif op == "output":
            output_stamp_from_json(node, extras)
        if "desc" in extras:  # See Note [Graph descriptors] in aotkit_schemas
            _descriptor_from_json(node, extras["desc"])
        env[name] = node
    # See Note [Higher-order operators in the on-disk cache]
    owner = owner_from_json(
        d.get("subgraphs"), lambda sub: graph_from_json(sub, fake_mode, symbols)
    )
    # See Note [Tensor constants in the on-disk cache]
    constants = attach_constants(owner, d.get("constants"), is_attribute_name)
    check_subgraph_reads(graph, owner, constants)
    # no ``graph.lint()``: what it checks holds by construction (every node is this
    # graph's, an argument is read from ``env``, which holds only earlier nodes of this
    # graph, names are checked unique above, ops are the four read here, and
    # ``check_subgraph_reads`` checks every ``get_attr`` target)
    # lazy: FX code is generated on first use (nop reads only the graph)
    with _use_lazy_graph_module(True):
        return _make_graph_module(owner, graph)


def _descriptor_from_json(node: torch.fx.Node, raw: Any) -> None:
    try:
        if node.op == "output":
            if type(raw) is not list:
                raise ValueError("the output's descriptors must be a list")
            desc: Any = [descriptor_from_json(x) for x in raw]
        else:
            desc = descriptor_from_json(raw)
    except ValueError as e:
        raise CacheFormatError(f"bad descriptor of node {node.name}: {e}") from e
    # not node.meta[...] = ...: that would build the deferred value (See Note [Lazy node
    # values of restored graphs])
    put_meta(node, "desc", desc)

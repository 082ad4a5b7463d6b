"""Higher-order operators in the on-disk cache: their targets, their subgraphs and the
arguments only they take, in the entry's structured graph form.

# Note [Higher-order operators in the on-disk cache]
# A forward, backward or inference graph may call higher-order operators (See Note
# [Higher-order operators]): ``cond``, ``while_loop``, ``invoke_subgraph`` (torch's
# ``nested_compile_region``, compiled once per region and called per use), ``map``,
# ``scan``, ``flex_attention``, ``auto_functionalized`` (a custom op that mutates its
# inputs), ``with_effects`` (See Note [Effect tokens in the on-disk cache]). Their functions are ``get_attr`` nodes naming FX subgraphs of the graph module.
# The entry stores them in the same safe form as the graphs themselves:
#   * a graph's JSON gains ``"subgraphs": {name: <graph JSON>}``, one per ``get_attr``
#     target (a subgraph may have subgraphs of its own), each with its nodes' values;
#   * a HOP target is ``"hop:<name>"``, looked up in torch's HOP registry by a name from a
#     closed list (the ones above and their backward forms): no other HOP is stored, and
#     a stored name outside the list is refused on read. HOPs that carry process-local
#     state are not in the list: a Triton kernel's side-table index
#     (``triton_kernel_wrapper_*``), ``graphsafe_run_with_rng_state``'s index into the
#     graph's registered generators, a Python callable (``invoke_leaf_function``,
#     ``flat_apply``, ``autograd_function_apply``, ``custom_function_call``), a TorchBind
#     object (``call_torchbind``), a quantization scheme object (``invoke_quant*``); nor
#     the export-only ones (``strict_mode``, ``*_call_delegate``, ``_export_tracepoint``).
#     The functionalized RNG's state operators are in it (See Note [RNG state operators
#     in the on-disk cache]), as is ``out_dtype``;
#   * arguments only HOPs take: an ATen overload (``auto_functionalized``'s ``_mutable_op``)
#     by its qualified name, read back through ``torch.ops`` as node targets are; a dict
#     with string keys (``flex_attention``'s kernel options).
# Reading rejects (CacheFormatError: logged, compiled again) a ``get_attr`` that names no
# stored subgraph or a name that is not a plain identifier, a stored subgraph no node
# reads, a subgraph with a node that reads a value no earlier node made, and a HOP call whose subgraphs take another number
# of inputs than the call passes (``cond``, ``invoke_subgraph``, ``while_loop``, ``map``,
# ``scan``). A ``get_attr`` of a tensor constant is stored apart (See Note [Tensor
# constants in the on-disk cache]); of anything else, not stored (``Uncacheable``).
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from aotkit_schemas import CacheFormatError, TensorSpec, Uncacheable, ViewAndMutationMeta
from torch._library.effects import EffectType

from ._fake_mode import FakeModeLike, resolve_fake_mode

_HOPS = frozenset({
    "cond", "while_loop", "invoke_subgraph", "map_impl", "scan", "associative_scan",
    "flex_attention", "flex_attention_backward", "auto_functionalized",
    "auto_functionalized_v2", "tag_activation_checkpoint", "wrap_with_set_grad_enabled",
    "wrap_with_autocast", "with_effects",
    # See Note [RNG state operators in the on-disk cache]
    "run_and_save_rng_state", "run_with_rng_state",
    "out_dtype",  # out_dtype(op, dtype, *args): an ATen overload and a dtype
})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,200}")
_HOP_TARGETS: dict[str, Any] = {}


# Note [RNG state operators in the on-disk cache]
# Activation checkpointing under torch.compile replays a random op in the backward with
# the forward's RNG state: the forward calls
# ``run_and_save_rng_state(aten.native_dropout.default, x, 0.5, True)``, which returns
# the generator's state (a tensor, saved for the backward) and the op's outputs, and the
# backward calls ``run_with_rng_state(state, aten.native_dropout.default, x, 0.5, True)``.
# Nothing in those calls is process-local: the op is an ATen overload (stored by name as
# any other HOP argument), the state is a graph value like any saved tensor, and the
# generator they read and set is the process's default one at run time, as in a traced
# compilation. So they are stored as the other HOPs are; a warm start draws the same
# masks as a cold one from the same seed.
# One value needs care: under dynamo's ShapeEnv the state tensor, made from the real
# generator state while tracing, is fakified with a symbolic size (a fresh symbol no input
# binds, hinted with the real size), which the static form cannot store. Its size is the
# generator's state size, fixed by the device and the torch version (both keyed), so the
# entry stores the hint (``rng_state_values``): the restored graphs carry the concrete
# size where the cold ones had the symbol; nothing else in them changes. A state whose
# symbol has no hint is not stored.


def rng_state_values(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, str]:
    """The nodes of ``gm`` whose value holds an RNG state tensor: ``"pair"`` for a
    ``run_and_save_rng_state`` call (state, outputs), ``"state"`` for the state itself
    (its ``getitem``, or the backward's placeholder ``run_with_rng_state`` reads)."""
    out: dict[torch.fx.Node, str] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.HigherOrderOperator):
            continue
        name = _hop_name(node.target)
        if name == "run_and_save_rng_state":
            out[node] = "pair"
            for user in node.users:
                if user.target is operator.getitem and user.args[1] == 0:
                    out[user] = "state"
        elif name == "run_with_rng_state" and isinstance(node.args[0], torch.fx.Node):
            out[node.args[0]] = "state"
    return out


def rng_state_json(val: Any) -> dict[str, Any]:
    """An RNG state tensor's value with its sizes' hints. Raises Uncacheable."""
    if not isinstance(val, torch.Tensor):
        raise Uncacheable("an RNG state is not a tensor")
    dims = []
    for d in (*val.shape, *val.stride()):
        hint = d if type(d) is int else getattr(getattr(d, "node", None), "hint", None)
        if type(hint) is not int:
            raise Uncacheable("an RNG state's size has no hint")
        dims.append(hint)
    spec = TensorSpec(tuple(dims[: val.dim()]), tuple(dims[val.dim():]), val.dtype, val.device)
    return {"T": spec.to_json(), "rg": False}


def _hop_name(hop: torch._ops.HigherOrderOperator) -> str:
    return str(hop.name())  # type: ignore[no-untyped-call]


def hop_target_to_json(target: Any) -> str | None:
    """``"hop:<name>"`` for a HOP the entry may store; None for any other target."""
    if isinstance(target, torch._ops.HigherOrderOperator) and _hop_name(target) in _HOPS:
        return f"hop:{_hop_name(target)}"
    return None


def hop_target_from_json(name: str) -> Any:
    """The HOP ``"hop:<name>"`` names. Raises CacheFormatError."""
    known = _HOP_TARGETS.get(name)
    if known is not None:
        return known
    hop_name = name[4:]
    if hop_name not in _HOPS:
        raise CacheFormatError(f"unknown node target {name!r}")
    try:
        target = getattr(torch.ops.higher_order, hop_name)
    except (AttributeError, RuntimeError) as e:
        raise CacheFormatError(f"this torch has no higher-order operator {hop_name!r}") from e
    if not isinstance(target, torch._ops.HigherOrderOperator) or _hop_name(target) != hop_name:
        raise CacheFormatError(f"unknown node target {name!r}")
    _HOP_TARGETS[name] = target
    return target


def subgraphs_to_json(
    gm: torch.fx.GraphModule, to_json: Callable[[torch.fx.GraphModule], dict[str, Any]]
) -> dict[str, Any]:
    """The subgraphs ``gm``'s ``get_attr`` nodes read, by name, each through ``to_json``.
    Raises Uncacheable for a ``get_attr`` of anything else."""
    out: dict[str, Any] = {}
    for node in gm.graph.find_nodes(op="get_attr"):
        target = str(node.target)
        if target in out:
            continue
        sub = getattr(gm, target, None) if _NAME.fullmatch(target) else None
        if isinstance(sub, torch.Tensor):
            continue  # See Note [Tensor constants in the on-disk cache]
        if not isinstance(sub, torch.fx.GraphModule):
            raise Uncacheable(f"graph node {node.name} reads {target!r}, not an FX subgraph")
        out[target] = to_json(sub)
    return out


def owner_from_json(
    d: Any, from_json: Callable[[Any], torch.fx.GraphModule]
) -> torch.nn.Module:
    """The module a rebuilt graph's ``get_attr`` nodes read: its subgraphs rebuilt through
    ``from_json``. Raises CacheFormatError."""
    owner = torch.nn.Module()
    if d is None:
        return owner
    if not isinstance(d, dict):
        raise CacheFormatError("subgraphs must be an object")
    for name, sub in d.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name) or hasattr(owner, name):
            raise CacheFormatError(f"bad subgraph name {name!r}")
        owner.add_module(name, from_json(sub))
    return owner


def is_attribute_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def check_subgraph_reads(
    graph: torch.fx.Graph, owner: torch.nn.Module, constants: frozenset[str] = frozenset()
) -> None:
    """Every ``get_attr`` names a stored subgraph or tensor constant, every stored one is
    read, and each HOP call passes its subgraphs as many inputs as they take. Raises
    CacheFormatError. See Note [Higher-order operators in the on-disk cache] and Note
    [Tensor constants in the on-disk cache]."""
    stored = dict(owner.named_children())
    read: set[str] = set()
    for node in graph.find_nodes(op="get_attr"):
        if node.target not in stored and node.target not in constants:
            raise CacheFormatError(f"graph node {node.name} reads no stored subgraph")
        read.add(str(node.target))
    if read != set(stored) | constants:
        raise CacheFormatError("a stored subgraph or constant is read by no node")
    for node in graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
            _check_call(node, stored)


def _placeholders(arg: Any, stored: dict[str, torch.nn.Module]) -> int | None:
    if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
        sub = stored[str(arg.target)]
        assert isinstance(sub, torch.fx.GraphModule)
        return len(sub.graph.find_nodes(op="placeholder"))
    return None


def _count(x: Any) -> int:
    if not isinstance(x, (list, tuple)):
        raise CacheFormatError("a higher-order operator's operands must be a sequence")
    return len(x)


def _check_call(node: torch.fx.Node, stored: dict[str, torch.nn.Module]) -> None:
    """The subgraph inputs a HOP call passes against the ones its subgraphs take."""
    name = _hop_name(node.target) if isinstance(node.target, torch._ops.HigherOrderOperator) else ""
    args = node.args
    expected: list[tuple[Any, int]] = []
    try:
        if name == "cond":  # cond(pred, true_fn, false_fn, operands)
            n = _count(args[3])
            expected = [(args[1], n), (args[2], n)]
        elif name == "invoke_subgraph":  # invoke_subgraph(subgraph, identifier, *operands)
            expected = [(args[0], len(args) - 2)]
        elif name == "while_loop":  # while_loop(cond_fn, body_fn, carried, additional)
            n = _count(args[2]) + _count(args[3])
            expected = [(args[0], n), (args[1], n)]
        elif name == "map_impl":  # map_impl(f, xs, pos_args)
            expected = [(args[0], _count(args[1]) + _count(args[2]))]
        elif name == "scan":  # scan(combine_fn, init, xs, additional_inputs)
            expected = [(args[0], _count(args[1]) + _count(args[2]) + _count(args[3]))]
        elif name == "with_effects":  # with_effects(token, op, *args)
            if not isinstance(args[1], torch._ops.OpOverload):
                raise CacheFormatError(f"graph node {node.name} runs no operator")
    except IndexError as e:
        raise CacheFormatError(f"graph node {node.name} has too few arguments") from e
    for sub, n in expected:
        taken = _placeholders(sub, stored)
        if taken is None:
            raise CacheFormatError(f"graph node {node.name} calls no stored subgraph")
        if taken != n:
            raise CacheFormatError(
                f"graph node {node.name} passes {n} inputs to a subgraph that takes {taken}"
            )


# Note [Effect tokens in the on-disk cache]
# An entry of a program with effectful ops (See Note [Effect tokens]) stores the forward's
# effect types by name (torch's ``EffectType``, a closed enum) and the backward's token
# count, ``"tokens": {"effects": ["ORDERED"], "backward": 1}``; the graphs' ``with_effects``
# calls are HOP calls (See Note [Higher-order operators in the on-disk cache]) whose op
# argument is an ATen overload. On read, the metadata gets one empty fake token per effect
# type, as the metadata pass makes them, and the forward's leading placeholders are those
# tokens: a forward whose placeholders are not tokens plus the compiled inputs is refused.
# A token keyed by anything but an EffectType (a TorchBind object's effects) is not stored.


def tokens_to_json(meta: ViewAndMutationMeta) -> dict[str, Any] | None:
    """The entry's effect tokens (None without any). Raises Uncacheable."""
    if not meta.tokens and not meta.num_backward_tokens:
        return None
    names = []
    for k in meta.tokens:
        if not isinstance(k, EffectType):
            raise Uncacheable(f"an effect token keyed by a {type(k).__name__}")
        names.append(k.name)
    return {"effects": names, "backward": meta.num_backward_tokens}


def tokens_from_json(
    meta: ViewAndMutationMeta, d: Any, fake_mode: FakeModeLike
) -> ViewAndMutationMeta:
    """``meta`` with the stored effect tokens. Raises CacheFormatError."""
    if d is None:
        return meta
    if not isinstance(d, dict) or set(d) != {"effects", "backward"}:
        raise CacheFormatError("bad effect tokens")
    names, backward = d["effects"], d["backward"]
    if (
        not isinstance(names, list)
        or not all(isinstance(n, str) and n in EffectType.__members__ for n in names)
        or len(set(names)) != len(names)
        or type(backward) is not int
        or backward < 0
    ):
        raise CacheFormatError("bad effect tokens")
    tokens = {}
    if names:  # See Note [A restored entry's fake mode made when first needed]
        with resolve_fake_mode(fake_mode):
            tokens = {EffectType[n]: torch.empty(0) for n in names}
    return dataclasses.replace(meta, tokens=tokens, num_backward_tokens=backward)

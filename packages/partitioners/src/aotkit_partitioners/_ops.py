"""What kind of operation a joint-graph node performs, as the min-cut cost model sees it.

# Note [Recomputation policy]
# The backward may recompute a forward node instead of receiving it from the forward only if
# recomputing it is cheap and gives the same value:
#
# * never: primal inputs, random ops (a second draw differs; but see below), ops with side effects,
#   compute-heavy ops (matmuls, convolutions, attention), ops outside the allowlist below
#   (softmax, normalisations, ...), reductions whose output is 4x smaller than their inputs
#   (the output is cheap to save, the input expensive to keep), any op that reads a
#   tensor some op mutates (a recomputation would read the mutated value), and, in the
#   min-cut, a value a backward reader cannot fuse (See Note [Values the backward must
#   materialize]);
# * allowed: pointwise ops, views, getitem, symbolic-size arithmetic, factory ops and a short
#   list of cheap data movement and reductions.
# * sizes: a size query the forward makes (``sym_size(x, 0)``, ``sym_stride``, ``sym_numel``)
#   is handed to the backward rather than asked again of a saved ``x``, as torch's
#   partitioners and our default partitioner do (saving it costs no tensor memory, so this
#   never makes a cut save more bytes). Arithmetic on sizes may still be recomputed.
#
# Activation-checkpointing tags (``meta['recompute']``) override the list: a node tagged
# MUST/PREFER_RECOMPUTE is never saved and may be recomputed even if compute-heavy, one
# tagged MUST/PREFER_SAVE is never recomputed. Tags on effectful ops are ignored (recomputing
# them would change the result): those are always saved.
#
# With functionalized RNG (the default; Note [Functionalized RNG] in aotkit_schemas) a
# random ATen op may be recomputed like a cheap op, unless it is compute-heavy itself
# (attention with dropout): the forward saves the generator state it drew from and the
# backward replays the draw from it. The min-cut charges the state's
# bytes for that (Note [Min-cut flow graph]); checkpoint tags on random ops are honoured.
# Without it random ops are never recomputed and their tags are ignored.
# ``run_and_save_rng_state`` itself is a draw and is never recomputed.
#
# The rule binds only nodes the forward must compute anyway. A tangent-free node that only
# the backward needs (``t(weight)`` feeding a gradient matmul) is not a recomputation; the
# partitioner may put it in either graph.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from functools import cache
from typing import Any

import torch
import torch.fx
from aotkit_schemas import is_sym_node
from torch._prims.rng_prims import run_and_save_rng_state
from torch.utils.checkpoint import CheckpointPolicy

from ._cost import input_bytes, node_bytes
from ._joint import is_impure

aten = torch.ops.aten
prims = torch.ops.prims


def _packets(owner: Any, names: str) -> frozenset[Any]:
    found = (getattr(owner, n, None) for n in names.split())
    return frozenset(p for p in found if p is not None)


COMPUTE_INTENSIVE = _packets(
    aten,
    "mm addmm bmm baddbmm addbmm matmul linear einsum _int_mm _scaled_mm addmv mv dot vdot "
    "convolution _convolution convolution_backward conv1d conv2d conv3d conv_transpose1d "
    "conv_transpose2d conv_transpose3d cudnn_convolution mkldnn_convolution "
    "scaled_dot_product_attention _scaled_dot_product_attention_math "
    "_scaled_dot_product_flash_attention _scaled_dot_product_flash_attention_for_cpu "
    "_scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention "
    "_flash_attention_forward _efficient_attention_forward upsample_bilinear2d "
    "_scaled_dot_product_fused_attention_overrideable",
)

RANDOM = _packets(
    aten,
    "native_dropout dropout bernoulli rand rand_like randn randn_like randint randint_like "
    "randperm normal uniform multinomial poisson exponential _fused_dropout rrelu",
)

_CHEAP = _packets(
    aten,
    "clone _to_copy to type_as copy full full_like zeros zeros_like ones ones_like empty "
    "empty_like empty_strided new_zeros new_ones new_full new_empty scalar_tensor arange "
    "lift_fresh_copy cat index gather sum mean amax amin var std var_mean _grad_sum_to_size "
    "sum_to_size triu tril argmax argmin maximum minimum broadcast_tensors reshape "
    "_unsafe_view constant_pad_nd masked_fill where fill sym_size sym_stride sym_numel "
    "sym_storage_offset any all isinf isnan threshold_backward gelu_backward "
    "silu_backward sigmoid_backward tanh_backward",
) | _packets(prims, "convert_element_type broadcast_in_dim var sum iota div")


def packet(node: torch.fx.Node) -> Any:
    """The OpOverloadPacket of an ATen node, else its target."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket
    return target


def _tags(node: torch.fx.Node) -> tuple[torch.Tag, ...]:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return tuple(target.tags)
    return ()


def is_view(node: torch.fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and bool(target.is_view)


def is_mutating(node: torch.fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and bool(target._schema.is_mutable)


def is_random(node: torch.fx.Node) -> bool:
    """An op that draws from a generator (``run_and_save_rng_state`` included)."""
    if node.target is run_and_save_rng_state:
        return True
    return packet(node) in RANDOM or torch.Tag.nondeterministic_seeded in _tags(node)


def is_replayable_random(node: torch.fx.Node) -> bool:
    """A random ATen op that ``run_with_rng_state`` can replay in the backward."""
    return (
        is_random(node) and isinstance(node.target, torch._ops.OpOverload) and not is_mutating(node)
    )


def is_compute_intensive(node: torch.fx.Node) -> bool:
    return packet(node) in COMPUTE_INTENSIVE


_SIZE_QUERIES = _packets(aten, "sym_size sym_stride sym_numel sym_storage_offset")


def is_size_query(node: torch.fx.Node) -> bool:
    """A symbolic scalar read off a tensor's metadata (``x.size(0)``, ``x.numel()``)."""
    return node.op == "call_function" and packet(node) in _SIZE_QUERIES and is_sym_node(node)


def is_pointwise(node: torch.fx.Node) -> bool:
    return torch.Tag.pointwise in _tags(node)


@cache
def _builtin_targets() -> frozenset[Callable[..., Any]]:
    return frozenset(
        getattr(operator, n)
        for n in "getitem add sub mul truediv floordiv mod neg pow eq ne lt le gt ge".split()
    )


def is_allowlisted(node: torch.fx.Node) -> bool:
    """Cheap enough to recompute, ignoring the size and mutation rules."""
    if node.op != "call_function":
        return False
    if node.target in _builtin_targets() or is_sym_node(node):
        return True
    return is_view(node) or is_pointwise(node) or packet(node) in _CHEAP


def is_shrinking_reduction(node: torch.fx.Node) -> bool:
    """The output is less than a quarter of the size of the inputs."""
    out = node_bytes(node)
    return out * 4 < input_bytes(node)


def checkpoint_policy(node: torch.fx.Node) -> CheckpointPolicy | None:
    """The activation-checkpointing policy a tracer recorded on ``node`` (``meta['recompute']``).

    torch.utils.checkpoint (selective activation checkpointing) tags the nodes of a
    checkpointed region this way; the partitioners honour the tags where it is safe.
    """
    policy = node.meta.get("recompute")
    return policy if isinstance(policy, CheckpointPolicy) else None


def must_recompute(node: torch.fx.Node) -> bool:
    """Tagged for recomputation by activation checkpointing (never saved)."""
    return checkpoint_policy(node) in (
        CheckpointPolicy.MUST_RECOMPUTE,
        CheckpointPolicy.PREFER_RECOMPUTE,
    )


def ban_reason(
    node: torch.fx.Node, reads_mutated: bool, *, functional_rng: bool = False
) -> str | None:
    """Why the backward may not recompute ``node``; None if it may.

    See Note [Recomputation policy]. A node tagged for recomputation by activation
    checkpointing may be recomputed even if compute-heavy (not if effectful, nor if random
    unless ``functional_rng``). With ``functional_rng`` a random ATen op may be recomputed:
    the backward replays the forward's draw.
    """
    if node.op == "placeholder":
        return "graph input"
    if node.op == "get_attr":
        return None  # a constant of the module: either graph can read it
    if node.op != "call_function":
        return "not a call_function"
    random = is_random(node)
    if random and not (functional_rng and is_replayable_random(node)):
        return "random op"
    if is_mutating(node) or is_impure(node, impure_random=False):
        return "side effect"
    if reads_mutated:
        return "reads a mutated tensor"
    policy = checkpoint_policy(node)
    if policy is CheckpointPolicy.MUST_SAVE:
        return "checkpoint policy MUST_SAVE"
    if policy is CheckpointPolicy.PREFER_SAVE:
        return "checkpoint policy PREFER_SAVE"
    if must_recompute(node):
        return None
    if random:
        # a replayed draw costs its op again: attention with dropout is still attention
        return "compute intensive" if is_compute_intensive(node) else None
    if is_size_query(node):
        return "size the forward computes"
    if is_compute_intensive(node):
        return "compute intensive"
    if not is_allowlisted(node):
        return "not in the recompute allowlist"
    if node.target is not operator.getitem and not is_sym_node(node):
        if not is_view(node) and is_shrinking_reduction(node):
            return "reduction"
    return None


# Note [Values the backward must materialize]
# Recomputing a forward value in the backward is taken to be free when the backward fuses
# the recomputation into the kernel that reads it. When a backward reader cannot fuse it
# (a matmul reads it, directly or through views), the recomputed value has to be written
# to memory in the backward all the same: recomputing it then costs its memory in the
# backward and its compute, and saves nothing on the forward side that the cut could not
# save otherwise. So, as torch's min-cut does by default (``ban_recompute_materialized_
# backward``), such a value is not recomputed: ``cat([expand(a), b, c])`` read by a
# backward ``mm`` through ``t`` is saved (as the view the matmul reads), not rebuilt from
# ``a``, ``b`` and ``c`` in the backward. "Fusible" here: the reader is a ``cat`` (a copy
# into a slice of its output) or both ops are on the recompute allowlist. A view itself is
# never banned by this rule (it costs nothing to rebuild). A memory budget may lift it.


def materialized_in_backward(node: torch.fx.Node, fw_required: frozenset[torch.fx.Node]) -> bool:
    """Whether a backward reader of ``node`` (through views) cannot fuse its recomputation.
    See Note [Values the backward must materialize]."""
    if is_view(node):
        return False
    seen = {node}
    todo = [node]
    while todo:
        cur = todo.pop()
        for user in cur.users:
            if user not in fw_required and not fusible(cur, user):
                return True
            if is_view(user) and user not in seen:
                seen.add(user)
                todo.append(user)
    return False


def fusible(producer: torch.fx.Node, reader: torch.fx.Node) -> bool:
    """Whether a fusing compiler can compute ``producer`` inside ``reader``'s kernel (both
    on the recompute allowlist, or a ``cat`` reader), as torch's min-cut judges it."""
    if packet(reader) is aten.cat:
        return True
    if reader.op == "output":
        return False
    return is_allowlisted(producer) and is_allowlisted(reader)


def mutated_readers(nodes: list[torch.fx.Node]) -> set[torch.fx.Node]:
    """Nodes that read a tensor which some op mutates (or are that tensor).

    Storage is tracked through views: a view shares its base's storage, an in-place op's
    result is its mutated argument. Functional graphs (the normal case) give an empty set.
    """
    if not any(is_mutating(n) for n in nodes):
        return set()
    parent: dict[torch.fx.Node, torch.fx.Node] = {}

    def find(n: torch.fx.Node) -> torch.fx.Node:
        while parent.get(n, n) is not n:
            n = parent[n]
        return n

    mutated: list[torch.fx.Node] = []
    for node in nodes:
        if node.op != "call_function":
            continue
        tensor_args = [a for a in node.args if isinstance(a, torch.fx.Node)]
        if is_view(node) and tensor_args:
            parent[find(node)] = find(tensor_args[0])
        if is_mutating(node) and tensor_args:
            mutated.extend(tensor_args)
            parent[find(node)] = find(tensor_args[0])
    if not mutated:
        return set()
    roots = {find(m) for m in mutated}
    in_group = {n for n in nodes if find(n) in roots}
    readers = set(in_group)
    for n in in_group:
        readers.update(n.users)
    return readers

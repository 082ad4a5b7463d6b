"""Functionalized RNG in the partitioners: random ops the backward recomputes replay the
forward's draw. See Note [Functionalized RNG] in ``aotkit_schemas``.
"""

from __future__ import annotations

import operator
from functools import cache
from typing import Any, cast

import torch
import torch.fx
from aotkit_schemas import functionalize_rng_enabled, graph_outputs, is_sym_node
from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

from ._ops import is_random

__all__ = ["functional_rng", "replay_recomputed_rng_inplace", "rng_state_bytes"]

# Bytes charged for an RNG state on a device whose generator we cannot ask (no such device
# here): more than a CUDA state (16 bytes of philox seed and offset, 816 with the header).
_UNKNOWN_STATE_BYTES = 8192


def functional_rng(flag: bool | None) -> bool:
    """A partitioner's ``functionalize_rng`` argument, or the global switch when None."""
    return functionalize_rng_enabled() if flag is None else bool(flag)


def _device(node: torch.fx.Node) -> torch.device:
    val = node.meta.get("val")
    values = val if isinstance(val, (tuple, list)) else (val,)
    for v in values:
        if isinstance(v, torch.Tensor):
            return v.device
    return torch.device("cpu")


@cache
def _state_bytes_on(device_type: str) -> int:
    if device_type == "cpu":
        return int(torch.get_rng_state().numel())
    module = getattr(torch, device_type, None)
    getter = getattr(module, "get_rng_state", None)
    try:
        return int(getter().numel()) if getter is not None else _UNKNOWN_STATE_BYTES
    except Exception:  # the device's runtime is not available in this process
        return _UNKNOWN_STATE_BYTES


def rng_state_bytes(node: torch.fx.Node) -> int:
    """Bytes of the generator state saved when the backward recomputes random ``node``."""
    return _state_bytes_on(_device(node).type)


def _sample_state(device: torch.device, like: Any) -> torch.Tensor:
    """A value for the state node's ``meta['val']``: fake when the graph's values are."""
    if device.type == "cpu":
        state = torch.get_rng_state()
    else:
        module = getattr(torch, device.type)
        state = module.get_rng_state(device)
    fake_mode = getattr(like, "fake_mode", None)
    if fake_mode is not None:
        return fake_mode.from_tensor(state)  # type: ignore[no-any-return]
    return state


def _random_nodes(graph: torch.fx.Graph) -> dict[str, torch.fx.Node]:
    return {
        n.name: n
        for n in graph.nodes
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and is_random(n)
    }


def replay_recomputed_rng_inplace(
    fw: torch.fx.GraphModule,
    bw: torch.fx.GraphModule,
    num_fwd_outputs: int,
) -> int:
    """Make every random op that both graphs compute draw once. Modifies ``fw`` and ``bw``.

    A random op copied into both graphs (the backward recomputes it) runs in the forward
    as ``run_and_save_rng_state``; the state becomes a saved tensor (after the other saved
    tensors, before the saved symints); the backward runs its copy as
    ``run_with_rng_state`` on that state. Returns the number of ops rewritten.

    Before::

        fw: native_dropout = native_dropout(x, 0.5, True); ...; return (out, x)
        bw: native_dropout = native_dropout(x, 0.5, True); getitem_1 = native_dropout[1]

    After::

        fw: run_and_save = run_and_save_rng_state(native_dropout.default, x, 0.5, True)
            rng_state_native_dropout = run_and_save[0]; native_dropout = run_and_save[1]
            return (out, x, rng_state_native_dropout)
        bw: placeholders x, rng_state_native_dropout, tangents_1
            native_dropout = run_with_rng_state(rng_state_native_dropout,
                                                native_dropout.default, x, 0.5, True)
    """
    fw_random = _random_nodes(fw.graph)
    bw_random = _random_nodes(bw.graph)
    pairs = [(fw_random[name], node) for name, node in bw_random.items() if name in fw_random]
    if not pairs:
        return 0
    fw_out = fw.graph.find_nodes(op="output")[0]
    outputs = list(graph_outputs(fw))
    saved = outputs[num_fwd_outputs:]
    num_symints = sum(1 for v in saved if isinstance(v, torch.fx.Node) and is_sym_node(v))
    num_saved = len(saved)
    placeholders = list(bw.graph.find_nodes(op="placeholder"))
    first_tangent = placeholders[num_saved] if num_saved < len(placeholders) else None
    states: list[torch.fx.Node] = []
    for fw_node, bw_node in pairs:
        device = _device(fw_node)
        val = fw_node.meta.get("val")
        like = val[0] if isinstance(val, (tuple, list)) else val
        with fw.graph.inserting_before(fw_node):
            pair = fw.graph.create_node(
                "call_function",
                run_and_save_rng_state,
                (cast(torch.fx.node.Argument, fw_node.target), *fw_node.args),
                dict(fw_node.kwargs),
                name=f"run_and_save_{fw_node.name}",
            )
            state = fw.graph.create_node(
                "call_function", operator.getitem, (pair, 0), {}, name=f"rng_state_{fw_node.name}"
            )
            value = fw.graph.create_node("call_function", operator.getitem, (pair, 1), {})
        state.meta["val"] = _sample_state(device, like)
        pair.meta = {k: v for k, v in fw_node.meta.items() if k != "val"}
        pair.meta["val"] = (state.meta["val"], val)
        value.meta = dict(fw_node.meta)
        fw_node.replace_all_uses_with(value)
        fw.graph.erase_node(fw_node)
        states.append(state)

        if first_tangent is not None:
            ctx = bw.graph.inserting_before(first_tangent)
        elif placeholders:
            ctx = bw.graph.inserting_after(placeholders[-1])
        else:
            ctx = bw.graph.inserting_before(next(iter(bw.graph.nodes)))
        with ctx:
            bw_state = bw.graph.placeholder(state.name)
        if bw_state.name != state.name:
            raise AssertionError(f"backward already has a node named {state.name}")
        bw_state.meta = dict(state.meta)
        placeholders = list(bw.graph.find_nodes(op="placeholder"))
        with bw.graph.inserting_before(bw_node):
            replay = bw.graph.create_node(
                "call_function",
                run_with_rng_state,
                (bw_state, cast(torch.fx.node.Argument, bw_node.target), *bw_node.args),
                dict(bw_node.kwargs),
            )
        replay.meta = dict(bw_node.meta)
        bw_node.replace_all_uses_with(replay)
        bw.graph.erase_node(bw_node)

    cut = len(outputs) - num_symints
    new_outputs = tuple(outputs[:cut]) + tuple(states) + tuple(outputs[cut:])
    with fw.graph.inserting_before(fw_out):
        fw.graph.output(new_outputs)
    fw.graph.erase_node(fw_out)
    fw.graph.lint()
    bw.graph.lint()
    fw.recompile()
    bw.recompile()
    return len(pairs)

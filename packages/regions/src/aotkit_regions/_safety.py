"""Which regions may be shared without changing what the program computes.

# Note [Regions that are not shared]
# A shared region runs as ``invoke_subgraph``: one traced subgraph for all repeats, whose
# inputs are its operands and whose outputs are fresh tensors. That is eager's program only
# when the region is a pure function of its tensor inputs, so a region is refused (and the
# ``regions`` log says why, in one sentence) when it
#   * mutates a tensor (an in-place method, ``out=``/``inplace=True``, ``setitem``,
#     an augmented assignment), or reads a module buffer (BatchNorm's running
#     statistics, which it may update): invoke_subgraph does not allow input mutations;
#   * draws random numbers (dropout with p > 0 in training, ``rand*``, ``bernoulli``):
#     eager draws a new sample per layer, and aotkit's RNG replay keys do not reach
#     inside a subgraph (Note [Higher-order operators] in aotkit_tracing);
#   * calls an effectful op (an op registered with ``_register_effectful_op``);
#   * returns a view of an input, or two outputs that share memory (aliasing that the
#     subgraph boundary would lose), or a non-tensor value;
#   * changes grad mode or autocast, calls a submodule or reads a graph attribute;
#   * holds a higher-order operator: a nested region (``invoke_subgraph``), a
#     checkpointed block (``tag_activation_checkpoint``), ``cond``, ``flex_attention``;
#   * runs a module hook (dynamo inlines its ops into the module's region).
# Mutating an input that code outside the region reads is one of the mutations above. A
# region whose signature differs from every other (another shape, another config, its
# own hook) is not refused: it has no repeat and stays inline, compiled on its own.
"""

from __future__ import annotations

import operator
import re
from typing import Any

import torch
import torch._ops
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

from ._find import Region, target_name

__all__ = ["refusal"]

_RNG = re.compile(
    r"(^|\.)(dropout|dropout1d|dropout2d|dropout3d|alpha_dropout|feature_alpha_dropout|"
    r"native_dropout|bernoulli_?|rand|randn|randint|randperm|rand_like|randn_like|"
    r"randint_like|normal_?|multinomial|uniform_|exponential_|geometric_|cauchy_|"
    r"log_normal_|random_|rrelu_?|poisson|gumbel_softmax)$"
)
_STATE = re.compile(r"(set_grad_enabled|autocast|inference_mode|enable_grad|no_grad|"
                    r"_set_deterministic|set_default_dtype|manual_seed|set_rng_state)")
_INPLACE_OPERATORS = {
    operator.setitem, operator.delitem, operator.iadd, operator.isub, operator.imul,
    operator.itruediv, operator.ifloordiv, operator.imod, operator.ipow, operator.iand,
    operator.ior, operator.ixor, operator.ilshift, operator.irshift, operator.imatmul,
}
_HOOK_RESULT = re.compile(r"^(hook_result|args_result|args_kwargs_result|bw_hook)(_\d+)?$")


def _dropout_is_identity(n: torch.fx.Node) -> bool:
    """``dropout(x, p, training)`` with p == 0 or training False draws nothing."""
    p = n.kwargs.get("p", n.args[1] if len(n.args) > 1 else 0.5)
    training = n.kwargs.get("training", n.args[2] if len(n.args) > 2 else True)
    return training is False or (isinstance(p, (int, float)) and p == 0)


def _storage(v: Any) -> Any:
    if not isinstance(v, torch.Tensor):
        return None
    try:
        return StorageWeakRef(v.untyped_storage())  # type: ignore[no-untyped-call]
    except Exception:  # a tensor without storage (sparse): cannot alias-check it
        return "unknown"


def _node_refusal(n: torch.fx.Node) -> str | None:
    name = target_name(n)
    short = name.rsplit(".", 1)[-1]
    if n.op == "call_module":
        return f"it calls the submodule {n.target} (call_module)"
    if n.op == "get_attr":
        return f"it reads the graph attribute {n.target}"
    if _HOOK_RESULT.match(n.name):
        return "a module hook runs inside it"
    target = n.target
    if isinstance(target, torch._ops.HigherOrderOperator):
        hop = str(target._name)
        if hop == "tag_activation_checkpoint":
            return "it holds a checkpointed block (torch.utils.checkpoint)"
        return f"it holds the higher-order operator {hop}"
    if _STATE.search(name):
        return f"it changes grad mode or autocast ({short})"
    if _RNG.search(name) and not ("dropout" in short and _dropout_is_identity(n)):
        return f"it draws random numbers ({short})"
    if "batch_norm" in short or "instance_norm" in short:
        return f"it may update running statistics ({short})"
    if target in _INPLACE_OPERATORS:
        return f"it mutates a tensor in place ({short})"
    if isinstance(target, str) and target.endswith("_") and not target.endswith("__"):
        return f"it mutates a tensor in place (Tensor.{target})"
    if short.endswith("_") and not short.endswith("__"):
        return f"it mutates a tensor in place ({short})"
    if n.kwargs.get("inplace") is True:
        return f"it mutates a tensor in place ({short}, inplace=True)"
    if "out" in n.kwargs:
        return f"it writes an out= tensor ({short})"
    if isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        from torch._higher_order_ops.effects import _get_effect

        overload = target if isinstance(target, torch._ops.OpOverload) else target.default
        if _get_effect(overload) is not None:
            return f"it calls the effectful operator {short}"
    return None


def refusal(region: Region) -> str | None:
    """Why ``region`` must not be shared, or None. See Note [Regions that are not shared].
    ``region`` is bound (``Region.bind``)."""
    for inp in region.inputs:
        if inp.op == "placeholder" and "_buffers_" in inp.name:
            return f"it reads a module buffer ({inp.target})"
    for n in region.nodes:  # the whole span, interleaved nodes included
        reason = _node_refusal(n)
        if reason is not None:
            return reason
    if not region.contiguous:
        return "other operations are interleaved with its own"
    if not region.outputs:
        return "nothing outside reads what it computes"
    for inp in region.inputs:
        if not isinstance(inp.meta.get("example_value"), torch.Tensor):
            return f"it reads a non-tensor value ({inp.name})"
    inputs = {_storage(i.meta.get("example_value")) for i in region.inputs}
    seen: set[Any] = set()
    for o in region.outputs:
        ev = o.meta.get("example_value")
        if not isinstance(ev, torch.Tensor):
            return f"it returns a non-tensor value ({o.name})"
        s = _storage(ev)
        if s in inputs:
            return f"its output {o.name} aliases an input (a view)"
        if s in seen:
            return f"its outputs share memory ({o.name})"
        seen.add(s)
    return None

"""Higher-order operators (``torch.cond``, ``while_loop``, ``map``, ``invoke_subgraph``,
``flex_attention``, checkpoint) through the pipeline.

# Note [Higher-order operators]
# A higher-order operator (HOP) takes functions as arguments. torch runs each through the
# dispatcher like an op: its Python kernels trace the branch/body functions into FX
# subgraphs that the graph refers to with ``get_attr`` nodes (``true_graph_0``,
# ``body_graph_0``, ``sdpa_score0``), and its autograd kernel differentiates them into
# backward subgraphs. aotkit keeps torch's kernels and only makes its own layers let
# HOPs through. The invariants:
#   * Every aotkit TorchDispatchMode that can be on the mode stack while user code runs
#     (``EagerInplaceChecks`` in the metadata pass, the single pass's native-op gate, the
#     RNG replay keys) sets ``supports_higher_order_operators``: a HOP reaches its
#     ``__torch_dispatch__`` with the mode popped and is called again below it. A mode
#     without that flag makes torch raise "There was no rule registered for
#     HigherOrderOperator ..." for every HOP.
#   * The same modes answer ``ignore_compile_internals() -> True``. ``torch.cond``,
#     ``while_loop`` and ``nested_compile_region`` trace their functions with dynamo
#     (``_hop_compile_and_call``), and dynamo skips its frame when a mode that does not
#     ignore compile internals is active: the HOP would then get the user's raw Python
#     functions, which return bare tensors where torch's autograd kernel expects the
#     tuples of a traced subgraph (cond's backward fails with "object of type 'bool' has
#     no len()"). Ops inside a HOP body are therefore not seen by these modes: eager's
#     in-place checks do not run inside a body (torch's own HOP checks reject input
#     mutations in bodies), and random ops inside a body are not keyed for replay.
#   * A HOP needs the Python functionalization mode (torch registers its functionalization
#     rules there), so a program with one takes the two-pass flow with torch's Python
#     ``FunctionalTensorMode``; the path reason says "the higher-order operator cond needs
#     the Python functionalization mode" (Note [Why a graph took the path it took]).
#   * The graphs a compiler receives stay functional, subgraphs included: the HOP node
#     and its ``get_attr`` subgraphs are ordinary nodes to the partitioners. A HOP is not
#     in the recompute allowlist, so min-cut and the memory budget save its outputs,
#     unless activation checkpointing tagged it (a cond inside a checkpointed region is
#     recomputed in the backward, as in torch); a ``get_attr`` subgraph is read by
#     whichever graph calls it. The graph functions (aotkit_backends) call the HOP with
#     the subgraph modules, and aotkit_inductor hands graphs with subgraphs to Inductor
#     as they are, dead nodes removed (Inductor lowers flex_attention on CPU to fewer
#     outputs than the fake kernel's getitems read).
#   * ``invoke_subgraph`` (``nested_compile_region``) is the exception to "ordinary nodes":
#     its autograd kernel leaves in the joint a backward call whose subgraph is the region's
#     whole joint, and the partitioners first split every such pair at the region boundary,
#     once per distinct region (See Note [Partitioning at region boundaries] in
#     aotkit_partitioners). torch's per-identifier caches (the region's forward, its lazy
#     backward keyed on the tangents' metadata) live in dynamo's TracingContext: under
#     torch.compile each distinct region's joint is traced once.
#   * ``while_loop``'s fake kernel needs a ShapeEnv even when every shape is static (it
#     creates unbacked ints for carried values). aot_function's fake mode has none for
#     static shapes (torch's aot_function fails there with an AttributeError), so a trace
#     that fails for that reason is redone once in a fake mode that has a ShapeEnv but
#     keeps static shapes: no size becomes symbolic and no guard is added. With
#     ``dynamic=True`` (or under dynamo) the fake mode has a ShapeEnv already.
#   * The single pass wraps leaf inputs as autograd leaves (See Note [Autocast's cast
#     cache in the trace]), which dynamo cannot fakify when ``torch.cond`` & co. trace
#     their bodies: the attempt fails inside torch's HOP module before the HOP reaches
#     the single pass's op gate. Such a failure is read as the HOP's (``hop_in_traceback``)
#     and gives the same path reason as the gate's.
#   * A HOP that torch cannot trace in a mode aotkit uses raises an error that names the
#     HOP and what to do (``UnsupportedHigherOrderOperator``), never a bare dispatcher
#     message.
#   * An effectful op (Note [Effect tokens]) inside ``torch.cond``'s branches gets the
#     graph's token threaded through the cond (See Note [Effect tokens through
#     torch.cond]). Inside another HOP's subgraph (or one the branch scan cannot see) it
#     gets a token made inside the subgraph: the traced graph holds it as a fake
#     constant, its effect is not ordered with the graph's own chain, and the graph
#     fails when it runs (an internal "Please convert all Tensors to FakeTensors"
#     assertion, or a backward that misses its token). ``check_no_effects_in_subgraphs``
#     raises at compile time instead, naming the HOP and the op
#     (``UnsupportedHigherOrderOperator``); a joint trace whose HOP backward fails for the
#     missing ``tangents_token`` raises the same error (``effects_in_subgraph_error``).
#     torch's AOTAutograd fails these programs too.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch._ops
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode

from ._errors import (
    UNSUPPORTED_HOP_MESSAGE,
    UnsupportedHigherOrderOperatorError,
    unsupported_hop_error,
)

__all__ = [
    "UNSUPPORTED_HOP_MESSAGE",
    "UnsupportedHigherOrderOperatorError",
    "check_no_effects_in_subgraphs",
    "effects_in_subgraph_error",
    "fake_mode_with_shape_env",
    "hop_in_traceback",
    "needs_shape_env",
    "retry_with_shape_env",
    "unsupported_hop_error",
]


_T = TypeVar("_T")


def needs_shape_env(e: BaseException) -> bool:
    """Whether a trace failed only because a HOP's fake kernel (``while_loop``) needs a
    ShapeEnv on a static fake mode. See Note [Higher-order operators]."""
    text = str(e)
    return (isinstance(e, AttributeError) and "ignore_fresh_unbacked_symbols" in text) or (
        "Must provide a fake_mode with shape_env" in text
    )


def fake_mode_with_shape_env() -> FakeTensorMode:
    """A fake mode with a ShapeEnv for unbacked values but static input shapes."""
    # symbolic_shapes imports sympy: See Note [Import cost] in aotkit_frontends
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return FakeTensorMode(
        shape_env=ShapeEnv(duck_shape=False), static_shapes=True, allow_non_fake_inputs=False
    )


_HOP_MODULE = "torch._higher_order_ops."


def hop_in_traceback(e: BaseException) -> str | None:
    """The name of the higher-order operator whose Python code ``e`` (or an exception it
    was raised from) passed through, or None. See Note [Higher-order operators]."""
    seen: set[int] = set()
    err: BaseException | None = e
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        tb = err.__traceback__
        while tb is not None:
            module = tb.tb_frame.f_globals.get("__name__", "")
            if isinstance(module, str) and module.startswith(_HOP_MODULE):
                return module[len(_HOP_MODULE) :].split(".")[0]
            tb = tb.tb_next
        err = err.__cause__ or err.__context__
    return None


def retry_with_shape_env(
    compile_in: Callable[[FakeTensorMode, Any], _T], fake_mode: FakeTensorMode, shape_env: Any
) -> _T:
    """``compile_in(fake_mode, shape_env)``; if it fails only because a HOP needs a ShapeEnv
    on a static fake mode, once more in a static fake mode that has one (and no guards).
    See Note [Higher-order operators]."""
    try:
        return compile_in(fake_mode, shape_env)
    except Exception as e:
        if fake_mode.shape_env is not None or not needs_shape_env(e):
            raise
    return compile_in(fake_mode_with_shape_env(), None)


EFFECT_IN_SUBGRAPH_MESSAGE = (
    "aotkit cannot compile {what} inside the higher-order operator {hop}: effect tokens, "
    "which keep effectful operators in program order, are not threaded through {hop}'s "
    "subgraphs (See Note [Higher-order operators]). Remedy: move the effectful call out "
    "of {hop} (for example, call it on the branch's result, selected with torch.where), "
    "or run this function eagerly."
)


def _threaded_token(token: Any) -> bool:
    """Whether a subgraph's ``with_effects`` token is threaded in: the subgraph's own
    placeholder, or the chain from it. See Note [Effect tokens through torch.cond]."""
    while isinstance(token, torch.fx.Node):
        if token.op == "placeholder":
            return True
        if token.op != "call_function" or token.target is not operator.getitem:
            return False
        source = token.args[0]
        if not (isinstance(source, torch.fx.Node) and token.args[1] == 0):
            return False
        if source.target is not torch.ops.higher_order.with_effects:
            return False
        token = source.args[0]
    return False


def check_no_effects_in_subgraphs(gm: torch.fx.GraphModule) -> None:
    """Raise UnsupportedHigherOrderOperatorError for an effectful op traced inside a HOP's
    subgraph whose token is not threaded through the HOP. See Note [Higher-order
    operators] and Note [Effect tokens through torch.cond]."""
    with_effects = torch.ops.higher_order.with_effects
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.HigherOrderOperator):
            continue
        if node.target is with_effects:
            continue
        for arg in node.all_input_nodes:
            if arg.op != "get_attr":
                continue
            sub = getattr(gm, str(arg.target), None)
            if not isinstance(sub, torch.fx.GraphModule):
                continue
            for inner in sub.graph.nodes:
                if (
                    inner.op == "call_function"
                    and inner.target is with_effects
                    and not _threaded_token(inner.args[0])
                ):
                    hop = f"torch.ops.higher_order.{node.target._name}"
                    raise UnsupportedHigherOrderOperatorError(
                        EFFECT_IN_SUBGRAPH_MESSAGE.format(
                            what=f"the effectful operator {inner.args[1]}", hop=hop
                        ),
                        hop,
                    )
            check_no_effects_in_subgraphs(sub)


def effects_in_subgraph_error(e: BaseException) -> UnsupportedHigherOrderOperatorError | None:
    """The error of an effectful op inside a HOP, for a joint trace that failed because a
    HOP's backward subgraph lacked its token. See Note [Higher-order operators]."""
    if not (isinstance(e, TypeError) and "'tangents_token'" in str(e)):
        return None
    hop = next((h for h in (hop_in_traceback(e),) if h is not None), "a higher-order operator")
    return UnsupportedHigherOrderOperatorError(
        EFFECT_IN_SUBGRAPH_MESSAGE.format(what="an effectful operator", hop=hop), hop
    )

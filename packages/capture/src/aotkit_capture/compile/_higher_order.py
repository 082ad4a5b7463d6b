"""The recompute of Note [Higher-order gradients through compiled code] (aotkit_runtime):
what a program's traces tell about it, and the pruned forward graph it runs.

# Note [Programs whose backward is not the forward's derivative]
# The recompute differentiates the forward graph's ATen ops with eager autograd. That is
# the traced backward only when the traced backward is autograd's derivative of the
# forward's ops. Not so, and then a backward with create_graph=True keeps its error node,
# with the reason (See Note [Gradients made with create_graph=True] in aotkit_runtime):
#   * a custom autograd.Function (its backward is the user's, not the derivative of what
#     its forward computes: a straight-through estimator's rounding has a zero
#     derivative), found as a node of the forward's autograd graph when each trace's
#     forward returns. torch's own helper Functions whose backward is the derivative are
#     let through: non-reentrant checkpoint's ``_NoopSaveInputs`` and the Functions of
#     ``torch.library`` custom ops with ``register_autograd`` (the op stays one node of the
#     forward graph and eager autograd runs the registered backward when it runs again);
#   * a hook on a tensor (``y.register_hook(lambda g: g * 2)``), seen by a
#     TorchFunctionMode around the traced function;
#   * what the forward graph can't run again as eager would: an effectful op or a
#     higher-order operator between the inputs that require grad and a differentiable
#     output; an input the function mutates (its value at the forward is gone when the
#     backward runs), unless only the running statistics of a training-mode batch norm
#     read it (they don't reach the normalized output);
#   * random numbers drawn by a forward compiled by anything but a compiler that runs the
#     graph's ATen ops as they are (nop, aotkit_eager): Inductor's kernels draw from their
#     own streams, which replaying the generator's state under ATen would not reproduce;
#   * tensor subclasses (their graphs run on the inner tensors; see _subclass_calls).
# The flag is found by every trace and stored with the on-disk cache's entry
# (``higher_order_blocked``); an entry stored without it is restored blocked.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx
from aotkit_runtime import HigherOrder
from aotkit_schemas import ViewAndMutationMeta
from torch._prims.rng_prims import run_and_save_rng_state
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.overrides import TorchFunctionMode

_HOOK_METHODS = frozenset({torch.Tensor.register_hook})
# torch's own Functions whose backward is the derivative of their forward's ops
_DERIVATIVE_FUNCTIONS = ("_NoopSaveInputs",)
_CUSTOM_OP_FUNCTION_PREFIX = "GeneratedBackwardFor_"
_BN_FUNCTIONAL = torch.ops.aten._native_batch_norm_legit_functional.default


class BackwardRewrites:
    """What the traces of one compilation saw that makes its backward differ from the
    derivative of its forward's ops. See Note [Programs whose backward is not the
    forward's derivative]."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def note(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def watching(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, watched: hooks it registers, custom Functions its outputs come from."""

        def watched(*args: Any) -> Any:
            with _HookWatch(self):
                out = fn(*args)
            self._walk(out)
            return out

        return watched

    def _walk(self, out: Any) -> None:
        if self.reason is not None:
            return
        values = out if isinstance(out, (tuple, list)) else (out,)
        stack: list[Any] = [
            v.grad_fn for v in values if isinstance(v, torch.Tensor) and v.grad_fn is not None
        ]
        seen: set[int] = set()
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, torch.autograd.function.BackwardCFunction):
                name = type(node).__name__.removesuffix("Backward")
                if name not in _DERIVATIVE_FUNCTIONS and not name.startswith(
                    _CUSTOM_OP_FUNCTION_PREFIX
                ):
                    self.note(f"the program applies the custom autograd.Function {name}")
                    return
            stack.extend(fn for fn, _ in node.next_functions)


class _HookWatch(TorchFunctionMode):
    def __init__(self, rewrites: BackwardRewrites) -> None:
        super().__init__()
        self.rewrites = rewrites

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        if func in _HOOK_METHODS:
            self.rewrites.note("the program registers a hook on a tensor")
        return func(*args, **(kwargs or {}))


_current: list[BackwardRewrites] = []


@contextlib.contextmanager
def recording_backward_rewrites() -> Iterator[BackwardRewrites]:
    """The record the traces of this compilation fill; See ``current_rewrites``."""
    record = BackwardRewrites()
    _current.append(record)
    try:
        yield record
    finally:
        _current.pop()


def current_rewrites() -> BackwardRewrites | None:
    return _current[-1] if _current else None


def _draws(node: torch.fx.Node) -> bool:
    target = node.target
    if target is run_and_save_rng_state:
        return True
    return isinstance(target, torch._ops.OpOverload) and (
        torch.Tag.nondeterministic_seeded in target.tags
    )


def _run_and_save_plain(op: Any, *args: Any, **kwargs: Any) -> tuple[None, Any]:
    """``run_and_save_rng_state`` for the recompute: the generator is already set to the
    forward's state, so the op draws the forward's numbers; autograd records it."""
    return None, op(*args, **kwargs)


def higher_order_plan(
    fw_module: torch.fx.GraphModule,
    meta: ViewAndMutationMeta,
    num_tokens: int,
    num_saved_tensors: int,
    blocked: str | None,
    copy_now: bool,
    trust_saved_inputs: bool,
) -> HigherOrder | str:
    """The recompute of ``fw_module`` (See Note [Higher-order gradients through compiled
    code] in aotkit_runtime), or why there is none. ``copy_now``: the compiler may change
    the graph, so the pruned graph is copied before it runs; ``trust_saved_inputs``: the
    compiler runs the graph's ATen ops as they are (nop): the compiled forward saves the
    inputs the graph saves as those tensors, and draws what the graph's random ops draw."""
    if blocked is not None:
        return blocked
    graph = fw_module.graph
    out_node = graph.output_node()
    outs = out_node.args[0]
    assert isinstance(outs, (tuple, list))
    n_returns = meta.num_forward_returns
    targets = [outs[num_tokens + p] for p in meta.tangent_indices]
    placeholders = list(graph.find_nodes(op="placeholder"))
    if len(placeholders) - num_tokens != len(meta.input_info):
        return "the forward graph's inputs are not the function's inputs one to one"
    # ancestors of the differentiable returns, and every random op (the draws stay in order)
    keep: set[torch.fx.Node] = set()
    stack = [t for t in targets if isinstance(t, torch.fx.Node)]
    stack += [n for n in graph.nodes if n.op == "call_function" and _draws(n)]
    while stack:
        n = stack.pop()
        if n in keep:
            continue
        keep.add(n)
        stack.extend(n.all_input_nodes)
    requiring = {
        p for k, p in enumerate(placeholders[num_tokens:]) if meta.input_info[k].requires_grad
    }
    reason = _not_rerunnable(graph, keep, requiring, placeholders[num_tokens:], meta)
    if reason is not None:
        return reason
    # a running stat's value does not matter (the function changes it): not checked
    needed = [
        k for k, p in enumerate(placeholders[num_tokens:])
        if p in keep and not _mutated(meta, k)
    ]
    saved = {
        n for n in outs[num_tokens + n_returns : num_tokens + n_returns + num_saved_tensors]
        if isinstance(n, torch.fx.Node) and n.op == "placeholder"
    }
    versioned = tuple(
        k for k in needed
        if not (trust_saved_inputs and placeholders[num_tokens + k] in saved)
    )
    random = [n for n in graph.nodes if n.op == "call_function" and _draws(n)]
    if random and not trust_saved_inputs:
        # See Note [Programs whose backward is not the forward's derivative]
        return (
            "the forward draws random numbers and its compiler may draw them its own way "
            "(Inductor's kernels do), so the recompute can't replay them"
        )
    devices = tuple(
        {torch.device(d) for n in random if (d := n.kwargs.get("device")) is not None}
    )

    def build() -> Callable[..., Sequence[Any]]:
        return _pruned_module(fw_module, graph, keep, targets)

    if copy_now:
        built = build()

        def module() -> Callable[..., Sequence[Any]]:
            return built
    else:
        module = build
    return HigherOrder(
        module=module,
        num_tokens=num_tokens,
        versioned=versioned,
        draws=bool(random),
        rng_devices=devices,
    )


def _not_rerunnable(
    graph: torch.fx.Graph,
    keep: set[torch.fx.Node],
    requiring: set[torch.fx.Node],
    inputs: Sequence[torch.fx.Node],
    meta: ViewAndMutationMeta,
) -> str | None:
    """Why the kept part of the forward graph can't run again as eager would (See Note
    [Programs whose backward is not the forward's derivative]), or None."""
    tainted = set(requiring)
    for n in graph.nodes:
        if n not in keep or n.op != "call_function":
            continue
        if any(a in tainted for a in n.all_input_nodes):
            tainted.add(n)
            target = n.target
            if isinstance(target, torch._ops.HigherOrderOperator) and target is not (
                run_and_save_rng_state
            ):
                return f"the forward graph calls the higher-order operator {_hop_name(target)}"
        if _hop_name(n.target) == "with_effects":
            return "the forward graph calls an effectful op, which would run again"
    for k, p in enumerate(inputs):
        if p not in keep or not _mutated(meta, k):
            continue
        if all(_reads_running_stat(u, p, keep) for u in p.users if u in keep):
            continue  # See Note [Programs whose backward is not the forward's derivative]
        return f"the function mutates its input {k} in place"
    return None


def _hop_name(target: Any) -> str:
    return str(getattr(target, "_name", getattr(target, "__name__", "")))


def _mutated(meta: ViewAndMutationMeta, k: int) -> bool:
    info = meta.input_info[k]
    return bool(info.mutates_data or info.mutates_metadata or info.mutates_storage_metadata)


def _reads_running_stat(user: torch.fx.Node, p: torch.fx.Node, keep: set[torch.fx.Node]) -> bool:
    """Whether ``user`` reads ``p`` only as a training-mode batch norm's running stat."""
    if user.target is not _BN_FUNCTIONAL:
        return False
    args = list(user.args)
    training = args[5] if len(args) > 5 else user.kwargs.get("training")
    if training is not True:
        return False
    stats = {i for i, a in enumerate(args) if a is p}
    if not stats or not stats <= {3, 4}:
        return False
    # only the normalized output and the saved statistics may be read: not the new stats
    return all(
        u.target is operator.getitem and u.args[1] in (0, 1, 2) for u in user.users if u in keep
    )


def _pruned_module(
    fw_module: torch.fx.GraphModule,
    graph: torch.fx.Graph,
    keep: set[torch.fx.Node],
    targets: Sequence[Any],
) -> torch.fx.GraphModule:
    new = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in graph.nodes:
        if n.op == "placeholder":
            env[n] = new.placeholder(n.name)
        elif n in keep:
            copied = new.node_copy(n, env.__getitem__)
            if n.target is run_and_save_rng_state:
                copied.target = _run_and_save_plain
            env[n] = copied
    new.output(tuple(env[t] if isinstance(t, torch.fx.Node) else t for t in targets))
    # its Python code generated at the first call (a program that never asks for a graph
    # never pays for it)
    return _LazyGraphModule(fw_module, new)

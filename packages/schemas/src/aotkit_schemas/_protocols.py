"""The seams between aotkit packages: compilers, partitioners and their results.

# Note [Joint graph calling convention]
# A joint graph is traced from ``joint(primals, tangents)``; its placeholders are named
# ``primals_1 .. primals_N`` and ``tangents_1 .. tangents_M`` (make_fx derives the names from
# the two argument names). It returns one flat list:
#
#     (*forward_returns, *input_grads)
#
# where ``forward_returns`` are the ``num_fwd_outputs`` values of
# Note [Forward graph calling convention] (updated inputs, user outputs, intermediate bases)
# and ``input_grads`` holds one entry per primal: a gradient node, or None for a primal that
# does not require grad.
#
# A partitioner splits it into
#   forward:  primals                           -> (*forward_returns, *saved_tensors, *saved_symints)
#   backward: (*saved_symints, *saved_tensors, *tangents) -> input_grads
# A partitioner never changes ``forward_returns`` or the order of the primals or tangents.
#
# A primal whose placeholder carries ``meta[RUNTIME_MUTATED_INPUT_KEY] = True`` is mutated
# by the runtime epilogue after the forward ran (a data mutation copied back into the
# caller's tensor), so a partitioner must not save it for the backward: the backward would
# see the mutated value (and autograd's version check fails). Same key as torch's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
import torch.fx

CompiledGraph = Callable[..., Any]
# See Note [Joint graph calling convention]
RUNTIME_MUTATED_INPUT_KEY = "aot_runtime_epilogue_input_mutation"
DecompositionTable = dict[Any, Callable[..., Any]]


# Note [Boxed calling convention]
# A compiled graph may be "boxed": it carries ``_boxed_call = True`` and is called as
# ``compiled(args)`` with a single ``list`` of inputs instead of ``compiled(*args)``.
# Taking the list lets the callee drop its references to the inputs while it runs
# (``args.clear()``), so an input that is dead after its last use inside the graph can be
# freed early. The contract, shared with torch's AOTAutograd:
#   * the caller builds a fresh list for every call and never reads it afterwards; the
#     callee may clear it, but must not otherwise change it;
#   * the callee returns its outputs, never the list it was given;
#   * a compiler whose result lacks ``_boxed_call`` is called with ``*args``.
# A boxed callable that never clears its list may also carry ``_aotkit_unboxed``: an
# equivalent ``f(*args)``. Callers that hold the arguments as a tuple already call that and
# skip building a list (aotkit's ``nop`` sets it to the graph's ``forward``).
# It may also offer a stealing entry (``mark_stealing_entry``): a ``g(args)`` that computes
# the same outputs and clears ``args`` as soon as it has read them, dropping each input at
# its last use inside the graph. aotkit's runtime calls it for the backward graph with a
# list nothing else refers to (after releasing the autograd node's saved tensors), so the
# saved activations are freed while the backward runs, as eager autograd frees them node
# by node. It is built on first request.


def is_boxed(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` follows Note [Boxed calling convention]."""
    return getattr(fn, "_boxed_call", False) is True


_UNBOXED_ATTR = "_aotkit_unboxed"


def mark_unboxed_entry(boxed: Callable[..., Any], unboxed: Callable[..., Any]) -> None:
    """Record that ``boxed(args) == unboxed(*args)`` and ``boxed`` never clears ``args``.

    See Note [Boxed calling convention]."""
    setattr(boxed, _UNBOXED_ATTR, unboxed)


class _Lazy:
    """An entry built on first request (``mark_unboxed_entry(..., lazy=True)``)."""

    def __init__(self, make: Callable[[], Callable[..., Any]]) -> None:
        self.make = make


def mark_lazy_unboxed_entry(boxed: Callable[..., Any], make: Callable[[], Callable[..., Any]]) -> None:
    """``mark_unboxed_entry(boxed, make())``, with ``make`` called on first request."""
    setattr(boxed, _UNBOXED_ATTR, _Lazy(make))


def unboxed_entry(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """The ``f(*args)`` recorded by ``mark_unboxed_entry`` on a boxed callable, if any."""
    entry: Any = getattr(fn, _UNBOXED_ATTR, None) if is_boxed(fn) else None
    if isinstance(entry, _Lazy):
        entry = entry.make()
        setattr(fn, _UNBOXED_ATTR, entry)
    result: Callable[..., Any] | None = entry
    return result


# Note [Compilers that read only the graph]
# Building a GraphModule generates and compiles its Python code (FX codegen): a few
# milliseconds per graph, paid again by every module a partitioner builds. A compiler that
# only reads ``gm.graph`` (aotkit's ``nop`` generates its own graph function from it) can
# say so with ``mark_graph_reader``. When the forward and backward compilers (or the
# inference compiler) all do, aotkit builds the graphs they get as torch.fx's lazy
# GraphModules, as torch.compile does: the code is generated on first use (``gm.code``,
# ``gm.print_readable()``, a call), so nothing a user can observe changes.
_GRAPH_READER_ATTR = "_aotkit_reads_graph_only"


def mark_graph_reader(compiler: Callable[..., Any]) -> None:
    """Record that ``compiler`` reads only ``gm.graph``, never ``gm.code`` or
    ``gm.forward``. See Note [Compilers that read only the graph]."""
    setattr(compiler, _GRAPH_READER_ATTR, True)


def reads_graph_only(compiler: Callable[..., Any] | None) -> bool:
    """Whether ``mark_graph_reader`` was called on ``compiler``."""
    return getattr(compiler, _GRAPH_READER_ATTR, False) is True


# Note [Compilers that ignore their example inputs]
# A compiler gets the fake values of its graph's inputs as ``example_inputs``. A graph
# restored from aotkit's on-disk cache builds a node's fake value when it is first read
# (See Note [Lazy node values of restored graphs] in aotkit_cache), about 25 us each;
# a backward graph takes every saved activation as an input (compare.py's pointwise
# backward: 96), and aotkit's ``nop`` never looks at them. A compiler that never reads
# ``example_inputs`` can say so with ``mark_example_inputs_unused``; aotkit may then hand
# it a read-only ``Sequence`` that builds the same values (the same objects, in the same
# order, with the same strides) at its first access instead of a list of them. Reading it
# is still correct, only no longer free; a compiler that needs a ``list`` (``+``, appends,
# ``isinstance(.., list)``) must not be marked.
_UNUSED_EXAMPLES_ATTR = "_aotkit_example_inputs_unused"


def mark_example_inputs_unused(compiler: Callable[..., Any]) -> None:
    """Record that ``compiler`` never reads its ``example_inputs``. See Note [Compilers
    that ignore their example inputs]."""
    setattr(compiler, _UNUSED_EXAMPLES_ATTR, True)


def example_inputs_unused(compiler: Callable[..., Any] | None) -> bool:
    """Whether ``mark_example_inputs_unused`` was called on ``compiler``."""
    return getattr(compiler, _UNUSED_EXAMPLES_ATTR, False) is True


_STEALING_ATTR = "_aotkit_stealing"


def mark_stealing_entry(
    boxed: Callable[..., Any], make: Callable[[], Callable[[list[Any]], Any] | None]
) -> None:
    """Record that ``make()`` returns a ``g(args)`` equivalent to ``boxed(args)`` that
    clears ``args`` once it has read them (or None, when there is none after all). See
    Note [Boxed calling convention]."""
    setattr(boxed, _STEALING_ATTR, make)


def stealing_entry(fn: Callable[..., Any]) -> Callable[[list[Any]], Any] | None:
    """The stealing entry recorded by ``mark_stealing_entry`` on a boxed callable, built
    now, if any."""
    make = getattr(fn, _STEALING_ATTR, None) if is_boxed(fn) else None
    entry: Callable[[list[Any]], Any] | None = make() if make is not None else None
    return entry


@runtime_checkable
class Compiler(Protocol):
    """A graph compiler: torch's ``fw_compiler`` / ``bw_compiler`` convention.

    It receives an FX GraphModule of functional ATen ops and example inputs (fake or real)
    and returns a callable with the same semantics. See Note [Boxed calling convention].
    """

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], /
    ) -> CompiledGraph: ...


@runtime_checkable
class Partitioner(Protocol):
    """Splits a joint graph into forward and backward graphs.

    See Note [Joint graph calling convention].
    """

    def __call__(
        self,
        joint_module: torch.fx.GraphModule,
        joint_inputs: Sequence[Any],
        *,
        num_fwd_outputs: int,
    ) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]: ...


def is_sym_node(node: torch.fx.Node) -> bool:
    """True when ``node`` carries a Python or symbolic scalar rather than a tensor."""
    val = node.meta.get("val")
    if val is None and "example_value" in node.meta:
        val = node.meta["example_value"]
    return isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))


def output_node(gm: torch.fx.GraphModule) -> torch.fx.Node:
    node: torch.fx.Node
    for node in reversed(gm.graph.nodes):
        if node.op == "output":
            return node
    raise ValueError("graph has no output node")


def graph_outputs(gm: torch.fx.GraphModule) -> list[Any]:
    """The flat list of values a graph's output node returns."""
    out = output_node(gm).args[0]
    if isinstance(out, (list, tuple)):
        return list(out)
    return [out]


@dataclass(frozen=True)
class PartitionResult:
    """A forward/backward split as the runtime consumes it.

    See Note [Joint graph calling convention] for the order of values.
    """

    fw_module: torch.fx.GraphModule
    bw_module: torch.fx.GraphModule
    num_fwd_outputs: int
    # names of forward-graph nodes saved for backward, in forward-output order
    saved_tensor_names: tuple[str, ...]
    saved_symint_names: tuple[str, ...]
    # names of joint nodes that the backward recomputes instead of saving
    recomputed_node_names: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        n_out = len(graph_outputs(self.fw_module))
        n_saved = len(self.saved_tensor_names) + len(self.saved_symint_names)
        if n_out != self.num_fwd_outputs + n_saved:
            raise ValueError(
                f"forward graph returns {n_out} values, expected {self.num_fwd_outputs} "
                f"forward returns + {n_saved} saved values"
            )

    @property
    def num_saved_tensors(self) -> int:
        return len(self.saved_tensor_names)

    @property
    def num_saved_symints(self) -> int:
        return len(self.saved_symint_names)

    @classmethod
    def from_modules(
        cls,
        fw_module: torch.fx.GraphModule,
        bw_module: torch.fx.GraphModule,
        num_fwd_outputs: int,
        recomputed_node_names: Sequence[str] = (),
    ) -> PartitionResult:
        """Read the saved values off a forward graph that follows the convention.

        Works for any partitioner with torch's calling convention, including torch's own.
        """
        saved = graph_outputs(fw_module)[num_fwd_outputs:]
        tensors: list[str] = []
        symints: list[str] = []
        for value in saved:
            if not isinstance(value, torch.fx.Node):
                raise ValueError(f"saved value {value!r} is not a graph node")
            if is_sym_node(value):
                symints.append(value.name)
            else:
                if symints:
                    raise ValueError(
                        "saved tensors must precede saved symints in the forward outputs "
                        f"(tensor {value.name} follows symint {symints[-1]})"
                    )
                tensors.append(value.name)
        return cls(
            fw_module=fw_module,
            bw_module=bw_module,
            num_fwd_outputs=num_fwd_outputs,
            saved_tensor_names=tuple(tensors),
            saved_symint_names=tuple(symints),
            recomputed_node_names=tuple(recomputed_node_names),
        )

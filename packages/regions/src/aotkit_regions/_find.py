"""Finding the regions that repeat in a dynamo graph.

# Note [Repeated regions]
# A region is the run of operations one module instance contributes to dynamo's graph:
# the call nodes whose ``nn_module_stack`` holds that instance's path (``model.layers.3``).
# Parameters are placeholders under dynamo (inlined built-in modules), so a region reads
# its weights as inputs like any other tensor. A region qualifies only when its nodes are
# contiguous in graph order (nothing from another module is interleaved) and its inputs
# and outputs are tensors. Two regions are repeats of each other when their *signature*
# is equal, a hash of:
#   * the module's class;
#   * the metadata of every input, in the order the region first reads them: shape,
#     stride, storage offset, dtype, device, layout, requires_grad (parameters are inputs,
#     so this is "the same parameter shapes and dtypes");
#   * the op sequence: each node's kind, target (by qualified name), its arguments with
#     other nodes replaced by their position (input k / node j) and constants by value,
#     and its output's metadata;
#   * which nodes are read outside (the region's outputs), in order.
# The targets are also compared by identity before two regions share a subgraph, so that
# two functions with one qualified name never do. A size that is symbolic (dynamic
# shapes) makes the region unshareable: the signature holds only static sizes.
# Regions are chosen outermost first (a decoder layer before its attention); the regions
# inside a shared one are not considered again, the regions inside a refused one are.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

__all__ = ["Region", "RegionRefused", "module_regions", "signature"]


class RegionRefused(Exception):
    """A region cannot be shared; the message says why (one short sentence)."""


@dataclass
class Region:
    """The nodes one module instance contributes to a graph. See Note [Repeated regions]."""

    path: str
    cls: str
    depth: int
    start: int  # index of the first node among the graph's call nodes
    nodes: list[torch.fx.Node]
    contiguous: bool
    inputs: list[torch.fx.Node] = field(default_factory=list)
    outputs: list[torch.fx.Node] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.start + len(self.nodes)

    def short(self) -> str:
        return f"{self.cls.rsplit('.', 1)[-1]} at {_clean_path(self.path)}"

    def bind(self) -> None:
        """Fill ``inputs`` (outside nodes read, in order of first read) and ``outputs``
        (inside nodes read outside, in graph order)."""
        inside = set(self.nodes)
        seen: set[torch.fx.Node] = set()
        self.inputs = []
        for n in self.nodes:
            for a in n.all_input_nodes:
                if a not in inside and a not in seen:
                    seen.add(a)
                    self.inputs.append(a)
        self.outputs = [n for n in self.nodes if any(u not in inside for u in n.users)]


def _clean_path(path: str) -> str:
    """``L['self'].layers.3`` -> ``layers.3``."""
    if path.startswith("L['") and "']" in path:
        rest = path.split("']", 1)[1]
        return rest[1:] if rest.startswith(".") else rest or path
    return path


def _class_name(cls: Any) -> str:
    if isinstance(cls, type):
        return f"{cls.__module__}.{cls.__qualname__}"
    return str(cls)


def module_regions(graph: torch.fx.Graph) -> list[Region]:
    """Every module instance's region in ``graph``, outermost first (then graph order)."""
    calls = [n for n in graph.nodes if n.op not in ("placeholder", "output")]
    spans: dict[str, list[Any]] = {}  # path -> [cls, depth, first, last, count]
    for i, n in enumerate(calls):
        stack = n.meta.get("nn_module_stack") or {}
        for depth, entry in enumerate(stack.values()):
            path, cls = entry[0], entry[1]
            span = spans.get(path)
            if span is None:
                spans[path] = [cls, depth, i, i, 1]
            else:
                span[3] = i
                span[4] += 1
    regions = [
        Region(
            path, _class_name(cls), depth, first, calls[first : last + 1],
            contiguous=count == last - first + 1,
        )
        for path, (cls, depth, first, last, count) in spans.items()
    ]
    regions.sort(key=lambda r: (r.depth, r.start))
    return regions


def _tensor_meta(t: torch.Tensor) -> tuple[Any, ...]:
    sizes = (*t.shape, *t.stride(), t.storage_offset())
    if any(not isinstance(s, int) for s in sizes):
        raise RegionRefused("it has symbolic sizes (dynamic shapes)")
    return (
        "t", tuple(t.shape), tuple(t.stride()), t.storage_offset(), str(t.dtype),
        str(t.device), str(t.layout), t.requires_grad,
    )


def value_meta(n: torch.fx.Node) -> tuple[Any, ...]:
    """The metadata of the value ``n`` computes (dynamo's ``example_value``)."""
    ev = n.meta.get("example_value")
    if isinstance(ev, torch.Tensor):
        return _tensor_meta(ev)
    if isinstance(ev, (tuple, list)):
        return ("seq", *(_tensor_meta(v) if isinstance(v, torch.Tensor) else (
            _const(v, {}),) for v in ev))
    if isinstance(ev, torch.SymInt | torch.SymFloat | torch.SymBool):
        raise RegionRefused("it has symbolic sizes (dynamic shapes)")
    return ("v", _const(ev, {}))


_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
          torch.memory_format)


def _const(v: Any, local: dict[torch.fx.Node, tuple[str, int]]) -> Any:
    """``v`` (a node argument) as a hashable, process-independent value."""
    if isinstance(v, torch.fx.Node):
        if v not in local:
            raise AssertionError(f"aotkit_regions: {v} read before it is bound")
        return local[v]
    if isinstance(v, _PLAIN):
        return (type(v).__name__, repr(v))
    if isinstance(v, (tuple, list)):
        return (type(v).__name__, *(_const(x, local) for x in v))
    if isinstance(v, dict):
        return ("dict", *((k, _const(x, local)) for k, x in v.items()))
    if isinstance(v, slice):
        return ("slice", _const(v.start, local), _const(v.stop, local), _const(v.step, local))
    if v is Ellipsis:
        return ("...",)
    if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
        raise RegionRefused("it has symbolic sizes (dynamic shapes)")
    raise RegionRefused(f"it passes a constant of type {type(v).__name__} to an operation")


def target_name(n: torch.fx.Node) -> str:
    t = n.target
    if isinstance(t, str):
        return t
    module = getattr(t, "__module__", None) or ""
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or repr(t)
    return f"{module}.{name}" if module else str(name)


def signature(region: Region) -> str:
    """The hash of Note [Repeated regions]; raises RegionRefused."""
    local: dict[torch.fx.Node, tuple[str, int]] = {}
    parts: list[Any] = [region.cls]
    for k, inp in enumerate(region.inputs):
        local[inp] = ("i", k)
        parts.append(("in", value_meta(inp)))
    for j, n in enumerate(region.nodes):
        parts.append(
            (n.op, target_name(n), _const(n.args, local), _const(n.kwargs, local), value_meta(n))
        )
        local[n] = ("n", j)
    parts.append(("out", *(local[o] for o in region.outputs)))
    return hashlib.sha256(repr(parts).encode()).hexdigest()

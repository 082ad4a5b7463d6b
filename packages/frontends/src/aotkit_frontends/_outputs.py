"""Flattening user functions: pytree inputs in, graph-able output leaves out.

# Note [Output leaves]
# A user function may return any pytree. Its leaves are split at the first trace into
#   * graph leaves: tensors and symbolic scalars, returned by the compiled graph;
#   * constant leaves: Python scalars, strings, None, dtypes, devices, recorded once and
#     re-inserted at run time (they cannot depend on tensor values, or tracing would have
#     failed).
# Any other leaf type is an error that names the type and where it was found.
# A tensor returned more than once (``return v, v``) is one graph leaf; the others are
# recorded as repeats and get the very same object back at run time, as in eager.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from aotkit_schemas import CacheFormatError, Uncacheable, dtype_from_name, dtype_name

_CONSTANT_TYPES = (int, float, bool, complex, str, bytes, type(None), torch.dtype, torch.device,
                   torch.layout, torch.memory_format, torch.Size)
_GRAPH_TYPES = (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)


class UnsupportedOutputError(TypeError):
    pass


def _is_constant_size(x: Any) -> bool:
    """A torch.Size of plain ints is one constant leaf. pytree would flatten it and
    unflatten it as a plain tuple; one holding SymInts is flattened so that its symbolic
    sizes become graph leaves."""
    return type(x) is torch.Size and all(type(s) is int for s in x)


@dataclass
class OutputLayout:
    """Filled at the first trace. See Note [Output leaves]."""

    spec: pytree.TreeSpec | None = None
    num_leaves: int = 0
    graph_leaf_indices: list[int] = field(default_factory=list)
    constants: dict[int, Any] = field(default_factory=dict)
    # leaf index -> index of the earlier leaf that is the same tensor
    repeats: dict[int, int] = field(default_factory=dict)
    # fast paths for unflatten: a bare tensor, or a plain tuple of graph leaves
    single_leaf: bool = False
    flat_tuple: bool = False

    def record(self, out: Any) -> list[Any]:
        leaves, spec = pytree.tree_flatten(out, is_leaf=_is_constant_size)
        repeats = _repeated_tensors(leaves)
        if self.spec is None:
            graph_idx: list[int] = []
            constants: dict[int, Any] = {}
            paths = [
                pytree.keystr(p)
                for p, _ in pytree.tree_flatten_with_path(out, is_leaf=_is_constant_size)[0]
            ]
            for i, leaf in enumerate(leaves):
                if i in repeats:
                    continue
                if isinstance(leaf, _GRAPH_TYPES):
                    graph_idx.append(i)
                elif isinstance(leaf, _CONSTANT_TYPES):
                    constants[i] = leaf
                else:
                    raise UnsupportedOutputError(
                        f"aotkit: the function returned an unsupported value of type "
                        f"{type(leaf).__module__}.{type(leaf).__qualname__} at output{paths[i]}. "
                        "Outputs must be pytrees (tuples, lists, dicts, namedtuples, ...) whose "
                        "leaves are tensors, Python scalars, strings or None. Convert the value, "
                        "or register its type with torch.utils._pytree.register_pytree_node."
                    )
            self.spec, self.num_leaves = spec, len(leaves)
            self.graph_leaf_indices, self.constants = graph_idx, constants
            self.repeats = repeats
            simple = not constants and not repeats
            self.single_leaf = simple and spec.is_leaf()
            self.flat_tuple = (
                simple and spec == pytree.tree_flatten(tuple(range(len(leaves))))[1]
            )
        elif spec != self.spec or repeats != self.repeats:
            raise RuntimeError(
                "aotkit: the function returned a different output structure while tracing "
                f"({spec} vs {self.spec}); outputs must not depend on tracing."
            )
        return [leaves[i] for i in self.graph_leaf_indices]

    def unflatten(self, graph_outputs: Sequence[Any]) -> Any:
        if self.single_leaf:
            return graph_outputs[0]
        if self.flat_tuple:
            return tuple(graph_outputs)
        assert self.spec is not None
        if not self.constants and not self.repeats:
            return pytree.tree_unflatten(list(graph_outputs), self.spec)
        leaves: list[Any] = [None] * self.num_leaves
        for i, v in self.constants.items():
            leaves[i] = v
        for i, v in zip(self.graph_leaf_indices, graph_outputs, strict=True):
            leaves[i] = v
        for i, first in self.repeats.items():
            leaves[i] = leaves[first]
        return pytree.tree_unflatten(leaves, self.spec)


    def to_json(self) -> Any:
        """This layout as JSON data, for the on-disk cache; raises Uncacheable for a
        constant leaf without a JSON form."""
        if self.spec is None:
            raise Uncacheable("the output layout was not recorded")
        return {
            "spec": pytree.treespec_dumps(self.spec),
            "num_leaves": self.num_leaves,
            "graph": self.graph_leaf_indices,
            "constants": [[i, _constant_to_json(v)] for i, v in sorted(self.constants.items())],
            "repeats": sorted([i, j] for i, j in self.repeats.items()),
            "single_leaf": self.single_leaf,
            "flat_tuple": self.flat_tuple,
        }

    def load_json(self, d: Any) -> None:
        """Fill this layout from ``to_json``'s data; raises CacheFormatError."""
        try:
            spec = pytree.treespec_loads(d["spec"])
            graph = [int(i) for i in d["graph"]]
            constants = {int(i): _constant_from_json(v) for i, v in d["constants"]}
            repeats = {int(i): int(j) for i, j in d["repeats"]}
            num, single, flat = int(d["num_leaves"]), bool(d["single_leaf"]), bool(d["flat_tuple"])
        except (KeyError, TypeError, ValueError, NotImplementedError) as e:
            raise CacheFormatError(f"bad output layout: {e}") from e
        if spec.num_leaves != num or len(graph) + len(constants) + len(repeats) != num:
            raise CacheFormatError("the output layout's leaves do not add up")
        self.spec, self.num_leaves, self.graph_leaf_indices = spec, num, graph
        self.constants, self.repeats, self.single_leaf, self.flat_tuple = (
            constants, repeats, single, flat
        )


def _constant_to_json(v: Any) -> Any:
    if v is None or type(v) in (bool, int, str):
        return {"v": v}
    if type(v) is float:
        return {"f": v.hex()}
    if isinstance(v, torch.dtype):
        return {"dtype": dtype_name(v)}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    if type(v) is torch.Size:
        return {"size": list(v)}
    raise Uncacheable(f"output constant of type {type(v).__name__} has no cache form")


def _constant_from_json(d: Any) -> Any:
    if not isinstance(d, dict) or len(d) != 1:
        raise CacheFormatError("bad output constant")
    (tag, v), = d.items()
    if tag == "v" and (v is None or type(v) in (bool, int, str)):
        return v
    if tag == "f" and isinstance(v, str):
        return float.fromhex(v)
    if tag == "dtype" and isinstance(v, str):
        return dtype_from_name(v)
    if tag == "device" and isinstance(v, str):
        return torch.device(v)
    if tag == "size" and isinstance(v, list) and all(type(x) is int for x in v):
        return torch.Size(v)
    raise CacheFormatError("bad output constant")


def _repeated_tensors(leaves: Sequence[Any]) -> dict[int, int]:
    """Leaf index -> first index of the same tensor object, for tensors seen before."""
    first: dict[int, int] = {}
    repeats: dict[int, int] = {}
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            j = first.setdefault(id(leaf), i)
            if j != i:
                repeats[i] = j
    return repeats


def flatten_function(
    fn: Callable[..., Any], in_spec: pytree.TreeSpec, outputs: OutputLayout
) -> Callable[..., list[Any]]:
    """``flat_fn(*flat_args) -> graph leaves`` for a function of a pytree of arguments."""

    def flat_fn(*flat_args: Any) -> list[Any]:
        args, kwargs = pytree.tree_unflatten(list(flat_args), in_spec)
        return outputs.record(fn(*args, **kwargs))

    return flat_fn

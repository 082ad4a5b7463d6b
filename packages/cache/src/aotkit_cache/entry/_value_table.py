"""The value table of a graph in the on-disk cache: node values stored once per distinct
value, checked once, built per node.

# Note [The value table of a cached graph]
# A graph's JSON holds each distinct node value once, in ``"vals"`` (a list of value
# forms: ``{"T": <TensorSpec JSON>, "rg": bool}``, ``{"ST": ...}``, ``{"l": [...]}``,
# ``{"s": ...}``, ``{"si": ...}``), and a node's ``"val"`` is an index into it: a graph's
# hundreds of nodes share a few layouts (compare.py's pointwise backward: 338 nodes, 1
# value; mlp's: 47 nodes, 6 values), so a warm hit checks each distinct value once instead
# of once per node, and the entry is 20-40% smaller (less to read, hash and parse).
# Invariants:
#   * Every table entry is checked when the graph is read (See Note [Lazy node values of
#     restored graphs]), referenced or not; a ``"val"`` that is not an index into the
#     table rejects the graph.
#   * Sharing a checked recipe never shares a value: each node's value is built from it
#     on its own (a fresh fake tensor per node, as a trace makes), and a value with
#     symbolic sizes is built per node with the symbols bound at restore.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import torch
import torch.fx
from aotkit_schemas import CacheFormatError, dtype_from_name
from torch._subclasses.fake_tensor import FakeTensorMode

from aotkit_cache.key._symbolic import eval_tree

from ._fake_mode import FakeModeLike, resolve_fake_mode
from ._values import LazyValueMeta, StaticTensor, build_recipe, set_meta, static_recipe


class ValueTableWriter:
    """The value table of a graph being stored: ``ref`` gives a value form's index."""

    __slots__ = ("values", "_index")

    def __init__(self) -> None:
        self.values: list[Any] = []
        self._index: dict[str, int] = {}

    def ref(self, form: Any) -> int:
        text = json.dumps(form, sort_keys=True, separators=(",", ":"))
        i = self._index.get(text)
        if i is None:
            i = self._index[text] = len(self.values)
            self.values.append(form)
        return i


class ValueTable:
    """The checked recipes of a graph's value table, and how to give a node its value."""

    __slots__ = ("raw", "recipes", "builders", "fake_mode", "symbols")

    def __init__(
        self, raw: Any, fake_mode: FakeModeLike, symbols: dict[str, Any] | None
    ) -> None:
        if not isinstance(raw, list):
            raise CacheFormatError("a graph's value table must be a list")
        self.raw = raw
        # See Note [The value table of a cached graph]: every entry checked now
        self.recipes = [static_recipe(v) for v in raw]
        self.builders: list[Any] = [
            None if r is NotImplemented else functools.partial(build_recipe, r, fake_mode)
            for r in self.recipes
        ]
        self.fake_mode, self.symbols = fake_mode, symbols

    def index(self, i: Any, name: str) -> int:
        if type(i) is not int or not 0 <= i < len(self.raw):
            raise CacheFormatError(f"bad value of node {name}")
        return i

    def set_value(self, node: torch.fx.Node, i: Any) -> None:
        """A static value is built at first read (See Note [Lazy node values of restored
        graphs]); a symbolic one is built now."""
        i = self.index(i, node.name)
        build = self.builders[i]
        if build is None:
            mode = resolve_fake_mode(self.fake_mode)
            node.meta["val"] = value_from_json(self.raw[i], mode, self.symbols)
        else:
            set_meta(node, LazyValueMeta(build, self.recipes[i]))


def value_from_json(d: Any, fake_mode: FakeTensorMode, env: dict[str, Any] | None) -> Any:
    if not isinstance(d, dict) or len(d) not in (1, 2):
        raise CacheFormatError("bad node value")
    if "T" in d:
        return StaticTensor(d["T"], d.get("rg")).build(fake_mode)
    if "ST" in d and env is not None:
        return _symbolic_tensor(d, fake_mode, env)
    if "si" in d and env is not None:
        v = eval_tree(d["si"], env)
        if not isinstance(v, (int, torch.SymInt)) or isinstance(v, bool):
            raise CacheFormatError("a SymInt value is not an int")
        return v
    if "l" in d and isinstance(d["l"], list):
        return [value_from_json(v, fake_mode, env) for v in d["l"]]
    if "s" in d:
        return None  # a Python scalar: its value is not part of the graph's metadata
    raise CacheFormatError("bad node value")


def _symbolic_tensor(d: dict[str, Any], fake_mode: FakeTensorMode, env: dict[str, Any]) -> Any:
    spec = d["ST"]
    if not isinstance(spec, dict):
        raise CacheFormatError("bad symbolic tensor")
    size, stride = spec.get("size"), spec.get("stride")
    dtype, device = spec.get("dtype"), spec.get("device")
    if not isinstance(size, list) or not isinstance(stride, list) or len(size) != len(stride):
        raise CacheFormatError("bad symbolic tensor")
    if not isinstance(dtype, str) or not isinstance(device, str):
        raise CacheFormatError("bad symbolic tensor")
    dims = [eval_tree(x, env) for x in (*size, *stride)]
    if not all(isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool) for x in dims):
        raise CacheFormatError("a size is not an int")
    with fake_mode:
        t = torch.empty_strided(
            dims[: len(size)], dims[len(size):], dtype=dtype_from_name(dtype),
            device=torch.device(device),
        )
    if d.get("rg") is True:
        t.requires_grad_(True)
    return t

"""Node values of graphs restored from the on-disk cache, built when first read.

# Note [Lazy node values of restored graphs]
# What: a graph read back from the on-disk cache (See Note [On-disk compile cache]) gets
# the fake value of every node, as a traced graph has them. Building a fake tensor costs
# tens of microseconds, and a warm hit rebuilds hundreds of them, while a compiler that
# reads only the graph (nop) looks at the values of a few nodes (its in-place additions);
# Inductor reads them all. So a restored node with a static value gets a
# ``LazyValueMeta`` as its ``meta``: a dict whose ``"val"`` is built the first time
# anything reads the dict (any method: ``meta["val"]``, ``get``, ``in``, iteration, copy,
# ``len``, equality, writes).
# Invariants:
#   * Same values as an eager rebuild: the recipe is the one the eager path uses (a meta
#     tensor of the stored sizes, strides and dtype, made fake on the stored device in the
#     entry's fake mode, ``requires_grad`` as stored), only later.
#   * Checked eagerly, built lazily: everything that could make the build fail (the form
#     of the JSON, int sizes, non-negative sizes, a known dtype, a device string torch
#     parses, ``requires_grad`` only on floating or complex dtypes, a storage that fits in
#     64 bits) is checked while the entry is read, so a bad value still rejects the entry
#     and compiles again (never a failure later, in the compiler).
#   * Built the same wherever first read: outside the reader's dispatch and torch-function
#     modes (a compiler pass's functionalization or fake mode, a user's mode) and outside
#     inference mode, in the entry's fake mode.
#   * Values with symbolic sizes are built eagerly (they depend on the symbols bound at
#     restore and may add guards: See Note [Dynamic shapes in the on-disk cache]).
#     Placeholders' static values are deferred too. The compiled inputs' fakes (checked
#     against the call's inputs, the forward compiler's example inputs) are separate
#     values built from the forward's placeholder recipes (``fresh_value()``), as a
#     trace's fakified inputs are separate objects from its graph's placeholder values
#     (and, like those, the only ones that take the inputs' ``requires_grad``); the
#     backward's placeholder values are read when its compiler reads its example inputs
#     (nop does not: See Note [Compilers that ignore their example inputs] in
#     aotkit_schemas), or when anything else reads them.
#   * ``static_value_spec()`` answers a value's static layout from the recipe without
#     building it (See Note [Static value specs] in aotkit_schemas).
#   * A copy (``copy.copy``, ``copy.deepcopy``, ``dict(meta)``, pickling, FX's
#     ``node_copy``) builds the value first and is a plain dict.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx
from aotkit_schemas import CacheFormatError, StaticSpec, dtype_from_name, tensor_static_spec
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import _disable_current_modes

from ._fake_mode import FakeModeLike, resolve_fake_mode

_DEVICES: dict[str, torch.device] = {}
_MAX_STORAGE = 2**62


def parse_device(name: Any) -> torch.device:
    """``torch.device(name)``, parsed once per process per name."""
    dev = _DEVICES.get(name) if isinstance(name, str) else None
    if dev is None:
        if not isinstance(name, str):
            raise CacheFormatError("a device must be a string")
        try:
            dev = torch.device(name)
        except (RuntimeError, ValueError) as e:
            raise CacheFormatError(f"bad device {name!r}") from e
        _DEVICES[name] = dev
    return dev


class StaticTensor:
    """A checked recipe for the fake value of a node with static sizes."""

    __slots__ = ("shape", "stride", "dtype", "device", "requires_grad")

    def __init__(self, spec: Any, requires_grad: Any) -> None:
        if not isinstance(spec, dict):
            raise CacheFormatError("bad node value")
        shape, stride = spec.get("shape"), spec.get("stride")
        if type(shape) is not list or type(stride) is not list or len(shape) != len(stride):
            raise CacheFormatError("bad tensor sizes")
        dims = shape + stride
        if not all(type(x) is int for x in dims):
            if any(isinstance(x, str) for x in dims):
                raise CacheFormatError("symbolic sizes in a cached graph")
            raise CacheFormatError("a size must be an int")
        if dims and min(dims) < 0:
            raise CacheFormatError("a negative size or stride")
        # the storage the sizes and strides span: 1 + sum((size - 1) * stride)
        if 0 not in shape and sum(map(operator.mul, shape, stride)) - sum(stride) >= _MAX_STORAGE:
            raise CacheFormatError("a tensor larger than any storage")
        dtype = spec.get("dtype")
        if not isinstance(dtype, str):
            raise CacheFormatError("a dtype must be a string")
        self.dtype = dtype_from_name(dtype)
        device = spec.get("device")
        self.device = _DEVICES.get(device) or parse_device(device)  # type: ignore[arg-type]
        self.requires_grad = requires_grad is True
        if self.requires_grad and not (self.dtype.is_floating_point or self.dtype.is_complex):
            raise CacheFormatError(f"a {dtype} value that requires grad")
        self.shape, self.stride = shape, stride

    def build(self, fake_mode: FakeTensorMode) -> torch.Tensor:
        # straight from a meta tensor: no dispatch through the fake mode (the first fake
        # dispatch of a process costs tens of milliseconds)
        meta = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device="meta")
        # what the converter's from_meta_and_device makes, without memoizing the meta
        # tensor (fresh, and dropped here)
        t = FakeTensor(fake_mode, meta, self.device)
        if self.requires_grad:
            t.requires_grad_(True)
        return t


# the recipe of a value that was a Python scalar (int, float, bool): rebuilt as None
PY_SCALAR = object()


def static_recipe(d: Any) -> Any:
    """A checked recipe (StaticTensor, nested lists of them, PY_SCALAR or None)
    for a stored node value with static sizes; ``NotImplemented`` for one with symbolic
    sizes (built eagerly by the caller). Raises CacheFormatError for a bad value."""
    if not isinstance(d, dict) or len(d) not in (1, 2):
        raise CacheFormatError("bad node value")
    if "T" in d:
        return StaticTensor(d["T"], d.get("rg"))
    if "l" in d and isinstance(d["l"], list):
        items = [static_recipe(v) for v in d["l"]]
        return NotImplemented if any(i is NotImplemented for i in items) else items
    if "s" in d:
        # a Python scalar: its value is not part of the graph's metadata (rebuilt as None)
        return None if d["s"] is None else PY_SCALAR
    if "ST" in d or "si" in d:
        return NotImplemented
    raise CacheFormatError("bad node value")


def build_recipe(recipe: Any, fake_mode: FakeModeLike) -> Any:
    """The value ``recipe`` describes, the same wherever it is first read: outside any
    dispatch or torch-function mode the reader runs under (a functionalization, proxy or
    fake mode of a compiler's pass, a user's mode) and outside inference mode."""
    if (
        torch._C._len_torch_dispatch_stack()
        or torch._C._is_torch_function_mode_enabled()
        or torch.is_inference_mode_enabled()
    ):
        with _disable_current_modes(), torch._C.DisableTorchFunction(), torch.inference_mode(
            False
        ):
            return _build(recipe, resolve_fake_mode(fake_mode))
    return _build(recipe, resolve_fake_mode(fake_mode))


def _build(recipe: Any, fake_mode: FakeTensorMode) -> Any:
    if isinstance(recipe, StaticTensor):
        return recipe.build(fake_mode)
    if isinstance(recipe, list):
        return [_build(r, fake_mode) for r in recipe]
    return None


def add_node(
    graph: torch.fx.Graph, op: str, target: Any, args: tuple[Any, ...],
    kwargs: dict[str, Any], name: str,
) -> torch.fx.Node:
    """``graph.create_node(op, target, args, kwargs, name=name)``, without its walk over
    the arguments looking for raw SymInts to warn about (most of its cost; arguments read
    from JSON never hold one): the node is created without arguments, then given them
    through the ``args``/``kwargs`` setters, which do the same use-def bookkeeping."""
    node = graph.create_node(op, target, name=name)
    if args or kwargs:
        # the setters, without Node.__setattr__'s re-keying of the graph's find_nodes
        # table (keyed by op and target, which do not change here)
        object.__setattr__(node, "args", args)
        if kwargs:
            object.__setattr__(node, "kwargs", kwargs)
    return node


def set_meta(node: torch.fx.Node, meta: dict[str, Any]) -> None:
    """``node.meta = meta`` (without Node.__setattr__'s re-keying of the find_nodes
    table: meta is not part of its key)."""
    object.__setattr__(node, "meta", meta)


def put_meta(node: torch.fx.Node, key: str, value: Any) -> None:
    """``node.meta[key] = value`` without building a deferred ``"val"`` (``key`` is
    another entry: See Note [Lazy node values of restored graphs])."""
    assert key != "val"
    dict.__setitem__(node.meta, key, value)


class LazyValueMeta(dict[str, Any]):
    """A node's ``meta`` whose ``"val"`` is built at the first access of any kind. See
    Note [Lazy node values of restored graphs]."""

    __slots__ = ("_build", "_builder", "recipe")

    def __init__(self, build: Callable[[], Any], recipe: Any = None) -> None:
        super().__init__()
        self._build: Callable[[], Any] | None = build
        self._builder = build
        # what the value will be (a StaticTensor, a list of recipes, None): read without
        # building it
        self.recipe = recipe

    @property
    def is_built(self) -> bool:
        return self._build is None

    def static_value_spec(self) -> StaticSpec | None:
        """The value's static layout, from the recipe while the value is not built. See
        Note [Static value specs] in aotkit_schemas."""
        recipe = self.recipe
        if self._build is None:
            return tensor_static_spec(self.get("val"))
        if not isinstance(recipe, StaticTensor):
            return None  # a list, a Python scalar or None: not a tensor
        return tuple(recipe.shape), tuple(recipe.stride), recipe.dtype, recipe.device

    def fresh_value(self) -> Any:
        """Another value equal to ``"val"`` (built or not), built now and not stored: a
        separate object, as a trace's compiled-input fakes are from its placeholders'."""
        return self._builder()

    def force(self) -> None:
        build = self._build
        if build is not None:
            self._build = None
            dict.__setitem__(self, "val", build())

    def __getitem__(self, key: str) -> Any:
        self.force()
        return dict.__getitem__(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        self.force()
        return dict.get(self, key, default)

    def __contains__(self, key: object) -> bool:
        self.force()
        return dict.__contains__(self, key)

    def __iter__(self) -> Iterator[str]:
        self.force()
        return dict.__iter__(self)

    def __reversed__(self) -> Iterator[str]:
        self.force()
        return dict.__reversed__(self)

    def __len__(self) -> int:
        self.force()
        return dict.__len__(self)

    def keys(self) -> Any:
        self.force()
        return dict.keys(self)

    def values(self) -> Any:
        self.force()
        return dict.values(self)

    def items(self) -> Any:
        self.force()
        return dict.items(self)

    def __setitem__(self, key: str, value: Any) -> None:
        self.force()
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: str) -> None:
        self.force()
        dict.__delitem__(self, key)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self.force()
        return dict.setdefault(self, key, default)

    def pop(self, key: str, *default: Any) -> Any:
        self.force()
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple[str, Any]:
        self.force()
        return dict.popitem(self)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.force()
        dict.update(self, *args, **kwargs)

    def clear(self) -> None:
        self._build = None
        dict.clear(self)

    def copy(self) -> dict[str, Any]:  # type: ignore[override]
        self.force()
        return dict(dict.items(self))

    def __copy__(self) -> dict[str, Any]:
        return self.copy()

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (dict, (self.copy(),))

    def __eq__(self, other: object) -> bool:
        self.force()
        if isinstance(other, LazyValueMeta):
            other.force()
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def __or__(self, other: Any) -> Any:
        return self.copy() | other

    def __ror__(self, other: Any) -> Any:
        return other | self.copy()

    def __ior__(self, other: Any) -> LazyValueMeta:  # type: ignore[override,misc]
        self.update(other)
        return self

    def __repr__(self) -> str:
        self.force()
        return dict.__repr__(self)

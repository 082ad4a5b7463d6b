"""Functionalization's recorded view chains in the cache JSON format.

# Note [View chains in the cache JSON format]
# An input whose metadata the function changes, or an output that views a mutated input,
# carries functionalization's recorded view chain (``view_meta_sequence``: a list of C++
# ``ViewMeta`` objects; See Note [View replay] in aotkit_functional), which the runtime
# replays on the caller's tensor. Without it a restored entry would rebuild the view
# another way, so the chain is stored:
#     "view_chain": [["slice_Tensor_ViewMeta", [false, true, {"irm": "ViewOrScatterInverse"},
#                                               0, 1, 9223372036854775807, 1]], ...]
# one pair per ViewMeta: its class's name and the arguments ``as_tuple()`` gives, the
# ones its constructor takes back. Arguments are plain values only: bools, ints, None,
# lists and tuples of those, dtypes by name and ``InverseReturnMode`` by name. Reading
# accepts only class names of torch's own ``*_ViewMeta`` classes (looked up in
# ``torch._C._functionalization``, never evaluated) and constructs them from the decoded
# tuple; a constructor that rejects it is a CacheFormatError (logged, compiled again). A
# ViewMeta with symbolic arguments (``has_symbolic_inputs``), or any argument of another
# type, has no cache form: such a program is not stored. Chains of views of intermediates
# are not stored at all (See ``meta_to_json``).
"""

from __future__ import annotations

from typing import Any

import torch

from ._json_basics import CacheFormatError, dtype_from_name


def _error(message: str) -> Exception:
    return CacheFormatError(message)


def _functionalization() -> Any:
    return torch._C._functionalization


def _arg_to_json(a: Any) -> Any:
    if a is None or type(a) in (bool, int):
        return a
    if isinstance(a, (list, tuple)):
        return {"l" if isinstance(a, list) else "t": [_arg_to_json(x) for x in a]}
    if isinstance(a, torch.dtype):
        return {"dtype": str(a).removeprefix("torch.")}
    if isinstance(a, _functionalization().InverseReturnMode):
        return {"irm": a.name}
    raise _error(f"a view chain argument of type {type(a).__name__} has no cache form")


def _arg_from_json(a: Any) -> Any:
    if a is None or type(a) in (bool, int):
        return a
    if type(a) is dict and len(a) == 1:
        (tag, v), = a.items()
        if tag in ("l", "t") and isinstance(v, list):
            items = [_arg_from_json(x) for x in v]
            return items if tag == "l" else tuple(items)
        if tag == "dtype" and isinstance(v, str):
            return dtype_from_name(v)
        modes = _functionalization().InverseReturnMode
        if tag == "irm" and isinstance(v, str) and v in modes.__members__:
            return modes.__members__[v]
    raise _error(f"bad view chain argument {a!r}")


def view_chain_to_json(chain: Any) -> list[Any]:
    """A recorded view chain as JSON data. Raises CacheFormatError."""
    base = _functionalization().ViewMeta
    out = []
    for vm in chain:
        name = type(vm).__name__
        if (
            not isinstance(vm, base)
            or not name.endswith("_ViewMeta")
            or getattr(_functionalization(), name, None) is not type(vm)
        ):
            raise _error(f"a view chain holds a {name}")
        if vm.has_symbolic_inputs:
            raise _error("a view chain with symbolic sizes has no cache form")
        out.append([name, _arg_to_json(vm.as_tuple())["t"]])
    return out


def view_chain_from_json(d: Any) -> list[Any]:
    """The recorded view chain ``view_chain_to_json`` wrote. Raises CacheFormatError."""
    if not isinstance(d, list) or not d:
        raise _error("a view chain must be a non-empty list")
    base = _functionalization().ViewMeta
    chain = []
    for item in d:
        if not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str):
            raise _error("bad view chain entry")
        name, args = item
        cls = getattr(_functionalization(), name, None) if name.endswith("_ViewMeta") else None
        if not isinstance(cls, type) or not issubclass(cls, base) or cls is base:
            raise _error(f"unknown view chain entry {name!r}")
        if not isinstance(args, list):
            raise _error("bad view chain arguments")
        try:
            vm = cls(tuple(_arg_from_json(x) for x in args))
        except (TypeError, RuntimeError, ValueError) as e:
            raise _error(f"bad view chain entry {name}: {e}") from e
        chain.append(vm)
    return chain

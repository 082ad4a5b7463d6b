"""Partitioners by name: built-ins, registered ones and ``aotkit.partitioners`` entry points.

A third-party package makes its partitioner available by name by declaring::

    [project.entry-points."aotkit.partitioners"]
    my_partitioner = "my_package.partition:my_partitioner"

The entry point is loaded the first time ``get_partitioner("my_partitioner")`` asks for it.
"""

from __future__ import annotations

import importlib.metadata
import threading
from collections.abc import Callable
from typing import Any

from aotkit_schemas import Partitioner

from ._budget import memory_budget_partition
from ._default import default_partition
from ._mincut import min_cut_rematerialization_partition

ENTRY_POINT_GROUP = "aotkit.partitioners"

_BUILTIN: dict[str, Partitioner] = {
    "default": default_partition,
    "min_cut": min_cut_rematerialization_partition,
    "memory_budget": memory_budget_partition(1.0),
}
_registry: dict[str, Partitioner] = dict(_BUILTIN)
_lock = threading.Lock()


class UnknownPartitionerError(LookupError):
    """No partitioner is registered or installed under the requested name."""


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def register_partitioner(
    name: str, fn: Partitioner | Callable[..., Any], *, replace: bool = False
) -> None:
    """Make ``fn`` available as ``get_partitioner(name)``.

    ``fn`` follows the ``aotkit_schemas.Partitioner`` protocol. Registering a taken name
    raises ``ValueError`` unless ``replace=True``.
    """
    if not name or not isinstance(name, str):
        raise ValueError(f"partitioner name must be a non-empty string, got {name!r}")
    if not callable(fn):
        raise TypeError(f"partitioner {name!r} must be callable, got {type(fn).__name__}")
    with _lock:
        if name in _registry and not replace:
            raise ValueError(
                f"a partitioner named {name!r} is already registered; pass replace=True"
            )
        _registry[name] = fn


def unregister_partitioner(name: str) -> None:
    """Remove a registered partitioner; a built-in name reverts to the built-in."""
    with _lock:
        if name in _BUILTIN:
            _registry[name] = _BUILTIN[name]
        else:
            _registry.pop(name, None)


def available_partitioners() -> list[str]:
    """Sorted names of built-in, registered and installed (entry-point) partitioners."""
    with _lock:
        names = set(_registry)
    return sorted(names | set(_entry_points()))


def get_partitioner(name_or_callable: str | Partitioner | Callable[..., Any]) -> Partitioner:
    """The partitioner registered under a name; a callable is returned unchanged.

    Names resolve to built-ins (``"default"``, ``"min_cut"``, ``"memory_budget"``), then to
    ``register_partitioner`` registrations, then to entry points in the
    ``aotkit.partitioners`` group. ``"memory_budget"`` is ``memory_budget_partition(1.0)``
    and accepts ``memory_budget=`` and ``solver=`` keyword arguments per call.
    """
    if not isinstance(name_or_callable, str):
        if not callable(name_or_callable):
            raise TypeError(
                f"expected a partitioner name or callable, got {type(name_or_callable).__name__}"
            )
        return name_or_callable
    name = name_or_callable
    with _lock:
        found = _registry.get(name)
    if found is not None:
        return found
    ep = _entry_points().get(name)
    if ep is None:
        raise UnknownPartitionerError(
            f"unknown partitioner {name!r}; available: {', '.join(available_partitioners())}"
        )
    loaded = ep.load()
    if not callable(loaded):
        raise TypeError(f"entry point {ep.value!r} for partitioner {name!r} is not callable")
    register_partitioner(name, loaded, replace=True)
    result: Partitioner = loaded
    return result

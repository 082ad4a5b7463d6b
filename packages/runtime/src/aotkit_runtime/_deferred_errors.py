"""The errors a compiled backward raises for outputs the joint trace could not differentiate.

# Note [Deferred backward errors]
# The capture records, per tangent whose backward raised while the joint was traced (See
# Note [Backward paths through stale saved values] in aotkit_tracing), the exception's
# class as ``module:qualname`` and its message: plain strings, so that the on-disk cache
# stores them too. The compiled backward raises a new exception of that class with that
# message when it receives a gradient for such an output: the user's ``ValueError`` from
# an ``autograd.Function.backward`` comes back a ``ValueError``, autograd's in-place
# error a ``RuntimeError``. A class the process cannot find again by its name (defined
# inside a function, or in a module not imported) or cannot build from one message comes
# back as a ``RuntimeError`` naming the class. The classes recorded in this process are
# remembered (weakly) under their names, so a class defined inside a function is found
# again until it is collected.
"""

from __future__ import annotations

import sys
import weakref

_RECORDED: weakref.WeakValueDictionary[str, type[BaseException]] = (
    weakref.WeakValueDictionary()
)


def exception_path(cls: type[BaseException]) -> str:
    """``module:qualname`` of an exception class, remembered for ``deferred_error``. See
    Note [Deferred backward errors]."""
    path = f"{cls.__module__}:{cls.__qualname__}"
    _RECORDED[path] = cls
    return path


def deferred_error(path: str, message: str) -> BaseException:
    """A new exception of the class named by ``path``, with ``message``. See Note
    [Deferred backward errors]."""
    found: object = _RECORDED.get(path)
    if found is None:
        module_name, _, qualname = path.partition(":")
        found = sys.modules.get(module_name)
        for part in qualname.split("."):
            found = getattr(found, part, None)
    if isinstance(found, type) and issubclass(found, Exception):
        try:
            return found(message)
        except Exception:  # a constructor that takes other arguments
            pass
    return RuntimeError(f"{path}: {message}")

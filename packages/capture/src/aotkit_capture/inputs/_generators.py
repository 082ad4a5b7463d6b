"""Random generators created inside a traced function.

# Note [Generators created while tracing]
# ``g = torch.Generator().manual_seed(3); torch.rand(3, generator=g)`` inside the traced
# function: the graph keeps the generator the trace created as a constant attribute
# (``_opaque_obj0``) and the compiled function draws from it on every call, continuing
# its stream, while eager creates and seeds a fresh generator on every call (same numbers
# each time). torch's AOTAutograd does the same: a silently wrong result. The seeding is
# Python code that no graph records, so aotkit cannot replay it; the trace raises instead,
# naming the fix. A generator that outlives the function (a global, an argument, a module
# attribute created before the call) is the same object in eager and in the graph, so its
# stream continues in both; it is allowed.
#
# How a generator is known to come from the trace: while the trace runs, ``torch.Generator``
# is a recording subclass (``isinstance``/``issubclass`` against it still accept every
# generator). The graph's constant is a new Python wrapper of the same C++ generator (it
# went through the dispatcher), so identity does not match: the two are matched by seeding
# the recorded one with a probe value and reading it back through the graph's, then
# restoring its state. Generators built through another name than ``torch.Generator``
# (``from torch import Generator`` at import time) are not recorded.
#
# Where: in capture, around every trace (``compile_traced``, the uncached body of
# ``compile_flat``, and ``trace_for_export``), so aot_function, aot_module,
# aot_module_simplified, the torch.compile backends and the export APIs are all covered,
# and the check runs before ``compile_flat`` stores an entry in the on-disk cache: a
# compilation the check rejects is never stored (a disk hit ran no trace, and a stored
# entry passed the check when it was traced). The lock guards only the swap of
# ``torch.Generator``, never the body: a compile nested in a traced function (an
# aot_function called inside another's) enters the recording again on the same thread.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import torch

GENERATOR_CREATED_MESSAGE = (
    "aotkit: the traced function creates a torch.Generator (`torch.Generator()`, e.g. "
    "`torch.Generator().manual_seed(3)`) and draws random numbers from it. The compiled "
    "graph keeps the generator the trace created, so later calls would continue its random "
    "stream where eager creates and seeds a new generator on every call. Pass the generator "
    "as an argument of the function (create and seed it outside), or seed the default "
    "generator with `torch.manual_seed(...)` and drop the `generator=` argument."
)
_LOCK = threading.Lock()
_DEPTH = [0]  # compiles inside recording_generators, all threads
_ORIGINAL = torch.Generator


class GeneratorCreatedInTraceError(RuntimeError):
    """A traced function created a torch.Generator that its graph draws from."""


class _Meta(type(torch._C.Generator)):  # type: ignore[misc]
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _ORIGINAL)

    def __subclasscheck__(cls, sub: Any) -> bool:
        return issubclass(sub, _ORIGINAL)


@contextlib.contextmanager
def recording_generators() -> Iterator[list[torch.Generator]]:
    """Record every ``torch.Generator(...)`` built in the body (See Note [Generators
    created while tracing])."""
    created: list[torch.Generator] = []

    class _Recording(_ORIGINAL, metaclass=_Meta):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            created.append(self)

    # the lock guards the swap only, never the body: a compile nested in a traced function
    # (an aot_function called inside another) enters here again on the same thread
    with _LOCK:
        if _DEPTH[0] == 0:
            torch.Generator = _Recording  # type: ignore[misc]
        # else: a nested or concurrent compile; the outermost one records
        _DEPTH[0] += 1
    try:
        yield created
    finally:
        with _LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                torch.Generator = _ORIGINAL  # type: ignore[misc]


def _same_generator(a: torch.Generator, b: torch.Generator) -> bool:
    if a.device != b.device:
        return False
    saved = a.get_state()
    try:
        probe = random.getrandbits(62) | 1
        a.manual_seed(probe)
        return b.initial_seed() == probe
    finally:
        a.set_state(saved)


def check_no_created_generators(
    created: list[torch.Generator], graphs: Iterable[torch.fx.GraphModule | None]
) -> None:
    """Raise if a graph holds one of ``created``. See Note [Generators created while
    tracing]."""
    if not created:
        return
    for gm in graphs:
        if gm is None:
            continue
        for node in gm.graph.nodes:
            if node.op != "get_attr":
                continue
            value = getattr(gm, str(node.target), None)
            if isinstance(value, _ORIGINAL) and any(
                _same_generator(c, value) for c in created
            ):
                raise GeneratorCreatedInTraceError(GENERATOR_CREATED_MESSAGE)

"""Which operators a compilation's trace called, for refusing only the compilations that
can reach a kernel the on-disk cache cannot key.

# Note [Refusing only the compilations that reach an unkeyable kernel]
# A Python kernel the dispatcher holds but Python cannot read back (``Library.impl``,
# ``register_kernel``/``register_autograd`` on an operator not made with ``custom_op``:
# See Note [Custom operators in the on-disk cache key]) cannot be keyed on its code. Only
# a compilation whose trace runs that kernel depends on it, and a trace runs a kernel of
# an operator only after the dispatcher was called for that operator. So, while such
# kernels are registered in the process (and only then: otherwise nothing here runs):
#   * a fresh compilation traces with the dispatcher's operator record on: the autograd
#     profiler's legacy, thread-local RecordFunction observer, which sees every operator
#     call made through the dispatcher in this thread, from Python, from C++ composite
#     kernels and from the autograd engine alike, CompositeImplicitAutograd operators that
#     never reach the graph included. If the trace called an operator that has an
#     unkeyable kernel, the compilation is not stored (``uncacheable``, logged with the
#     kernel and the fix); else it is stored with the names of every operator it called;
#   * an entry is used only if it lists the operators its trace called and none of them
#     has an unkeyable kernel now. An entry stored by a process without such kernels
#     lists none: it is traced again (with the record on) and stored again, with its list.
# Why a stored list holds in the process that reads it: the key covers every kernel but
# the unkeyable ones (and the gaps the Note above documents), so the stored trace and the
# one this process would run execute the same code up to the first operator whose kernel
# differs; the stored trace called that operator, and the kernel that differs is one of
# the unkeyable ones, which refuses the entry.
# Conservative where it cannot tell: the list holds every operator the compilation called
# (the partitioner's and the compilers' too); operators compare by name, without the
# overload (the profiler's names); when the record cannot be made (a profiler is already
# on in this thread, or torch lacks the legacy profiler), nothing is stored.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

from aotkit_cache._files import cache_counters

log = logging.getLogger(__name__)

FIELD = "called_operators"


class CalledOperators:
    """The operators a trace called (``names``), or None when no record could be made."""

    names: frozenset[str] | None = None


@contextlib.contextmanager
def recording_called_operators(on: bool) -> Iterator[CalledOperators]:
    """Record the operators called through the dispatcher in this thread while the block
    runs, when ``on``. See Note [Refusing only the compilations that reach an unkeyable
    kernel]."""
    called = CalledOperators()
    if not on:
        yield called
        return
    started = _start()
    try:
        yield called
    finally:
        if started:
            called.names = _stop()


def _start() -> bool:
    autograd = torch._C._autograd
    enable = getattr(autograd, "_enable_profiler_legacy", None)
    if enable is None or autograd._profiler_enabled():
        return False
    from torch._C._profiler import ProfilerConfig, ProfilerState, _ExperimentalConfig

    try:
        enable(ProfilerConfig(
            ProfilerState.CPU, False, False, False, False, False, _ExperimentalConfig()
        ))
    except RuntimeError:  # a profiler was enabled after all
        return False
    return True


def _stop() -> frozenset[str]:
    records = torch._C._autograd._disable_profiler_legacy()
    return frozenset(
        name
        for thread in records
        for r in thread
        if r.kind() == "push"  # type: ignore[comparison-overlap]  # a str at run time
        and "::" in (name := r.name())
    )


def refusal(called: frozenset[str] | None, unkeyable: dict[str, str]) -> str | None:
    """Why a compilation that called ``called`` cannot be cached while the operators of
    ``unkeyable`` (name -> reason) have unkeyable kernels; None when it can."""
    if called is None:
        return "the operators this compilation called could not be recorded"
    for name in sorted(called & unkeyable.keys()):
        return unkeyable[name]
    return None


def stored_refusal(payload: dict[str, Any], unkeyable: dict[str, str]) -> str | None:
    """Why an entry cannot be used while ``unkeyable`` kernels are registered; None when
    it can (See Note [Refusing only the compilations that reach an unkeyable kernel])."""
    names = payload.get(FIELD)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return "the entry does not list the operators its trace called"
    return refusal(frozenset(names), unkeyable)


def keep_called_operators(
    payload: dict[str, Any], called: CalledOperators, unkeyable: dict[str, str]
) -> dict[str, Any] | None:
    """``payload`` with the operators its trace called, or None (logged, counted) when
    the compilation reached an unkeyable kernel."""
    reason = refusal(called.names, unkeyable)
    if reason is not None:
        cache_counters["uncacheable"] += 1
        log.debug("aotkit cache: not storing this compilation: %s", reason)
        return None
    assert called.names is not None
    payload[FIELD] = sorted(called.names)
    return payload

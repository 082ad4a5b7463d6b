"""Swapping a module's parameters and buffers for traced tensors, checked.

# Note [A submodule reachable under two names]
# A submodule registered twice (``self.seq = nn.Sequential(self.l, relu, self.l)``) gives
# each of its parameters several names that are one slot: one ``_parameters`` dict and one
# key. Every name is still a lifted input (as in torch), but the swap gets one name per
# slot: swapping a slot twice restores it in an order that leaves the traced tensor in
# the user's module (a FunctionalTensor as ``l.weight``, failing every later call and
# every eager use of the module). Distinct slots that hold the same tensor (tied weights,
# ``self.out.weight = self.emb.weight``) are each swapped as usual. The name kept is the
# last one, whose value torch's own sequential swap leaves in place, so an inference
# export reads the same placeholder as torch's. A joint export of such a module raises
# (the other names' inputs get no gradient; torch fails on its "did not receive a
# gradient" assertion).
#
# Note [Parameters and buffers reassigned in forward]
# ``self.cache = torch.cat([self.cache, x])`` on a registered buffer rebinds the module's
# slot. The swap back after the trace puts the user's original tensor there again, so the
# compiled module would silently keep the old buffer on every call where eager keeps the
# new one (torch's aot_module does exactly that). A compiled graph cannot rebind a module
# attribute, so the trace raises, naming the slot and the fix, before any input is
# touched. In-place updates (``copy_``, slice assignment, ``add_``) keep the slot's tensor
# and are captured as input mutations.
#
# Note [Module state read while another thread traces]
# A trace swaps traced tensors into the user's module (its parameters and buffers here,
# tensor attributes in ``swapped_tensor_attributes``) until its backward is traced.
# Another thread calling the compiled module meanwhile would read those fakes as its
# inputs ("Attempting to use FunctionalTensor on its own"). Every swap is counted
# (``swapping_module_state``): a call reads the module's tensors, then checks that no swap
# was in progress or began while it read; otherwise it reads them again holding the
# compile lock, i.e. after the tracing thread's compile (See Note [Concurrent first
# calls] in aotkit_capture). A call without a swap anywhere pays two list reads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import torch.nn as nn
from aotkit_capture import COMPILE_LOCK
from torch.nn.utils import stateless

T = TypeVar("T")
# [swaps in progress, swaps begun so far]: See Note [Module state read while another
# thread traces]
_SWAPS = [0, 0]


@contextlib.contextmanager
def swapping_module_state() -> Iterator[None]:
    """Mark the body as a swap of traced tensors into a module. See Note [Module state
    read while another thread traces]."""
    with COMPILE_LOCK:
        _SWAPS[0] += 1
        _SWAPS[1] += 1
    try:
        yield
    finally:
        with COMPILE_LOCK:
            _SWAPS[0] -= 1


def read_module_state(read: Callable[[], T]) -> T:
    """``read()``, made again after any compile in progress when a module swap was in
    progress or began while it ran. See Note [Module state read while another thread
    traces]."""
    begun = _SWAPS[1]
    value = read()
    if not _SWAPS[0] and _SWAPS[1] == begun:
        return value
    with COMPILE_LOCK:
        return read()

REASSIGNED_MESSAGE = (
    "{who}: forward assigned a new value to the registered {kind} {names} "
    "(`self.{leaf} = ...`). A compiled graph cannot rebind a module attribute, so the "
    "module would keep its old {kind} on every call. Update it in place instead "
    "(`self.{leaf}.copy_(new)`, or write into a preallocated buffer with slice assignment "
    "or `index_copy_`), or compile the module with "
    "`torch.compile(module, backend=\"aotkit_eager\")`, which replays attribute assignments."
)


class SlotReassignedError(RuntimeError):
    """A forward rebound a registered parameter or buffer while it was traced."""


def _slot(mod: nn.Module, name: str) -> tuple[dict[str, Any], str, str]:
    """The dict holding ``name``, its key there, and "buffer" or "parameter"."""
    prefix, _, leaf = name.rpartition(".")
    sub = mod.get_submodule(prefix)
    if leaf in sub._buffers:
        return sub._buffers, leaf, "buffer"
    return sub._parameters, leaf, "parameter"


def distinct_slot_names(mod: nn.Module, names: Sequence[str]) -> list[int]:
    """Positions in ``names`` of the last name of each parameter/buffer slot (the one
    whose value torch's sequential swap leaves in place, so graphs read the same input).

    See Note [A submodule reachable under two names]."""
    return distinct_positions(_slot(mod, name)[:2] for name in names)


def distinct_positions(slots: Iterable[tuple[dict[str, Any], str]]) -> list[int]:
    """``distinct_slot_names`` for slots given as (the dict holding it, its key)."""
    last: dict[tuple[int, str], int] = {}
    for i, (owner, leaf) in enumerate(slots):
        last[(id(owner), leaf)] = i
    return sorted(last.values())


def shared_slot_names(mod: nn.Module, names: Sequence[str]) -> list[list[str]]:
    """Groups of two or more ``names`` that are one parameter/buffer slot."""
    groups: dict[tuple[int, str], list[str]] = {}
    for name in names:
        owner, leaf, _ = _slot(mod, name)
        groups.setdefault((id(owner), leaf), []).append(name)
    return [g for g in groups.values() if len(g) > 1]


@contextlib.contextmanager
def reparametrized(mod: nn.Module, tensors: dict[str, Any], *, who: str) -> Iterator[None]:
    """Swap ``tensors`` (one name per slot) into ``mod`` for the body; raise if the body
    rebinds one of them. See Note [Parameters and buffers reassigned in forward]."""
    with swapping_module_state(), stateless._reparametrize_module(mod, tensors):
        yield
        rebound = []
        for name, value in tensors.items():
            owner, leaf, kind = _slot(mod, name)
            if owner.get(leaf) is not value:
                rebound.append((name, kind))
        if rebound:
            kinds = {kind for _, kind in rebound}
            raise SlotReassignedError(
                REASSIGNED_MESSAGE.format(
                    who=who,
                    kind=kinds.pop() if len(kinds) == 1 else "parameter/buffer",
                    names=", ".join(f"`{name}`" for name, _ in rebound),
                    leaf=rebound[0][0].rpartition(".")[2],
                )
            )


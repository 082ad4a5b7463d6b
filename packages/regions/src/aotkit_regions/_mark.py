"""Marking repeated blocks as nested compile regions before dynamo runs.

# Note [Marking repeated blocks]
# Sharing regions in dynamo's graph (Note [Sharing repeated regions]) saves aotkit's
# trace, partition and compile per repeat, but dynamo itself still traces every layer.
# ``mark_repeated_blocks(model)`` cuts that too: it finds the submodules that repeat
# (same class, same parameter and buffer names, shapes, dtypes and requires_grad, at
# least ``min_repeats`` of them, outermost first) and sets each instance's ``forward`` to
# its class's forward wrapped in ``torch.compiler.nested_compile_region``, so dynamo traces
# the block once and the graph aotkit receives calls one ``invoke_subgraph`` per distinct
# block. Blocks that would change eager's results under a region are left unmarked:
# blocks with buffers (BatchNorm), hooks, dropout with p > 0, or already a custom
# instance ``forward``. ``unmark_repeated_blocks(model)`` removes the marks. Only the
# instances are changed, never the class.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn

from ._switch import DEFAULT_MIN_REPEATS, min_repeats

__all__ = ["mark_repeated_blocks", "unmark_repeated_blocks"]

_MARK = "_aotkit_region_marked"


def _has_hooks(m: nn.Module) -> bool:
    names = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    return any(bool(getattr(m, name, None)) for name in names)


def _unmarkable(m: nn.Module) -> str | None:
    for sub in m.modules():
        if any(True for _ in sub.buffers(recurse=False)):
            return "it has buffers"
        if _has_hooks(sub):
            return "it has hooks"
        if isinstance(sub, nn.modules.dropout._DropoutNd) and sub.p > 0:
            return "it has dropout"
        if "forward" in sub.__dict__:
            return "an instance forward is set"
    return None


def _key(m: nn.Module) -> tuple[Any, ...]:
    return (
        type(m),
        tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in m.named_parameters()),
        tuple((n, type(s)) for n, s in m.named_modules()),
    )


def _walk(m: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Module]]:
    yield prefix, m
    for name, child in m.named_children():
        yield from _walk(child, f"{prefix}.{name}" if prefix else name)


def mark_repeated_blocks(model: nn.Module, min_repeats_: int | None = None) -> list[str]:
    """Mark the repeated blocks of ``model`` as nested compile regions; returns their
    paths. See Note [Marking repeated blocks]."""
    n_min = min_repeats_ if min_repeats_ is not None else (min_repeats() or DEFAULT_MIN_REPEATS)
    n_min = max(n_min, 2)
    groups: dict[tuple[Any, ...], list[tuple[str, nn.Module]]] = {}
    depth: dict[int, int] = {}
    for path, m in _walk(model):
        if m is model or not any(True for _ in m.parameters()):
            continue
        depth[id(m)] = path.count(".")
        groups.setdefault(_key(m), []).append((path, m))
    marked: list[str] = []
    taken: list[str] = []
    for members in sorted(groups.values(), key=lambda ms: depth[id(ms[0][1])]):
        free = [(p, m) for p, m in members if not any(p.startswith(t + ".") for t in taken)]
        if len(free) < n_min or any(_unmarkable(m) for _, m in free):
            continue
        for path, m in free:
            region = torch.compiler.nested_compile_region(type(m).forward)
            m.forward = types.MethodType(region, m)  # type: ignore[method-assign]
            setattr(m, _MARK, True)
            marked.append(path)
            taken.append(path)
    return marked


def unmark_repeated_blocks(model: nn.Module) -> list[str]:
    """Undo mark_repeated_blocks; returns the paths unmarked."""
    unmarked = []
    for path, m in _walk(model):
        if m.__dict__.pop(_MARK, False):
            m.__dict__.pop("forward", None)
            unmarked.append(path)
    return unmarked

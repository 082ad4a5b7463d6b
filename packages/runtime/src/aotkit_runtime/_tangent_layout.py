"""The layout each tangent of a compiled backward was traced with, and the coercion of
runtime tangents to it. See Note [Tangent strides follow the outputs] in aotkit_analysis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass


@dataclass(frozen=True)
class TangentLayout:
    """Exact ``size``/``stride`` (static plain tangents), or only a ``memory_format``
    (symbolic sizes, subclasses, guesses by memory format)."""

    size: tuple[int, ...] | None = None
    stride: tuple[int, ...] | None = None
    memory_format: torch.memory_format | None = None
    # the exact strides are the contiguous ones: ``is_contiguous()`` is the cheap check
    contiguous: bool = False

    @staticmethod
    def of(t: Any) -> TangentLayout | None:
        """The layout of traced tangent ``t`` (a fake tensor, or a cache ``TensorSpec``
        with ``shape``/``stride``); None for a non-tensor."""
        shape = getattr(t, "shape", None)
        stride = t.stride() if isinstance(t, torch.Tensor) else getattr(t, "stride", None)
        if shape is None or stride is None:
            return None
        dims = (*shape, *stride)
        if isinstance(t, torch.Tensor) and (
            is_traceable_wrapper_subclass(t) or t.layout != torch.strided
        ):
            return TangentLayout(memory_format=_memory_format(t))
        if all(type(d) is int for d in dims):
            size, strides = tuple(int(d) for d in shape), tuple(int(d) for d in stride)
            contiguous = strides == _contiguous_strides(size)
            return TangentLayout(size=size, stride=strides, contiguous=contiguous)
        if isinstance(t, torch.Tensor):
            return TangentLayout(memory_format=_memory_format(t))
        return TangentLayout(memory_format=torch.contiguous_format)


def _memory_format(t: torch.Tensor) -> torch.memory_format:
    if t.layout != torch.strided:
        return torch.contiguous_format
    return torch._prims_common.suggest_memory_format(t)


def _contiguous_strides(size: Sequence[int]) -> tuple[int, ...]:
    """``torch._prims_common.make_contiguous_strides_for`` for int sizes (a dimension of
    size 0 or 1 counts as 1), without its ``torch._check`` of each size: that imports
    sympy the first time, 0.25 s of a warm start that traces nothing (See Note [A restored
    entry's fake mode made when first needed] in aotkit_cache)."""
    strides = []
    step = 1
    for d in reversed(size):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def coerce_tangent_layout(t: torch.Tensor, layout: TangentLayout | None) -> torch.Tensor:
    """``t`` itself when it already has ``layout``, else a copy laid out so.

    None (not a traced tensor tangent): contiguous, the historical default."""
    if layout is None:
        return t if t.is_contiguous() else t.contiguous()
    if layout.contiguous:
        return t if t.is_contiguous() else t.contiguous()
    fmt = layout.memory_format
    if fmt is not None:
        return t if t.is_contiguous(memory_format=fmt) else t.contiguous(memory_format=fmt)
    if is_traceable_wrapper_subclass(t) or t.layout != torch.strided:
        return t if t.is_contiguous() else t.contiguous()
    assert layout.size is not None and layout.stride is not None
    if t.shape == layout.size and t.stride() == layout.stride:
        return t
    # a differentiable copy: under create_graph the tangent keeps its history
    restrided = torch.empty_strided(layout.size, layout.stride, dtype=t.dtype, device=t.device)
    return restrided.copy_(t)


def tangent_layouts(traced_tangents: Sequence[Any]) -> tuple[TangentLayout | None, ...]:
    """The layout of every traced tangent, in tangent order."""
    return tuple(TangentLayout.of(t) for t in traced_tangents)

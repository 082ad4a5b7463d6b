"""The static layout of a graph node's value, read without building a deferred value.

# Note [Static value specs]
# A compiler that needs only the sizes, strides, dtype and device of a few nodes' values
# (aotkit's nop, for its in-place additions: See Note [In-place accumulation in graph
# functions] in aotkit_backends) reads them with ``static_value_spec(node)``. For a traced
# graph that is ``node.meta["val"]``'s; a graph restored from aotkit's on-disk cache builds
# its fake values on first read (See Note [Lazy node values of restored graphs] in
# aotkit_capture), and its node metas answer ``static_value_spec()`` from the stored
# recipe, so the value is not built for it. Both give the same answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

# (shape, stride, dtype, device) with int sizes
StaticSpec = tuple[tuple[int, ...], tuple[int, ...], torch.dtype, torch.device]


def tensor_static_spec(val: Any) -> StaticSpec | None:
    """``val``'s (shape, stride, dtype, device) when it is a strided tensor with static
    sizes, else None."""
    if not isinstance(val, torch.Tensor) or val.layout is not torch.strided:
        return None
    shape, stride = tuple(val.shape), tuple(val.stride())
    if not all(type(s) is int for s in (*shape, *stride)):
        return None
    return shape, stride, val.dtype, val.device


def static_value_spec(node: torch.fx.Node) -> StaticSpec | None:
    """``tensor_static_spec(node.meta["val"])``, without building a deferred value. See
    Note [Static value specs]."""
    offer = getattr(node.meta, "static_value_spec", None)
    if offer is not None:
        spec: StaticSpec | None = offer()
        return spec
    return tensor_static_spec(node.meta.get("val"))


def dense_and_non_overlapping(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """torch's ``is_non_overlapping_and_dense`` for static sizes: some permutation of the
    dimensions is contiguous."""
    if math.prod(shape) < 2:
        return True
    if len(shape) == 1:
        return stride[0] == 1
    expected = 1
    for size, step in sorted(zip(shape, stride, strict=True), key=lambda p: p[1]):
        if size == 1:
            continue
        if step != expected:
            return False
        expected *= size
    return True

"""Unit tests for Note [Compile cache keys]: which inputs may reuse a compiled entry."""

from __future__ import annotations

import torch
from aotkit_frontends._guards import input_key


def test_dynamic_key_drops_sizes_except_for_static_inputs() -> None:
    w, x = torch.randn(3, 4), torch.randn(5, 4)
    same_key = input_key([w, torch.randn(9, 4)], dynamic=True, num_static=1)
    assert input_key([w, x], dynamic=True, num_static=1) == same_key
    assert input_key([w, x], dynamic=True, num_static=1) != input_key(
        [torch.randn(2, 4), x], dynamic=True, num_static=1
    )
    assert input_key([w, x], dynamic=False) != input_key([w, torch.randn(9, 4)], dynamic=False)


def test_dynamic_key_keeps_sizes_of_aliased_inputs() -> None:
    """Synthetic bases bake the sizes of aliased inputs into the graph."""
    a, b = torch.randn(4, 3), torch.randn(6, 3)
    assert input_key([a, a[1]], dynamic=True) != input_key([b, b[1]], dynamic=True)
    assert input_key([a, a], dynamic=True) == input_key([b, b], dynamic=True)

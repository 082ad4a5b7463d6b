"""The geometry that members of a synthetic base are regenerated with, under dynamo.

# Note [Symbolic geometry of aliased members]
# A member of a synthetic base (See Note [Duplicate and aliased inputs] in aotkit_analysis)
# is not a compiled input: the trace regenerates it with ``base.as_strided(size, stride,
# offset)``. The layout records that geometry from the runtime inputs, as ints, so a graph
# traced with it is right for that geometry only. aot_function keys its entries on the
# geometry of aliased inputs, so another geometry compiles again. aot_module_simplified
# compiles once for dynamo, which with dynamic shapes reuses the graph for other sizes:
# a graph with ``as_strided(base, [4, 3], ...)`` baked in would return a (4, 3) output for
# a (5, 3) input and write the wrong elements of the buffer.
#
# So under a ShapeEnv, a member that dynamo fakified is regenerated with the sizes, strides
# and offset of dynamo's fake of it: SymInts whose values the graph takes as inputs (dynamo
# lifts them as SymInt placeholders), so the graph follows the runtime geometry and
# dynamo's guards cover it. An element whose symbols the graph does not take (no
# placeholder carries them) stays the recorded int. ``InputLayout.traced_geometry`` holds
# the result; the layout's key keeps the ints. The runtime check of aot_module_simplified
# compares every int element with the call's inputs and leaves the symbolic ones to dynamo
# (See Note [Runtime checks of the input layout] in aotkit_frontends).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from aotkit_analysis import InputLayout
from torch._guards import TracingContext
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily


def with_symbolic_members(
    layout: InputLayout,
    flat_args: Sequence[Any],
    fake_args: Sequence[Any],
    fake_mode: FakeTensorMode,
    shape_env: Any,
) -> InputLayout:
    """``layout`` with its members' traced geometry taken from dynamo's fakes of them.
    ``fake_args`` are the compiled inputs' fakes. See Note [Symbolic geometry of aliased
    members]."""
    tracing = TracingContext.try_get()
    if shape_env is None or not layout.synthetic_bases or tracing is None:
        return layout
    contexts: Any = tracing.tensor_to_context
    bound = _bound_symbols(fake_args)
    geometry: dict[int, Any] = {}
    for group in layout.synthetic_bases:
        for m in group.members:
            real = flat_args[m.user_index]
            if not isinstance(real, torch.Tensor) or real not in contexts:
                continue
            context = contexts[real]
            with unset_fake_temporarily():
                fake = fake_mode.from_tensor(
                    real, symbolic_context=context, source=context.tensor_source, trace=False
                )
            traced = (
                tuple(_bound_or(v, h, bound) for v, h in zip(fake.shape, m.size, strict=True)),
                tuple(_bound_or(v, h, bound) for v, h in zip(fake.stride(), m.stride, strict=True)),
                _bound_or(fake.storage_offset(), m.storage_offset, bound),
            )
            if any(isinstance(v, torch.SymInt) for v in (*traced[0], *traced[1], traced[2])):
                geometry[m.user_index] = traced
    return layout.with_traced_geometry(geometry) if geometry else layout


def _symbols(v: Any) -> frozenset[Any]:
    return frozenset(v.node.expr.free_symbols) if isinstance(v, torch.SymInt) else frozenset()


def _bound_symbols(fake_args: Sequence[Any]) -> frozenset[Any]:
    """The symbols that the compiled inputs carry (SymInt inputs, tensor geometry)."""
    out: set[Any] = set()
    for a in fake_args:
        if isinstance(a, torch.SymInt):
            out |= _symbols(a)
        elif isinstance(a, torch.Tensor):
            for v in (*a.shape, *a.stride(), a.storage_offset()):
                out |= _symbols(v)
    return frozenset(out)


def _bound_or(value: Any, hint: int, bound: frozenset[Any]) -> Any:
    """``value`` when it is an int equal to ``hint`` or a SymInt over bound symbols only;
    else ``hint``."""
    if isinstance(value, torch.SymInt):
        symbols = _symbols(value)
        return value if symbols and symbols <= bound else hint
    return hint

"""Whether a graph aot_module_simplified compiled once still fits a call's input layout.

# Note [Runtime checks of the input layout]
# The input layout (which inputs are the same tensor, which overlap a mutated one, and the
# geometry of the members of each synthetic base: See Note [Duplicate and aliased inputs]
# in aotkit_analysis) is baked into a compiled graph. aot_function keys its entries on it
# (Note [Compile cache keys]). aot_module_simplified compiles once and is reused by its
# caller, and dynamo's guards do not cover the layout: it guards that inputs are distinct
# objects, not that they do not overlap, and not their storage offsets with static shapes.
# So a graph compiled for ``f(buf[0:4], buf[1:5])`` would be reused for
# ``f(buf[0:4], buf[2:6])``, or one compiled for two distinct tensors for two overlapping
# windows, and return wrong values in silence (torch's AOTAutograd does).
#
# aotkit checks the layout on every call of a graph that writes the data of a user input
# (only such writes make aliasing matter; a graph that writes none gets no check):
#   * fast path: the storages of the written inputs. When no other input, and no other
#     written input, shares one, the call's layout is the plain one (dedupe only, which
#     Note [Runtime checks of aot_module_simplified] checks), and it fits a graph compiled
#     without synthetic bases. This costs one storage lookup per tensor input.
#   * otherwise the call's layout is computed in full and must be admitted by the
#     compiled one (``InputLayout.admits``): the same dedupe, the same inputs passed
#     through, the same groups with the same bases and dtypes, and each member's geometry
#     equal to the traced one, except the elements the trace took symbolically, whose
#     values the graph takes as inputs and dynamo guards (See Note [Symbolic geometry of
#     aliased members] in aotkit_capture).
# A call whose layout does not fit runs a graph compiled for its layout, compiled on the
# first such call (See Note [Graphs for other input layouts] in _layout_graphs), or, past
# the limit of such graphs, the module eagerly (dynamo's graph, or the user's module),
# which gives eager's values, mutations and gradients; the ``recompiles`` log says why. A
# later call whose layout fits runs the first compiled graph again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from aotkit_analysis import InputLayout, compute_input_layout
from aotkit_capture import CompiledArtifacts

LayoutCheck = Callable[[Sequence[Any]], bool]


def written_inputs(
    artifacts: CompiledArtifacts, num_inputs: int
) -> tuple[frozenset[int], frozenset[int]] | None:
    """``(in_layout, written)``: the user inputs whose data writes shaped the layout (the
    forward's, as ``compute_input_layout`` is asked at compile time), and every input
    whose data the graphs write (the backward's writes and the members of synthetic bases
    too). None when the metadata does not say per input."""
    layout = artifacts.layout
    infos = artifacts.meta.input_info
    if len(infos) != layout.num_compiled_inputs:
        return None
    forward: set[int] = set(artifacts.mutated_user_inputs or ())
    written: set[int] = set(forward)
    backward = set(artifacts.backward_mutated_inputs)
    for g, group in enumerate(layout.synthetic_bases):
        if infos[g].mutates_data or g in backward:
            written.update(m.user_index for m in group.members)
    for c, u in layout.kept_positions():
        users = [i for i in range(num_inputs) if layout.first_occurrence[i] == u]
        if infos[c].mutates_data:
            forward.update(users)
        if infos[c].mutates_data or c in backward:
            written.update(users)
    return frozenset(forward), frozenset(written | forward)


def written_or_all(artifacts: CompiledArtifacts, flat_args: Sequence[Any]) -> frozenset[int]:
    """The inputs whose writes shaped the layout (every distinct tensor input when the
    metadata does not say)."""
    found = written_inputs(artifacts, len(flat_args))
    if found is None:
        return frozenset(_storage_positions(flat_args, artifacts.layout))
    return found[0]


def _storage_positions(flat_args: Sequence[Any], layout: InputLayout) -> list[int]:
    """The distinct tensor inputs whose storage the layout looked at."""
    return [
        i
        for i, a in enumerate(flat_args)
        if layout.first_occurrence[i] == i
        and isinstance(a, torch.Tensor)
        and not (a.is_sparse or a.is_mkldnn)
    ]


def layout_check(artifacts: CompiledArtifacts, flat_args: Sequence[Any]) -> LayoutCheck | None:
    """``check(args)``: whether the compiled graph fits the layout of ``args`` (None: it
    fits every layout, no input's data is written). See Note [Runtime checks of the input
    layout]."""
    layout = artifacts.layout
    positions = _storage_positions(flat_args, layout)
    found = written_inputs(artifacts, len(flat_args))
    in_layout, written = found if found is not None else (frozenset(positions),) * 2
    if not written:
        return None
    written_positions = [i for i in positions if i in written]
    others = [i for i in positions if i not in written]
    n_written = len(written_positions)
    plain = not layout.synthetic_bases
    mutated = in_layout.__contains__

    def full(args: Sequence[Any]) -> bool:
        try:
            runtime = compute_input_layout(args, mutated)
        except RuntimeError:  # a layout no graph takes: eager decides
            return False
        return layout.admits(runtime)

    def check(args: Sequence[Any]) -> bool:
        storages = {args[i].untyped_storage()._cdata for i in written_positions}
        if len(storages) < n_written:
            return full(args)
        for i in others:
            if args[i].untyped_storage()._cdata in storages:
                return full(args)
        return plain

    return check


def describe_layout_change(layout: InputLayout, args: Sequence[Any], written: frozenset[int]) -> str:
    """Why a call's layout does not fit (for the ``recompiles`` log)."""
    try:
        runtime = compute_input_layout(args, written.__contains__)
    except RuntimeError as e:
        return f"the inputs' aliasing has no compiled form ({e})"
    if layout.first_occurrence != runtime.first_occurrence:
        return (
            "the inputs passed more than once changed: compiled for "
            f"{_duplicates(layout)}, called with {_duplicates(runtime)}"
        )
    return (
        f"the inputs' aliasing changed: compiled for {_describe(layout)}, called with "
        f"{_describe(runtime)}"
    )


def _duplicates(layout: InputLayout) -> str:
    pairs = [f"input {i} is input {f}" for i, f in enumerate(layout.first_occurrence) if f != i]
    return ", ".join(pairs) or "distinct inputs"


def _describe(layout: InputLayout) -> str:
    if not layout.synthetic_bases:
        return "inputs that do not overlap a written input"
    groups = []
    for g in layout.synthetic_bases:
        members = ", ".join(
            f"input {m.user_index} (size {list(m.size)}, stride {list(m.stride)}, "
            f"offset {m.storage_offset})"
            for m in g.members
        )
        groups.append(f"[{members}]")
    return "overlapping inputs " + "; ".join(groups)

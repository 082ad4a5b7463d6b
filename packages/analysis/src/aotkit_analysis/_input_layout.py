"""How the user's flat inputs map onto the compiled function's inputs.

# Note [Duplicate and aliased inputs]
# Functionalization assumes distinct inputs do not alias. Two cases break that:
#   * the same tensor passed twice, ``f(x, x)``: the duplicate is dropped and the
#     compiled function sees ``x`` once (dedupe);
#   * distinct tensors that overlap in memory, ``f(x, x.view(-1))``, when one of them is
#     mutated: the group is replaced by one *synthetic base* input and the traced function
#     regenerates each member with ``as_strided`` off that base, so functionalization sees
#     the aliasing. Groups that are never mutated need no base.
# The compiled inputs are ``(*synthetic bases, *kept user inputs in order)``, torch's order
# (so ``primals_1`` is the first base and parameters need not come first). The layout is
# a function of the runtime aliasing pattern, so the frontend computes it on every call and
# compiles once per distinct pattern (it never assumes the first call's pattern);
# aot_module_simplified, which compiles once, checks it on every call instead (See Note
# [Runtime checks of the input layout] in aotkit_frontends). Under dynamo the members'
# geometry in the trace may be symbolic (``traced_geometry``: See Note [Symbolic geometry
# of aliased members] in aotkit_capture).
#
# Data mutations of a member land in the base and every member sees them. Two things the
# metadata of the compiled function can't say about a member are recorded while tracing
# (``MemberEffects``) and replayed by the runner: a member returned as an output (the
# caller must get its own tensor back, ``out is x``), and a metadata mutation of a member
# (``x.t_()``), applied with ``as_strided_`` to the caller's tensor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

# (size, stride, storage_offset) of a tensor
Geometry = tuple[tuple[int, ...], tuple[int, ...], int]


@dataclass(frozen=True)
class AliasedMember:
    """One user input regenerated from a synthetic base inside the trace."""

    # index into the user's flat inputs
    user_index: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    dtype: torch.dtype

    @property
    def geometry(self) -> Geometry:
        return (self.size, self.stride, self.storage_offset)


@dataclass(frozen=True)
class SyntheticBaseGroup:
    members: tuple[AliasedMember, ...]
    # index (into the user's flat inputs) of a member that is the base of the others, or
    # None when the base is a flat view over the whole storage
    base_user_index: int | None
    # index of a member whose autograd ``_base`` (shared by every member, none of them
    # the base itself) is the base: a differentiable base that is not an input
    common_view_base_of: int | None = None

    def __post_init__(self) -> None:
        assert self.base_user_index is None or self.common_view_base_of is None


@dataclass
class MemberEffects:
    """What a traced call did to inputs regenerated from synthetic bases.

    See Note [Duplicate and aliased inputs]. Filled each time the wrapped function is
    traced; every trace of one layout records the same facts.
    """

    # flat output position -> user input index, for outputs that *are* a member
    returned: dict[int, int] = field(default_factory=dict)
    # user input index -> (size, stride, storage_offset) after a metadata mutation
    new_metadata: dict[int, tuple[tuple[int, ...], tuple[int, ...], int]] = field(
        default_factory=dict
    )

    def apply(self, flat_args: Sequence[Any], outs: list[Any]) -> list[Any]:
        """Replay the effects on the caller's inputs and outputs after a call."""
        for i, (size, stride, offset) in self.new_metadata.items():
            flat_args[i].as_strided_(size, stride, offset)
        for j, i in self.returned.items():
            outs[j] = flat_args[i]
        return outs


@dataclass(frozen=True)
class InputLayout:
    """Dedupe + synthetic-base calling convention. See Note [Duplicate and aliased inputs]."""

    num_user_inputs: int
    # for every user input, the index of its first occurrence (itself when unique)
    first_occurrence: tuple[int, ...]
    # user indices passed straight through, in order
    kept: tuple[int, ...]
    synthetic_bases: tuple[SyntheticBaseGroup, ...] = ()
    key: tuple[Any, ...] = field(init=False)
    # recorded by the function ``wrap_for_tracing`` returns; not part of the key
    member_effects: MemberEffects = field(default_factory=MemberEffects, compare=False)
    # user index -> the (size, stride, storage_offset) a member is regenerated with in the
    # trace, where some of it is symbolic; not part of the key. See Note [Symbolic
    # geometry of aliased members]
    traced_geometry: dict[int, Geometry] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        assert len(self.first_occurrence) == self.num_user_inputs
        object.__setattr__(self, "key", (self.first_occurrence, self.synthetic_bases))

    def with_traced_geometry(self, geometry: dict[int, Geometry]) -> InputLayout:
        """This layout, its members regenerated in the trace with ``geometry`` (symbolic
        where the caller's fake inputs are). See Note [Symbolic geometry of aliased
        members]."""
        return dataclasses.replace(self, traced_geometry=dict(geometry))

    def admits(self, runtime: InputLayout) -> bool:
        """Whether a graph compiled for this layout computes eager's values for inputs
        whose layout is ``runtime``: the same dedupe, the same inputs passed through, the
        same synthetic-base groups (members, base, dtypes) and the same member geometry,
        except where the trace took it symbolically. See Note [Runtime checks of the
        input layout] in aotkit_frontends."""
        if (
            self.first_occurrence != runtime.first_occurrence
            or self.kept != runtime.kept
            or len(self.synthetic_bases) != len(runtime.synthetic_bases)
        ):
            return False
        for g, h in zip(self.synthetic_bases, runtime.synthetic_bases, strict=True):
            if (
                g.base_user_index != h.base_user_index
                or g.common_view_base_of != h.common_view_base_of
                or len(g.members) != len(h.members)
            ):
                return False
            for m, n in zip(g.members, h.members, strict=True):
                if m.user_index != n.user_index or m.dtype != n.dtype:
                    return False
                traced = self.traced_geometry.get(m.user_index, m.geometry)
                if not _geometry_admits(traced, n.geometry):
                    return False
        return True

    @property
    def is_trivial(self) -> bool:
        return not self.synthetic_bases and len(self.kept) == self.num_user_inputs

    @property
    def num_compiled_inputs(self) -> int:
        return len(self.kept) + len(self.synthetic_bases)

    def compiled_index_of_user_input(self, user_index: int) -> int | None:
        """Where a user input's value lives among the compiled inputs (None if regenerated
        from a synthetic base)."""
        first = self.first_occurrence[user_index]
        try:
            return len(self.synthetic_bases) + self.kept.index(first)
        except ValueError:
            return None

    def kept_positions(self) -> list[tuple[int, int]]:
        """(compiled position, user index) of every input passed straight through."""
        n_bases = len(self.synthetic_bases)
        return [(n_bases + pos, i) for pos, i in enumerate(self.kept)]

    def compiled_args(self, flat_args: Sequence[Any]) -> list[Any]:
        """Map runtime user inputs to compiled inputs (builds synthetic bases): the bases
        first, then the inputs passed through, as torch orders them."""
        out = [_make_base(flat_args, group) for group in self.synthetic_bases]
        out += [flat_args[i] for i in self.kept]
        return out

    def wrap_for_tracing(self, flat_fn: Callable[..., Any]) -> Callable[..., Any]:
        """The function of compiled inputs that the tracer sees."""
        if self.is_trivial:
            return flat_fn
        layout = self

        def with_layout(*compiled_args: Any) -> Any:
            user: list[Any] = [None] * layout.num_user_inputs
            for pos, i in layout.kept_positions():
                user[i] = compiled_args[pos]
            for g, group in enumerate(layout.synthetic_bases):
                base = compiled_args[g]
                for m in group.members:
                    # every member, the base one too, is an as_strided view of the
                    # compiled base, as torch regenerates them (its graphs name the
                    # nodes after this order)
                    src = base if base.dtype == m.dtype else base.view(m.dtype)
                    size, stride, offset = layout.traced_geometry.get(m.user_index, m.geometry)
                    user[m.user_index] = src.as_strided(size, stride, offset)
            for i, first in enumerate(layout.first_occurrence):
                if first != i:
                    user[i] = user[first]
            outs = flat_fn(*user)
            layout._record_member_effects(user, outs)
            return outs

        return with_layout


    def _record_member_effects(self, user: Sequence[Any], outs: Sequence[Any]) -> None:
        effects = self.member_effects
        effects.returned.clear()
        effects.new_metadata.clear()
        members = [m for g in self.synthetic_bases for m in g.members]
        by_id = {id(user[m.user_index]): m.user_index for m in members}
        for j, o in enumerate(outs):
            if id(o) in by_id:
                effects.returned[j] = by_id[id(o)]
        for m in members:
            t = user[m.user_index]
            after = (tuple(t.shape), tuple(t.stride()), t.storage_offset())
            traced = self.traced_geometry.get(m.user_index, m.geometry)
            if _same_geometry(after, traced):
                continue
            if not all(type(v) is int for v in (*after[0], *after[1], after[2])):
                raise RuntimeError(
                    "aotkit: the function changes the size, stride or offset of an input "
                    "that aliases another mutated input, and its sizes are symbolic; clone "
                    "it before the call or compile with static shapes."
                )
            effects.new_metadata[m.user_index] = cast(Geometry, after)


def _flat_geometry(g: Geometry) -> tuple[Any, ...]:
    return (len(g[0]), len(g[1]), *g[0], *g[1], g[2])


def _same_geometry(a: Geometry, b: Geometry) -> bool:
    """Structural equality, asking nothing of a ShapeEnv: a symbolic element equals only
    an element with the same expression."""
    fa, fb = _flat_geometry(a), _flat_geometry(b)
    return len(fa) == len(fb) and all(
        _canonical(x) == _canonical(y) for x, y in zip(fa, fb, strict=True)
    )


def _canonical(v: Any) -> Any:
    """An int, or a SymInt's expression (an int when it is a constant)."""
    if type(v) is int:
        return v
    as_int = v.node.maybe_as_int()
    return as_int if as_int is not None else v.node.expr


def _geometry_admits(traced: Geometry, runtime: Geometry) -> bool:
    """Whether a member traced with ``traced`` (ints, or SymInts whose values the graph
    takes as inputs) fits ``runtime`` (ints): every int element matches."""
    ft, fr = _flat_geometry(traced), _flat_geometry(runtime)
    return len(ft) == len(fr) and all(
        not isinstance(c := _canonical(x), int) or c == y for x, y in zip(ft, fr, strict=True)
    )


def _make_base(flat_args: Sequence[Any], group: SyntheticBaseGroup) -> torch.Tensor:
    if group.base_user_index is not None:
        base = flat_args[group.base_user_index]
        assert isinstance(base, torch.Tensor)
        return base
    if group.common_view_base_of is not None:
        common = _common_view_base([flat_args[m.user_index] for m in group.members])
        if common is None:
            raise RuntimeError(
                "aotkit: inputs "
                + ", ".join(str(m.user_index) for m in group.members)
                + " were views of one tensor when this function was compiled, but are not "
                "any more; pass views of one base tensor, or clone the inputs."
            )
        return common
    t = flat_args[group.members[0].user_index]
    assert isinstance(t, torch.Tensor)
    storage = t.untyped_storage()
    numel = storage.nbytes() // t.element_size()
    return t.new_empty(0).set_(storage, 0, (numel,), (1,))


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """[first, last] element offsets of t within its storage."""
    lo = hi = int(t.storage_offset())
    for s, st in zip(t.shape, t.stride(), strict=True):
        if s == 0:
            return (lo, lo - 1)
        if st >= 0:
            hi += (s - 1) * st
        else:
            lo += (s - 1) * st
    return lo, hi


def may_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """False only when a and b provably share no element of their storage. See Note
    [Inputs that share a storage without overlapping]."""
    if a.dtype.itemsize != b.dtype.itemsize:
        return True
    lo_a, hi_a = _extent(a)
    lo_b, hi_b = _extent(b)
    if hi_a < lo_b or hi_b < lo_a:
        return False
    return not _rows_interleave(a, b)


# Note [Inputs that share a storage without overlapping]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Two inputs on one storage need a synthetic base only when they may share an element.
# Disjoint [first, last] extents settle most cases. The other common case is two column
# blocks of one matrix (``x[:, 0:2]`` and ``x[:, 2:4]``): 2-D, rows contiguous, one row
# stride s. Every element of a lies at ``offset_a + [0, n_a)`` modulo s and every element
# of b at ``offset_a + d + [0, n_b)`` with ``d = (offset_b - offset_a) mod s``; when those
# residue ranges are disjoint (``n_a <= d`` and ``d + n_b <= s``) no element is shared,
# whatever the number of rows. torch detects these cases too, so its graphs take the
# inputs as they are instead of through a synthetic base.


def _rows_interleave(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dim() != 2 or b.dim() != 2 or a.numel() == 0 or b.numel() == 0:
        return False
    geometry = (*a.shape, *a.stride(), a.storage_offset(), *b.shape, *b.stride(), b.storage_offset())
    if not all(type(v) is int for v in geometry):
        return False  # symbolic: no guard is added; they may overlap
    s = a.stride(0)
    if b.stride(0) != s or s <= 0 or a.stride(1) != 1 or b.stride(1) != 1:
        return False
    if a.storage_offset() > b.storage_offset():
        a, b = b, a
    n_a, n_b = int(a.size(1)), int(b.size(1))
    d = int(b.storage_offset() - a.storage_offset()) % int(s)
    return n_a <= d and d + n_b <= int(s)


def compute_input_layout(
    flat_args: Sequence[Any], mutated: Callable[[int], bool] | None = None
) -> InputLayout:
    """Work out dedupe and (when ``mutated`` says an aliased input is mutated) synthetic
    bases for these runtime inputs. ``mutated(i)`` answers for user input i."""
    first: list[int] = []
    seen: dict[int, int] = {}
    for i, a in enumerate(flat_args):
        if isinstance(a, torch.Tensor):
            first.append(seen.setdefault(id(a), i))
        else:
            first.append(i)
    unique = [i for i, f in enumerate(first) if f == i]
    groups: dict[int, list[int]] = {}
    for i in unique:
        a = flat_args[i]
        if isinstance(a, torch.Tensor) and not a.is_sparse:
            groups.setdefault(a.untyped_storage()._cdata, []).append(i)
    in_base: set[int] = set()
    bases: list[SyntheticBaseGroup] = []
    for members in groups.values():
        if len(members) < 2:
            continue
        overlapping = [
            i
            for i in members
            if any(j != i and may_overlap(flat_args[i], flat_args[j]) for j in members)
        ]
        if len(overlapping) < 2 or mutated is None:
            continue
        if not any(mutated(i) or any(mutated(k) for k, f in enumerate(first) if f == i) for i in overlapping):
            continue
        bases.append(_group(flat_args, overlapping))
        in_base.update(overlapping)
    kept = tuple(i for i in unique if i not in in_base)
    return InputLayout(len(flat_args), tuple(first), kept, tuple(bases))


def _group(flat_args: Sequence[Any], members: list[int]) -> SyntheticBaseGroup:
    tensors = [flat_args[i] for i in members]
    if any(is_traceable_wrapper_subclass(t) for t in tensors):
        raise RuntimeError(
            "Encountered aliased inputs that are mutated in the graph, but at least one "
            "input/output to the graph is a tensor subclass. This is not supported today. "
            f"(aotkit: inputs {members} alias one storage.) Remove the aliasing yourself as a "
            "workaround: clone one of the inputs before the call."
        )
    base_index: int | None = None
    common_of: int | None = None
    ref_base: torch.Tensor | None = None
    # A member that is the view-base of every other member serves as the base.
    for i, t in zip(members, tensors, strict=True):
        if all(o is t or o._base is t for o in tensors):
            base_index, ref_base = i, t
            break
    if base_index is None:
        # Views of one tensor that is not an input (``f(x[0:4], x[2:6])``): their common
        # autograd base is a differentiable synthetic base. Also when no member requires
        # grad: a write that brings grad in (``x[0:4].add_(w)``, ``w`` requiring grad)
        # makes eager's base, and through it every member, require grad; a flat view over
        # the storage would leave the members without autograd history.
        ref_base = _common_view_base(tensors)
        if ref_base is None and any(t.requires_grad for t in tensors):
            roots = {id(t._base) for t in tensors if t._base is not None}
            raise RuntimeError(
                "aotkit: inputs "
                + ", ".join(str(i) for i in members)
                + " alias one storage, at least one of them is mutated and requires grad, "
                "and they are not views of one tensor, so no differentiable synthetic base "
                "exists. Pass the base tensor itself (and take the views inside the "
                "function), or clone one of the inputs before the call."
                + (f" ({len(roots)} distinct view bases)" if roots else "")
            )
        if ref_base is not None:
            common_of = members[0]
    dt = ref_base.dtype if ref_base is not None else tensors[0].dtype
    out = []
    for i, t in zip(members, tensors, strict=True):
        if t.dtype.itemsize != dt.itemsize:
            raise RuntimeError(
                f"aotkit: aliased inputs {members} are mutated and have different element "
                "sizes; clone one of them before the call."
            )
        out.append(
            AliasedMember(i, tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype)
        )
    return SyntheticBaseGroup(tuple(out), base_index, common_of)


def _common_view_base(tensors: Sequence[Any]) -> torch.Tensor | None:
    """The autograd ``_base`` every tensor is a view of, if there is one."""
    bases = {id(t._base): t._base for t in tensors if isinstance(t, torch.Tensor)}
    if len(bases) != 1:
        return None
    base = next(iter(bases.values()))
    return base if isinstance(base, torch.Tensor) else None

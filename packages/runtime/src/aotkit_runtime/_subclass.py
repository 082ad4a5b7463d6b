"""Flattening tensor subclasses into the compiled graphs' plain tensors and back.

See Note [Tensor subclasses are desugared] in aotkit_schemas. The same functions serve
the trace (on fake tensors, where the rebuilt subclasses hold the traced inner tensors)
and the run time (per compiled program: ``make_unwrapper`` / ``make_wrapper`` specialise
the walk to the program's metas once, so a call does no pytree walk and no
``__tensor_flatten__``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from aotkit_schemas import (
    OpaqueMeta,
    PlainTensorMeta,
    SubclassCreationMeta,
    SubclassOrPlainMeta,
    SymbolicOuter,
)
from torch._subclasses.fake_tensor import is_fake
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ._call import as_list_caller
from ._tangent_layout import TangentLayout, coerce_tangent_layout

Unwrapper = Callable[[Sequence[Any]], list[Any]]
Wrapper = Callable[[Sequence[Any]], list[Any]]


def is_subclass(value: Any) -> bool:
    """A traceable wrapper subclass (defines ``__tensor_flatten__``/``__tensor_unflatten__``)."""
    return isinstance(value, torch.Tensor) and is_traceable_wrapper_subclass(value)


def create_subclass_metas(values: Sequence[Any]) -> tuple[SubclassOrPlainMeta, ...]:
    """One meta per value, numbering the flattened values from 0."""
    metas: list[SubclassOrPlainMeta] = []
    idx = 0
    for v in values:
        m = _meta_of(v, idx)
        metas.append(m)
        idx += m.arg_count
    return tuple(metas)


def _meta_of(value: Any, start: int) -> SubclassOrPlainMeta:
    if not is_subclass(value):
        return PlainTensorMeta(start)
    attrs, ctx = value.__tensor_flatten__()
    inner: dict[str, SubclassOrPlainMeta | OpaqueMeta] = {}
    idx = start
    for name in attrs:
        attr = getattr(value, name)
        if not isinstance(attr, torch.Tensor):
            inner[name] = OpaqueMeta(attr)
            continue
        m = _meta_of(attr, idx)
        inner[name] = m
        idx += m.arg_count
    size, stride = tuple(value.shape), tuple(value.stride())
    symbolic = None
    if not all(type(d) is int for d in (*size, *stride)):
        symbolic = _symbolic_outer(value, size, stride)
    return SubclassCreationMeta(
        flat_tensor_start_idx=start,
        arg_count=idx - start,
        attrs=inner,
        outer_size=size,
        outer_stride=stride,
        meta=ctx,
        original_subclass_type=type(value),
        requires_grad=value.requires_grad,
        symbolic_outer=symbolic,
    )


def _symbolic_outer(value: Any, size: tuple[Any, ...], stride: tuple[Any, ...]) -> SymbolicOuter:
    """See Note [Symbolic outer sizes of subclasses] in aotkit_schemas."""
    import sympy

    bindings: dict[Any, tuple[Any, int, bool, int]] = {}
    for pos, inner in enumerate(unwrap_subclasses([value])):
        if not isinstance(inner, torch.Tensor):
            continue
        for is_stride, dims in ((False, inner.shape), (True, inner.stride())):
            for d, v in enumerate(dims):
                # a bare symbol, or an expression (``s0*s1`` after a flattening view); a
                # nested int is never bound (See Note [Nested ints in outer sizes])
                if (
                    isinstance(v, torch.SymInt)
                    and not is_nested_int(v)
                    and v.node.expr.free_symbols
                ):
                    bindings.setdefault(v.node.expr, (v.node.expr, pos, is_stride, d))

    unbound: set[Any] = set()
    placeholders = {k: sympy.Integer(1) for k in bindings}

    def expr(v: Any) -> Any:
        if not isinstance(v, torch.SymInt):
            return int(v)
        if is_nested_int(v):
            # See Note [Nested ints in outer sizes]
            return NESTED_INT
        e = v.node.expr
        # what is left once every expression an inner size gives is replaced
        unbound.update(e.xreplace(placeholders).free_symbols)
        return e

    size_exprs = tuple(expr(v) for v in size)
    stride_exprs = tuple(expr(v) for v in stride)
    return SymbolicOuter(
        bindings=tuple(bindings.values()),
        size_exprs=size_exprs,
        stride_exprs=stride_exprs,
        unbound=tuple(sorted(map(str, unbound))),
    )


# Note [Nested ints in outer sizes]
# A jagged NestedTensor's outer size has a nested int (``j1``) for its ragged dimension,
# and its outer stride multiples of it; eager tensors carry them too. The subclass computes
# them itself from its offsets (or lengths) when rebuilt from real inner tensors, so they
# are neither bound to an inner size nor refused as unbound: at run time they are passed
# to ``__tensor_unflatten__`` as -1 (a SymInt must not outlive the trace; torch passes -1
# too), and at trace time, when the inner tensors are fake, the traced nested ints are
# passed, which the subclass memoizes on its fake offsets.
NESTED_INT: Any = object()


def is_nested_int(v: Any) -> bool:
    """Whether ``v`` is a nested int (a jagged dimension's size, or a multiple of one)."""
    return isinstance(v, torch.SymInt) and bool(v.node.is_nested_int())


def check_rebuildable(metas: Sequence[SubclassOrPlainMeta | OpaqueMeta], what: str) -> None:
    """Raise if a subclass that is rebuilt at run time (``what``: forward outputs,
    gradients) has an outer shape its inner tensors do not determine. See Note [Symbolic
    outer sizes of subclasses] in aotkit_schemas."""
    for m in metas:
        if not isinstance(m, SubclassCreationMeta):
            continue
        check_rebuildable(list(m.attrs.values()), what)
        if m.symbolic_outer is not None and m.symbolic_outer.unbound:
            raise NotImplementedError(
                f"aotkit: one of the {what} is a tensor subclass "
                f"({m.original_subclass_type.__name__}) whose symbolic outer size or stride "
                f"({m.outer_size}, {m.outer_stride}) uses symbols "
                f"({', '.join(m.symbolic_outer.unbound)}) that none of its inner tensors' "
                "sizes or strides gives, so it can't be rebuilt at run time. Compile with "
                "dynamic=False (or mark those dimensions static)."
            )


def _concrete_outer(meta: SubclassCreationMeta, inner: Sequence[Any]) -> tuple[Any, Any]:
    """The outer size and stride for run-time inner tensors ``inner`` (the subclass's graph
    values, in order); the traced ones when they are ints or the values are symbolic."""
    sym = meta.symbolic_outer
    if sym is None or _symbolic(inner):
        # ints, or tracing: keep the traced SymInts
        return meta.outer_size, meta.outer_stride
    env: dict[Any, int] = {}
    for symbol, pos, is_stride, d in sym.bindings:
        t = inner[pos]
        v = t.stride(d) if is_stride else t.size(d)
        if not isinstance(v, int):
            return meta.outer_size, meta.outer_stride  # tracing: keep the SymInts
        env[symbol] = v
    if NESTED_INT in (*sym.size_exprs, *sym.stride_exprs) and any(
        isinstance(t, torch.Tensor) and is_fake(t) for t in inner
    ):
        return meta.outer_size, meta.outer_stride  # tracing: keep the nested ints

    def ev(e: Any) -> int:
        if e is NESTED_INT:
            return -1
        return e if isinstance(e, int) else int(e.xreplace(env))

    return tuple(ev(e) for e in sym.size_exprs), tuple(ev(e) for e in sym.stride_exprs)


def _symbolic(values: Sequence[Any]) -> bool:
    """Whether a tensor among ``values`` has a symbolic size or stride (a trace)."""
    return any(
        isinstance(d, torch.SymInt)
        for t in values
        if isinstance(t, torch.Tensor)
        for d in (*t.shape, *t.stride())
    )


def unwrap_subclasses(values: Sequence[Any]) -> list[Any]:
    """Every value flattened (subclasses to their inner tensors, recursively)."""
    out: list[Any] = []
    for v in values:
        _flatten_into(v, out)
    return out


def _flatten_into(value: Any, out: list[Any]) -> None:
    if not is_subclass(value):
        out.append(value)
        return
    attrs, _ = value.__tensor_flatten__()
    for name in attrs:
        attr = getattr(value, name)
        if isinstance(attr, torch.Tensor):  # See OpaqueMeta
            _flatten_into(attr, out)


def _attr_paths(meta: SubclassCreationMeta) -> list[tuple[str, ...]]:
    paths: list[tuple[str, ...]] = []
    for name, m in meta.attrs.items():
        if isinstance(m, SubclassCreationMeta):
            paths.extend((name, *p) for p in _attr_paths(m))
        elif isinstance(m, PlainTensorMeta):
            paths.append((name,))
    return paths


def make_unwrapper(metas: Sequence[SubclassOrPlainMeta]) -> Unwrapper:
    """``unwrap(values) -> graph values`` specialised to ``metas`` (the attribute paths of
    every inner tensor are computed once)."""
    plan: list[list[tuple[str, ...]] | None] = [
        _attr_paths(m) if isinstance(m, SubclassCreationMeta) else None for m in metas
    ]

    def unwrap(values: Sequence[Any]) -> list[Any]:
        out: list[Any] = []
        for v, paths in zip(values, plan, strict=True):
            if paths is None:
                out.append(v)
                continue
            for path in paths:
                t = v
                for name in path:
                    t = getattr(t, name)
                out.append(t)
        return out

    return unwrap


def rebuild(
    meta: SubclassOrPlainMeta | OpaqueMeta, flat: Sequence[Any], *, mirror_grad: bool = False
) -> Any:
    """The value ``meta`` describes, rebuilt from the graph values ``flat``. With
    ``mirror_grad`` (trace time), a rebuilt subclass requires grad when the traced one did."""
    if isinstance(meta, PlainTensorMeta):
        return flat[meta.unwrapped_idx]
    if isinstance(meta, OpaqueMeta):
        return meta.value
    inner = {name: rebuild(m, flat, mirror_grad=mirror_grad) for name, m in meta.attrs.items()}
    cls: Any = meta.original_subclass_type
    size, stride = meta.outer_size, meta.outer_stride
    if meta.symbolic_outer is not None:
        start = meta.flat_tensor_start_idx
        size, stride = _concrete_outer(meta, flat[start : start + meta.arg_count])
    value = cls.__tensor_unflatten__(inner, meta.meta, size, stride)
    if mirror_grad and meta.requires_grad and not value.requires_grad:
        value.requires_grad_(True)
    return value


def make_wrapper(metas: Sequence[SubclassOrPlainMeta]) -> Wrapper:
    """``wrap(graph values) -> values`` specialised to ``metas``."""
    plain = all(isinstance(m, PlainTensorMeta) for m in metas)

    def wrap(flat: Sequence[Any]) -> list[Any]:
        if plain:
            return list(flat)
        return [rebuild(m, flat) for m in metas]

    return wrap


# Note [Zero tangents of subclass outputs]
# Autograd materializes the gradient of an output the backward did not reach as a plain
# zero tensor of the output's outer shape, which has no inner tensors to pass to a backward
# traced for a subclass tangent (torch 2.15 raises "we guessed its metadata incorrectly"
# there). aotkit's Function asks autograd for None instead (``set_materialize_grads(False)``)
# and builds the zero tangent in the traced subclass form: zero inner tensors rebuilt with
# the tangent's meta. With static shapes the inner shapes are the traced ones; with
# symbolic shapes the forward records, per call, the shapes of the output's inner tensors
# (the tangent was traced as contiguous guesses of them) and the outer size and stride
# are computed from the zeros (See Note [Symbolic outer sizes of subclasses] in
# aotkit_schemas). An input whose gradient comes only from unused tangents still gets
# None, as in eager: the Function's ``tangent_deps`` are the backward graph's, grouped by
# subclass (See Note [Gradients through unused outputs]).
class SubclassZeros:
    """The zero tangent of one subclass output. See Note [Zero tangents of subclass
    outputs]."""

    __slots__ = ("_meta", "_static")

    def __init__(self, traced: Any, meta: SubclassCreationMeta) -> None:
        self._meta = _renumbered(meta)
        flat = unwrap_subclasses([traced])
        self._static: list[tuple[Any, Any, Any]] | None = None
        if meta.symbolic_outer is None and not _symbolic(flat):
            self._static = [(tuple(t.shape), t.dtype, t.device) for t in flat]

    @staticmethod
    def for_tangent(traced: Any, meta: SubclassOrPlainMeta) -> SubclassZeros | None:
        """None for a plain tangent, or for a subclass whose outer shape its inner tensors
        do not determine (the backward then raises torch's error for a plain tangent)."""
        if not isinstance(meta, SubclassCreationMeta):
            return None
        if meta.symbolic_outer is not None and meta.symbolic_outer.unbound:
            return None
        return SubclassZeros(traced, meta)

    def record(self, output: Any) -> Any:
        """What the backward needs from the forward's output (None: static shapes)."""
        if self._static is not None:
            return None
        flat = unwrap_subclasses([output])
        inner = None
        if len(flat) == self._meta.arg_count and all(isinstance(t, torch.Tensor) for t in flat):
            inner = [(t.shape, t.dtype, t.device) for t in flat]
        return inner, (output.shape, output.dtype, output.device)

    def make(self, recorded: Any) -> Any:
        """The zero tangent. Plain zeros when the forward's output did not have the traced
        form (the backward then raises torch's error for a plain tangent)."""
        like = self._static
        if like is None:
            like, outer = recorded
            if like is None:
                return torch.zeros(outer[0], dtype=outer[1], device=outer[2])
        return rebuild(self._meta, [torch.zeros(s, dtype=d, device=dev) for s, d, dev in like])


def _renumbered(meta: SubclassCreationMeta) -> SubclassOrPlainMeta:
    """``meta`` with its graph positions counted from 0."""
    renumbered: SubclassOrPlainMeta = _create_like(meta, meta.flat_tensor_start_idx)
    return renumbered


def _create_like(meta: SubclassOrPlainMeta | OpaqueMeta, offset: int) -> Any:
    if isinstance(meta, OpaqueMeta):
        return meta
    if isinstance(meta, PlainTensorMeta):
        return PlainTensorMeta(meta.unwrapped_idx - offset)
    return SubclassCreationMeta(
        flat_tensor_start_idx=meta.flat_tensor_start_idx - offset,
        arg_count=meta.arg_count,
        attrs={name: _create_like(m, offset) for name, m in meta.attrs.items()},
        outer_size=meta.outer_size,
        outer_stride=meta.outer_stride,
        meta=meta.meta,
        original_subclass_type=meta.original_subclass_type,
        requires_grad=meta.requires_grad,
        symbolic_outer=meta.symbolic_outer,
    )


def coerce_tangent(value: Any, meta: SubclassOrPlainMeta) -> Any:
    """A runtime tangent in the form the backward graph was traced for.

    The tangent's subclass metadata is a guess made at trace time (See Note [Tangents of
    subclass outputs] in aotkit_analysis). When the runtime tangent's type or
    ``__tensor_flatten__`` context differs, it is asked to convert itself with torch's
    ``__coerce_same_metadata_as_tangent__`` (DTensor redistributes to the traced
    placements); a tangent that can't be converted raises.
    """
    if not isinstance(value, torch.Tensor):
        return value
    expected_type: type = torch.Tensor
    expected_meta: Any = None
    if isinstance(meta, SubclassCreationMeta):
        expected_type, expected_meta = meta.original_subclass_type, meta.meta
    runtime_type = type(value) if is_subclass(value) else torch.Tensor
    runtime_meta = value.__tensor_flatten__()[1] if is_subclass(value) else None  # type: ignore[attr-defined]
    if runtime_type is expected_type and runtime_meta == expected_meta and _same_nesting(value, meta):
        return value
    coerce = getattr(value, "__coerce_same_metadata_as_tangent__", None)
    coerced = None
    if coerce is not None:
        if runtime_type is expected_type:
            coerced = coerce(expected_meta)
        else:
            coerced = coerce(expected_meta, expected_type)
    if coerced is None or not _same_nesting(coerced, meta):
        if expected_type is not torch.Tensor and runtime_type is torch.Tensor:
            hint = (
                "A plain tensor reached the backward as the gradient of a tensor subclass "
                "output: pass the gradient in the output's subclass form, or call "
                ".detach() on the outputs you do not differentiate."
            )
        else:
            hint = "Your tensor subclass must implement __coerce_same_metadata_as_tangent__."
        # torch's first lines (See Note [Tangents of subclass outputs] in aotkit_analysis)
        raise RuntimeError(
            "\nDuring the backward, we encountered a tensor subclass where we guessed its\n"
            "metadata incorrectly.\n"
            f"Expected: {expected_meta} (type {expected_type.__name__}{_nesting_text(meta)}),\n"
            f"got: {runtime_meta} (type {runtime_type.__name__}), shape: {tuple(value.shape)}.\n"
            + hint
        )
    return coerced


def _same_nesting(value: Any, meta: SubclassOrPlainMeta) -> bool:
    """Whether ``value``'s inner tensors are the subclasses (or plain tensors) the traced
    tangent had, all the way down: a tangent ``TwoTensor(TwoTensor, TwoTensor)`` does not
    fit a backward traced for ``TwoTensor(Tensor, Tensor)``."""
    if not isinstance(meta, SubclassCreationMeta):
        return not is_subclass(value)
    if type(value) is not meta.original_subclass_type:
        return False
    for name, inner_meta in meta.attrs.items():
        if isinstance(inner_meta, OpaqueMeta):
            continue
        inner = getattr(value, name, None)
        if not isinstance(inner, torch.Tensor) or not _same_nesting(inner, inner_meta):
            return False
        if isinstance(inner_meta, SubclassCreationMeta) and inner.__tensor_flatten__()[1] != inner_meta.meta:  # type: ignore[attr-defined]
            return False
    return True


def _nesting_text(meta: SubclassOrPlainMeta) -> str:
    if not isinstance(meta, SubclassCreationMeta):
        return ""
    inner = [
        f"{name}: {m.original_subclass_type.__name__ if isinstance(m, SubclassCreationMeta) else 'Tensor'}"
        for name, m in meta.attrs.items()
        if not isinstance(m, OpaqueMeta)
    ]
    return f" of {', '.join(inner)}" if inner else ""


def _boxed(fn: Callable[[list[Any]], Sequence[Any]]) -> Callable[[list[Any]], Sequence[Any]]:
    fn._boxed_call = True  # type: ignore[attr-defined]  # See Note [Boxed calling convention]
    return fn


def subclass_forward(
    compiled: Callable[..., Any],
    inp_metas: Sequence[SubclassOrPlainMeta],
    out_metas: Sequence[SubclassOrPlainMeta],
) -> Callable[[list[Any]], Sequence[Any]]:
    """A compiled forward (or inference) graph called with the user's values: the inputs
    are flattened with ``inp_metas``, the first ``len(out_metas)`` returns rebuilt with
    ``out_metas``; what follows them (saved tensors and symints) passes through. Boxed.
    See Note [Tensor subclasses are desugared] in aotkit_schemas."""
    call = as_list_caller(compiled)
    unwrap = make_unwrapper(inp_metas)
    wrap = make_wrapper(out_metas)
    n_flat = sum(m.arg_count for m in out_metas)

    def run(args: list[Any]) -> Sequence[Any]:
        outs = call(unwrap(args))
        return [*wrap(outs[:n_flat]), *outs[n_flat:]]

    return _boxed(run)


# Note [Subclass gradients of plain outputs]
# A loss built from a plain output and a subclass output (``x.sin().sum() + two.sum()``,
# ``two`` a TwoTensor) hands the plain output a subclass gradient: eager's backward
# formulas then run on the subclass, whose ``__torch_dispatch__`` makes every gradient
# downstream a subclass too. The backward graph was traced for a plain tangent, and a
# compiled graph takes plain tensors only. When such a tangent cannot be coerced to a
# plain tensor (``__coerce_same_metadata_as_tangent__``), the backward runs the
# *uncompiled* backward graph (``uncompiled``, its ATen ops called one by one) with the
# subclass tangent in the plain slot, so the subclass's dispatch sees each op as in eager.
# The gradients of plain inputs may come back as subclasses, as eager's do; a gradient
# the graph builds as a subclass must come back with the traced nesting (a subclass of
# subclasses is not what eager returns), else the backward raises torch's error.


def subclass_backward(
    compiled: Callable[..., Any],
    num_saved: int,
    tangent_metas: Sequence[SubclassOrPlainMeta],
    grad_metas: Sequence[SubclassOrPlainMeta],
    inner_layouts: Sequence[TangentLayout | None] = (),
    uncompiled: Callable[[list[Any]], Sequence[Any]] | None = None,
) -> Callable[[list[Any]], Sequence[Any]]:
    """A compiled backward graph called with ``(*saved, *tangents)`` where the tangents are
    the user's values: they are coerced to the traced metadata, flattened (inner tensors
    laid out as traced: ``inner_layouts``, per flat tangent, else contiguous) and the
    gradients rebuilt with ``grad_metas``. Boxed. See Note [Tangent strides follow the
    outputs] in aotkit_analysis. ``uncompiled``: the backward graph run op by op, for a
    subclass gradient of a plain output (See Note [Subclass gradients of plain outputs])."""
    call = as_list_caller(compiled)
    unwrap = make_unwrapper(tangent_metas)
    wrap = make_wrapper(grad_metas)

    def run(args: list[Any]) -> Sequence[Any]:
        tangents = []
        plain_slots_got_subclass = False
        for t, m in zip(args[num_saved:], tangent_metas, strict=True):
            try:
                tangents.append(coerce_tangent(t, m))
            except RuntimeError:
                if uncompiled is None or isinstance(m, SubclassCreationMeta) or not is_subclass(t):
                    raise
                # See Note [Subclass gradients of plain outputs]
                plain_slots_got_subclass = True
                tangents.append(t)
        if plain_slots_got_subclass:
            assert uncompiled is not None
            return _run_uncompiled(uncompiled, args[:num_saved], unwrap(tangents), wrap, grad_metas)
        inner = unwrap(tangents)
        layouts = inner_layouts or (None,) * len(inner)
        flat = [
            coerce_tangent_layout(t, lay) if isinstance(t, torch.Tensor) else t
            for t, lay in zip(inner, layouts, strict=True)
        ]
        saved = args[:num_saved]
        args.clear()
        return wrap(call([*saved, *flat]))

    return _boxed(run)




def _run_uncompiled(
    uncompiled: Callable[[list[Any]], Sequence[Any]],
    saved: Sequence[Any],
    inner: Sequence[Any],
    wrap: Wrapper,
    grad_metas: Sequence[SubclassOrPlainMeta],
) -> Sequence[Any]:
    """See Note [Subclass gradients of plain outputs]."""
    flat = [t.contiguous() if isinstance(t, torch.Tensor) else t for t in inner]
    grads = wrap(uncompiled([*saved, *flat]))
    for g, m in zip(grads, grad_metas, strict=True):
        if isinstance(m, SubclassCreationMeta) and g is not None and not _same_nesting(g, m):
            raise RuntimeError(
                "\nDuring the backward, we encountered a tensor subclass where we guessed its\n"
                "metadata incorrectly.\n"
                "A plain output's gradient was a tensor subclass, and the gradient of a "
                f"{m.original_subclass_type.__name__} input came back nested differently "
                f"than traced ({m.original_subclass_type.__name__}{_nesting_text(m)}): "
                "backpropagate the outputs separately, or make the plain output's gradient "
                "a plain tensor."
            )
    return grads

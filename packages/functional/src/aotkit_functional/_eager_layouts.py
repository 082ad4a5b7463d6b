"""Eager's memory layout of every view made during a functionalized trace.

# Note [Views see eager's layouts]
# Functionalization computes a view's sizes and strides from the view of the *functional
# value* underneath (``view_copy`` on the unwrapped tensor), not from the view's input as
# the user sees it. The two differ after an in-place op on a tensor that is not dense: a
# sliced input ``x`` (strides (4, 1) in a larger base) keeps its strides after
# ``x.add_(1)`` (the wrapper's metadata does not change), but the functional value behind
# it is now the contiguous result of ``add``. Then:
#   * ``x.view(3, -1)`` succeeds in the trace where eager raises "view size is not
#     compatible with input tensor's size and stride", so the compiled function would
#     return a result for a call eager rejects;
#   * every view of ``x`` has the functional value's strides, not eager's.
# (torch's C++ functionalization only computes a reference layout on meta tensors for XLA
# and lazy tensors; ``FunctionalTensorMode`` never does.)
# ``EagerLayoutMode`` does it for every view op: it keeps, per FunctionalTensor made by a
# view op, a meta tensor with eager's size, stride and storage offset (the *eager
# shadow*), made by running the same view op on the input's shadow (or, for a tensor that
# no view op made, on a meta tensor with the tensor's own metadata, which is eager's for
# inputs and for fresh results). A view that eager would reject raises eager's error, and
# when the shadow's layout differs from the trace's the error says so: such a view may be
# a ``reshape`` that eager runs as a copy (reshape chooses view or copy from the traced
# layout before any mode sees it), which the trace cannot reproduce; the error names the
# fix. In-place view ops (``t_``, ``transpose_``, ...) update the shadow the same way.
# Symbolic sizes or strides skip the check (comparing them would add guards).
#
# Note [out= keeps the out tensor's layout]
# Eager's ``torch.mul(x, 2, out=r)`` with an ``r`` of the right size writes into ``r``'s
# memory, so ``r`` (and the base it views) keep their strides. Functionalization replaces
# the out= op by the functional op (``mul``), whose result is laid out like its inputs,
# and makes that the new value of ``r``: a transposed ``r`` (strides (1, 2)) came back
# with strides (3, 1), and its base with the transpose of its eager layout. For every
# tensor an out= op writes whose size the op did not change, ``EagerLayoutMode`` compares
# the new value's strides with eager's (the shadow's); when they differ it copies the
# value into a tensor with eager's strides (``empty_strided`` + functional ``copy``, the
# same nodes as ``r.copy_(...)`` gives) and makes that the value, so the view's base is
# updated from eager's layout too. An out= op that resizes its output (eager then lays it
# out as the op does) is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.weak import WeakTensorKeyDictionary


def _static(values: Sequence[Any]) -> bool:
    return all(
        _static(v) if isinstance(v, (list, tuple)) else not isinstance(v, torch.SymInt)
        for v in values
    )


# The view ops whose success depends on the input's strides: eager's error is raised for
# these only. Any other view op the shadow cannot run (``as_strided`` reaching outside the
# minimal storage a shadow has, say) just ends the tracking of that value.
_LAYOUT_CHECKED = frozenset({torch.ops.aten.view.default, torch.ops.aten.view.dtype})


def _meta_like(t: torch.Tensor) -> torch.Tensor | None:
    """A meta tensor with ``t``'s size, stride and storage offset (None if symbolic)."""
    size, stride, offset = t.size(), t.stride(), t.storage_offset()
    if not (_static(size) and _static(stride) and isinstance(offset, int)):
        return None
    if any(n == 0 for n in size):
        extent = 0
    else:
        extent = 1 + sum((n - 1) * abs(s) for n, s in zip(size, stride, strict=True))
    storage = torch.empty(offset + extent, dtype=t.dtype, device="meta")
    return storage.as_strided(size, stride, offset)


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(
        a.size() == b.size() and a.stride() == b.stride() and a.storage_offset() == b.storage_offset()
    )


class EagerLayoutMode(FunctionalTensorMode):  # type: ignore[no-untyped-call]
    """A FunctionalTensorMode that checks every view op against eager's layout.

    See Note [Views see eager's layouts].
    """

    # Higher-order operators find their rules by the mode's exact type; they reach
    # ``__torch_dispatch__`` instead and run FunctionalTensorMode's rule.
    supports_higher_order_operators = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shadows: WeakTensorKeyDictionary = WeakTensorKeyDictionary()

    def _shadow(self, t: FunctionalTensor) -> torch.Tensor | None:
        got = self._shadows.get(t)  # type: ignore[no-untyped-call]
        if got is not None:
            return got  # type: ignore[no-any-return]
        with _disable_current_modes():
            return _meta_like(t)

    def _shadow_call(
        self, func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[torch.Tensor | None, Any]:
        """(the input's shadow, the view op run on it); (None, None) when not checkable."""
        src = args[0]
        rest = (*args[1:], *kwargs.values())
        if any(isinstance(a, torch.Tensor) for a in rest) or not _static(rest):
            return None, None
        try:
            shadow = self._shadow(src)
        except Exception:  # noqa: BLE001 - a layout the meta device cannot build: no check
            return None, None
        if shadow is None:
            return None, None
        with _disable_current_modes():
            try:
                return shadow, func(shadow, *args[1:], **kwargs)
            except Exception as e:
                if func not in _LAYOUT_CHECKED or not isinstance(e, RuntimeError):
                    return None, None
                if _same_layout(shadow, src):
                    raise  # eager raises exactly this
                raise RuntimeError(
                    f"aotkit: {func} on a tensor laid out as eager's size "
                    f"{tuple(shadow.size())}, stride {shadow.stride()} (after an in-place op "
                    f"on a non-contiguous tensor, the trace sees stride {src.stride()}): "
                    f"eager raises or copies here ({e}), and the trace cannot follow it. "
                    "Call .contiguous() on the input before the in-place op (or pass a "
                    "contiguous input). See Note [Views see eager's layouts] in "
                    "aotkit_functional."
                ) from e

    def __torch_dispatch__(  # type: ignore[override]
        self,
        func: torch._ops.OpOverload,
        types: Sequence[type],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            rule = func.python_key_table.get(FunctionalTensorMode)
            if rule is None:  # torch's own words (aotkit_capture names the remedy)
                name = func.name()  # type: ignore[no-untyped-call]
                raise NotImplementedError(
                    f"There was no rule registered for HigherOrderOperator {name} and "
                    f"mode <{FunctionalTensorMode.__module__}.FunctionalTensorMode object>."
                )
            return rule(self, *args, **kwargs)
        if torch._library.utils.is_out(func):
            return self._out_op(func, types, args, kwargs)
        src = args[0] if args else None
        if not isinstance(src, FunctionalTensor) or not (
            func.is_view or torch.Tag.inplace_view in func.tags
        ):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if func._schema.is_mutable and isinstance(src, FunctionalTensor):
                # ``set_``, ``resize_``: a shadow of another size is stale
                known = self._shadows.get(src)  # type: ignore[no-untyped-call]
                if known is not None and known.size() != src.size():
                    self._shadows.pop(src, None)  # type: ignore[no-untyped-call]
            return out
        shadow, shadow_out = self._shadow_call(func, args, kwargs)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if torch.Tag.inplace_view in func.tags:
            # the op changed ``src``'s metadata; ``shadow_out`` is the shadow, changed alike
            if shadow is not None and isinstance(shadow_out, torch.Tensor):
                self._shadows[src] = shadow
            else:
                self._shadows.pop(src, None)  # type: ignore[no-untyped-call]
        elif isinstance(out, FunctionalTensor) and isinstance(shadow_out, torch.Tensor):
            self._shadows[out] = shadow_out
        elif isinstance(out, (list, tuple)) and isinstance(shadow_out, (list, tuple)):
            for o, s in zip(out, shadow_out, strict=False):
                if isinstance(o, FunctionalTensor) and isinstance(s, torch.Tensor):
                    self._shadows[o] = s
        return out

    def _out_op(
        self,
        func: torch._ops.OpOverload,
        types: Sequence[type],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """An out= op that keeps each out tensor's eager layout.

        See Note [out= keeps the out tensor's layout].
        """
        outs: list[tuple[FunctionalTensor, torch.Tensor | None]] = []
        for arg in func._schema.arguments:
            if not arg.is_out or arg.name not in kwargs:
                continue
            value = kwargs[arg.name]
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(t, FunctionalTensor):
                    try:
                        outs.append((t, self._shadow(t)))
                    except Exception:  # noqa: BLE001 - no meta layout: nothing to keep
                        outs.append((t, None))
        result = super().__torch_dispatch__(func, types, args, kwargs)
        for t, eager in outs:
            if eager is None:
                continue
            torch._sync(t)  # type: ignore[attr-defined,no-untyped-call]
            value = torch._from_functional_tensor(t.elem)  # type: ignore[attr-defined]
            if value.size() != eager.size() or not _static(value.stride()):
                self._shadows.pop(t, None)  # type: ignore[no-untyped-call]
                continue  # resized by the op: eager lays it out as the op does
            if value.stride() == eager.stride():
                continue
            # the ops below run on the plain values, under the modes beneath this one
            # (make_fx records them), as the functional kernels of copy_ do
            fixed = torch.ops.aten.copy.default(
                torch.ops.aten.empty_strided.default(
                    eager.size(), eager.stride(), dtype=value.dtype, device=value.device
                ),
                value,
            )
            torch._functionalize_replace(t.elem, fixed)  # type: ignore[attr-defined]
            torch._functionalize_commit_update(t.elem)  # type: ignore[attr-defined]
            torch._functionalize_sync(t.elem)  # type: ignore[attr-defined]
        return result

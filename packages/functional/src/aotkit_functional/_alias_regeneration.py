"""Rebuilding an output that aliases an input or an intermediate, at run time.

# Note [View replay]
# An output that aliases a base (an input, or an intermediate returned by the graph) must
# come back to the user as a real view of that base: same storage, ``_is_view()`` true,
# mutable afterwards, and with autograd history through the base. The compiled graph
# still computes the alias (so a backend can pick memory formats knowing about it), but
# the runtime discards that value and regenerates the alias from the runtime base:
#   0. for a view of an input, functionalization's recorded view chain from that input
#      (ViewMeta objects) is replayed on the runtime input. This is the only correct path
#      when the input's own layout differs from the graph's value of it: after
#      ``x.mul_(2)`` on a transposed, offset input the graph's updated ``x`` is a fresh
#      contiguous tensor, so the graph's ``x[1:].t()`` has other strides and offset than
#      eager's, and (1)/(2) below would copy the graph's layout onto the user's storage
#      (wrong strides, wrong values). The chain is recorded at trace time (in
#      aotkit_analysis), for inputs whose metadata the function did not change.
#      Without a recorded chain (symbolic view arguments), an alias the graph computed
#      from a fresh tensor standing for the base is only rebuilt by (2) below when that
#      tensor has the base's strides; otherwise the runtime raises rather than return
#      the graph's layout on the user's storage.
#   1. view replay: when the graph's value is itself a view over the same storage, replay
#      its recorded view chain (``_view_func``) on the base. The result has a proper view
#      grad_fn (ViewBackward, SelectBackward, ...).
#   2. otherwise ``as_strided`` with the graph value's size/stride and the storage offset
#      the alias had at trace time relative to its base. Cross-dtype aliases
#      (``view(dtype)``, ``view_as_real``) are handled by reinterpreting the base first.
# Both paths produce the same values; (2) is only slower in backward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ._bindings import apply_view_meta_sequence, view_func


def _reinterpret_like(base: torch.Tensor, target_dtype: torch.dtype) -> torch.Tensor:
    if base.dtype == target_dtype:
        return base
    if base.is_complex() and not target_dtype.is_complex:
        real = torch.view_as_real(base)
        return real if real.dtype == target_dtype else real.view(target_dtype)
    if not base.is_complex() and target_dtype.is_complex:
        return torch.view_as_complex(base) if base.shape[-1:] == (2,) else base.view(target_dtype)
    return base


def _share_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` lives in ``b``'s storage. Wrapper subclasses (TwoTensor, ...) have no
    real storage: a view of one counts as sharing, so view replay is tried."""
    if is_traceable_wrapper_subclass(a) or is_traceable_wrapper_subclass(b):
        return a._is_view()
    return bool(
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.device == b.device
    )


def regenerate_alias(
    base: torch.Tensor,
    graph_value: torch.Tensor,
    *,
    requires_grad: bool,
    relative_storage_offset: int | None = None,
    view_chain: list[Any] | None = None,
) -> torch.Tensor:
    """Return a view of ``base`` with the metadata of ``graph_value``.

    ``relative_storage_offset`` is the alias's storage offset minus its base's, as seen at
    trace time; it is used when ``graph_value`` does not live in ``base``'s storage
    (a backend copied it). See Note [View replay].
    """
    out: torch.Tensor | None = None
    if view_chain is not None:
        out = apply_view_meta_sequence(base, view_chain)
        same_storage = True
    else:
        same_storage = _share_storage(graph_value, base)
    # A tensor may say it is a view and still hide its base (a compiler's Tensor subclass
    # overriding ``_base``/``_view_func``): then there is nothing to replay from, and (2)
    # rebuilds it from the graph value's metadata.
    view_base = graph_value._base if graph_value._is_view() else None
    if out is None and same_storage and view_base is not None:
        replay_base = base
        if view_base is not base and (
            view_base.size() != base.size()
            or view_base.stride() != base.stride()
            or view_base.storage_offset() != base.storage_offset()
            or view_base.dtype != base.dtype
        ):
            replay_base = _reinterpret_like(base, view_base.dtype)
            if (
                replay_base.size() != view_base.size()
                or replay_base.stride() != view_base.stride()
                or replay_base.storage_offset() != view_base.storage_offset()
            ):
                replay_base = replay_base.as_strided(
                    view_base.size(), view_base.stride(), view_base.storage_offset()
                )
        try:
            replay = view_func(graph_value)
            candidate = replay(replay_base) if replay is not None else None
        except RuntimeError:
            candidate = None
        if (
            candidate is not None
            and candidate.shape == graph_value.shape
            and candidate.stride() == graph_value.stride()
            and candidate.dtype == graph_value.dtype
        ):
            out = candidate
    if out is None and not same_storage and view_base is not None:
        # No recorded chain (its view arguments were symbolic) and the graph computed the
        # alias from a fresh tensor standing for the base (an input mutated in the graph).
        # The graph's strides are only the user's when that tensor has the base's layout.
        root = view_base
        if (
            root.shape == base.shape
            and root.dtype == base.dtype
            and root.stride() != base.stride()
        ):
            raise RuntimeError(
                "aotkit cannot rebuild an output that views a mutated input whose layout "
                f"is not the graph's (input stride {tuple(base.stride())}, graph stride "
                f"{tuple(root.stride())}): the view's arguments were symbolic (dynamic "
                "shapes), so its recorded view chain cannot be replayed on the input. "
                "Remedy: pass a contiguous input (x.contiguous()), return a copy of the "
                "view (.clone()), or compile with dynamic=False."
            )
    if out is None:
        if same_storage:
            offset = graph_value.storage_offset()
        elif relative_storage_offset is not None:
            offset = base.storage_offset() + relative_storage_offset
        else:
            offset = base.storage_offset()
        source = _reinterpret_like(base, graph_value.dtype)
        if source.dtype != base.dtype and source.element_size() != base.element_size():
            # Offsets are in elements of the viewed dtype.
            offset = offset * base.element_size() // source.element_size() if not same_storage else offset
        out = source.as_strided(graph_value.size(), graph_value.stride(), offset)
        if out.dtype != graph_value.dtype:
            out = out.view(graph_value.dtype)
    if base.requires_grad and not requires_grad:
        out = out.detach()
    elif not base.requires_grad and requires_grad and out.grad_fn is None:
        out.requires_grad_(True)
    return out


# Note [Conjugate and negative bits of aliases]
# ``aten._conj`` and ``aten._neg_view`` are view ops that flip a lazy bit instead of
# computing: the result reads the same memory as its base but means ``conj(base)`` /
# ``-base`` (``torch.fft.ifft`` of a real input returns ``_conj(_fft_r2c(x))``). The bits
# are tensor metadata, not storage: ``set_`` onto a fresh tensor does not carry them, so
# ``as_plain_tensor`` sets them again, or the output would silently mean the unconjugated
# / unnegated values. (View replay needs nothing: replaying ``_conj`` sets the bit; and
# the graph value's bits say nothing when a backend returned a copy, which a ``clone``
# resolves.)


def as_plain_tensor(t: torch.Tensor) -> torch.Tensor:
    """A tensor over exactly ``t``'s memory (size, stride, storage offset) that is not a view.

    Unlike ``aten._unsafe_view(t, t.shape)``, which recomputes the strides of size-1
    dimensions, the result has ``t``'s strides. It has its own version counter. Call it
    where autograd does not record (the forward of an autograd.Function, no_grad).
    """
    out = t.new_empty(0)
    with torch.no_grad():
        out.set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride())
    # See Note [Conjugate and negative bits of aliases]: the bits are not part of the
    # storage, set_ does not carry them.
    if t.is_conj():
        torch._C._set_conj(out, True)
    if t.is_neg():
        torch._C._set_neg(out, True)
    return out

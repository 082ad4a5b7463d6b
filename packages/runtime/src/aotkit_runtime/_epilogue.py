"""The runtime wrapper around a compiled function: input mutations and output aliases.

# Note [Runtime epilogue order]
# After the compiled graph (or autograd.Function) returns, the wrapper
#   0. takes a plain alias (same size, stride, offset) of each input whose metadata the
#      function changed (``t_``): the in-place view chain recorded at trace time, and the
#      view chains of outputs aliasing that input, start from the input as passed;
#   1. applies every out-of-graph input mutation to the caller's tensors
#      (metadata first with as_strided_ to the layout the recorded chain gives on the
#      step-0 alias, or the graph's layout when no chain was recorded; then data with
#      copy_, or set_ for storage mutations), in input order;
#   2. regenerates aliased outputs from their bases (see Note [View replay]); aliases of
#      inputs are built after step 1, so they see the mutated values and metadata (a
#      recorded chain is replayed on the step-0 alias, which shares the input's storage);
#   3. returns the user outputs.
# Nothing touches the caller's tensors before the graph has run to completion, so a
# failing call never leaves inputs half-mutated.
#
# Note [Views of inputs made under no_grad]
# ``with torch.no_grad(): v = x.view(-1)`` inside a function called with grad mode on
# returns, in eager, a view that requires grad (its base does) but has no grad_fn: a
# backward through it raises "does not require grad and does not have a grad_fn", and
# ``x`` gets no gradient from it. The trace sees the same (``requires_grad`` without a
# grad_fn: ``requires_grad_for_backward`` is False), so such an alias (of an input, or of
# an intermediate regenerated from its base) is regenerated under no_grad too.
# Regenerated with grad mode on it had a ViewBackward and gradients flowed into ``x``
# where eager raises (torch's AOTAutograd does that). A view made with grad on *from*
# such a view (``w = v.view(-1)``) has, in eager, a grad_fn whose graph stops at ``v``
# (no gradient reaches ``x``) and autograd's CreationMeta NO_GRAD_MODE (an in-place op on
# it raises). Replayed with grad on, ``x`` got its gradient (torch's AOTAutograd does
# that). The trace records it (``grad_view_of_no_grad_view``): the chain is replayed
# under no_grad and one ``view`` of the whole is taken with grad on, which gives eager's
# flags, a grad_fn that reaches nothing, and the propagated CreationMeta.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from aotkit_functional import apply_view_meta_sequence, as_plain_tensor, regenerate_alias
from aotkit_schemas import OutputType, ViewAndMutationMeta

from ._saved_versions import settle_pending


def _apply_input_mutation(
    original: torch.Tensor, updated: torch.Tensor, *, data: bool, metadata: bool, storage: bool,
    hidden: bool, leaf: bool, new_layout: torch.Tensor | None = None,
) -> None:
    if storage:
        with torch.no_grad():
            original.set_(
                updated.untyped_storage(), updated.storage_offset(), updated.size(), updated.stride()
            )
        return
    if metadata and new_layout is not None:
        # See Note [Runtime epilogue order]: the recorded in-place view chain, replayed
        original.as_strided_(new_layout.size(), new_layout.stride(), new_layout.storage_offset())
    elif metadata:
        original.as_strided_(updated.size(), updated.stride(), updated.storage_offset() if not data else original.storage_offset())
    if data:
        if leaf and original.requires_grad:
            # Tracing would have failed if autograd saw this mutation of a leaf that
            # requires grad (``x.add_(1)``), so every mutation was hidden from it
            # (``x.detach().mul_(2)``, ``x.data.add_(1)``, ``no_grad``): hide this one too.
            original.detach().copy_(updated)
        elif hidden or not original.requires_grad and not updated.requires_grad:
            if _same_memory(original, updated):
                # a graph traced without functionalization wrote the input itself: copying
                # it onto itself would only bump its version (and fail a backward that saved
                # it). See Note [Tracing without functionalization] in aotkit_tracing.
                return
            with torch.no_grad():
                original.copy_(updated)
        else:
            original.copy_(updated)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are plain tensors viewing the same elements the same way
    (a subclass's or a storage-less tensor's memory is never compared)."""
    if type(a) is not torch.Tensor or type(b) is not torch.Tensor or a.is_meta or b.is_meta:
        return False
    if a.layout is not torch.strided or b.layout is not torch.strided:
        return False
    return bool(
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and a.storage_offset() == b.storage_offset()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


def needs_epilogue(meta: ViewAndMutationMeta) -> bool:
    """False when the forward returns are exactly the user outputs: nothing to copy back
    into inputs, no alias to regenerate and no grad mode to restore."""
    return bool(
        meta.mutated_inp_runtime_indices
        or any(info.is_regenerated_alias for info in meta.output_info)
        or meta.grad_enabled_mutation is not None
        or meta.num_forward_returns != meta.num_outputs
        or any(info.fresh_leaf for info in meta.output_info)
        or bool(_rooted_outputs(meta))
        or bool(_rooted_bases(meta))
        or bool(_rooted_inputs(meta))
    )


# Note [Inference graphs and leaves made inside the function]
# When no input requires grad aotkit compiles an inference graph, whose outputs never
# require grad. An output computed from a leaf the function made itself (``y =
# torch.full(...).requires_grad_(); return y.reshape(-1), x + 1``) requires grad in eager,
# and has a grad_fn (it is not a leaf). The gradient it carries can only reach that leaf,
# which the caller never sees (returning the leaf too is refused: See Note [Leaves made
# inside the function] in aotkit_analysis), so the epilogue rebuilds exactly the flags:
#   * a plain output that required grad in the trace is detached and made a leaf that
#     requires grad; a ``non_alias`` one is passed through an identity autograd.Function
#     (no copy: See ``as_plain_tensor``): requires_grad, not a leaf, not a view, a
#     grad_fn that ends at that hidden leaf; an ``unsafe_view_alias`` one (a view of a
#     tensor made inside) becomes a full view of its leaf, as eager's view of the leaf;
#   * the base of aliases of an intermediate that required grad is made such a leaf
#     before the aliases are regenerated from it, so they are views with a view grad_fn,
#     as eager's views of the leaf;
#   * an input the function wrote, with autograd watching, a value computed from such a
#     leaf (``x.add_(w.mean())``) requires grad and is no longer a leaf in eager: the
#     value is copied into it from a hidden leaf with grad on, which gives it a grad_fn
#     (and the views of it regenerated afterwards require grad too).
# Grad mode is on for both (the trace says the function had it on where it made them).
_PLAIN_OUTPUTS = (OutputType.non_alias, OutputType.unsafe_view_alias)
_INTERMEDIATE_BASES = (
    OutputType.alias_of_intermediate,
    OutputType.alias_of_intermediate_save_as_output,
)


def _rooted_outputs(meta: ViewAndMutationMeta) -> tuple[tuple[int, bool], ...]:
    """Plain outputs of an inference graph that required grad at trace time, and whether
    each was a view there. See Note [Inference graphs and leaves made inside the
    function]."""
    if meta.is_train:
        return ()
    return tuple(
        (j, info.output_type is OutputType.unsafe_view_alias)
        for j, info in enumerate(meta.output_info)
        if info.requires_grad and not info.fresh_leaf and info.output_type in _PLAIN_OUTPUTS
    )


def _rooted_inputs(meta: ViewAndMutationMeta) -> frozenset[int]:
    """Inputs of an inference graph that the function wrote, with autograd watching, a
    value that required grad at trace time (from a leaf it made). See Note [Inference
    graphs and leaves made inside the function]."""
    if meta.is_train:
        return frozenset()
    return frozenset(
        idx
        for idx in meta.mutated_inp_runtime_indices
        if meta.input_info[idx].requires_grad
        and meta.input_info[idx].mutates_data
        and not meta.input_info[idx].mutations_hidden_from_autograd
        and not meta.input_info[idx].mutations_under_no_grad_or_inference_mode
    )


def _rooted_bases(meta: ViewAndMutationMeta) -> frozenset[int]:
    """Intermediate bases (indices into the extra base outputs) of an inference graph whose
    aliases required grad at trace time."""
    if meta.is_train:
        return frozenset()
    return frozenset(
        info.base_idx
        for info in meta.output_info
        if info.requires_grad
        and info.output_type in _INTERMEDIATE_BASES
        and info.base_idx is not None
    )


class _Rooted(torch.autograd.Function):
    """Identity on a hidden leaf: the result is a non-leaf, non-view tensor over the same
    memory whose grad_fn ends at that leaf."""

    @staticmethod
    def forward(ctx: Any, leaf: torch.Tensor) -> torch.Tensor:
        return as_plain_tensor(leaf)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def _hidden_leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_()


def make_epilogue(
    meta: ViewAndMutationMeta,
    relative_offsets: Sequence[int | None],
) -> Callable[[list[Any], Sequence[Any]], list[Any]]:
    """Build ``epilogue(compiled_args, forward_returns) -> user outputs``.

    ``relative_offsets[j]`` is output j's storage offset minus its base's at trace time
    (None when not an alias). See Note [Runtime epilogue order].
    """
    # See Note [Runtime epilogue order], step 0
    pre_call_alias = tuple(
        idx
        for idx in meta.mutated_inp_runtime_indices
        if meta.input_info[idx].view_meta_sequence is not None
    )
    mutations = [
        (
            pos,
            idx,
            meta.input_info[idx].mutates_data,
            meta.input_info[idx].mutates_metadata,
            meta.input_info[idx].mutates_storage_metadata,
            meta.input_info[idx].mutations_hidden_from_autograd
            or meta.input_info[idx].mutations_under_no_grad_or_inference_mode,
            meta.input_info[idx].is_leaf,
            meta.input_info[idx].view_meta_sequence,
        )
        for pos, idx in enumerate(meta.mutated_inp_runtime_indices)
    ]
    n_mut = len(mutations)
    n_out = meta.num_outputs
    plan = [
        (j, info.output_type, info.base_idx, info.requires_grad, relative_offsets[j],
         info.view_meta_sequence,
         # See Note [Views of inputs made under no_grad]
         info.requires_grad and not info.requires_grad_for_backward,
         info.grad_view_of_no_grad_view)
        for j, info in enumerate(meta.output_info)
        if info.is_regenerated_alias
    ]
    grad_mode_after = meta.grad_enabled_mutation
    # See Note [Inference graphs and leaves made inside the function]
    rooted_outputs = _rooted_outputs(meta)
    rooted_bases = _rooted_bases(meta)
    rooted_inputs = _rooted_inputs(meta)
    # See Note [Leaves made inside the function] in aotkit_analysis
    fresh_leaves = tuple(j for j, info in enumerate(meta.output_info) if info.fresh_leaf)

    if not needs_epilogue(meta):

        def plain(args: list[Any], returns: Sequence[Any]) -> list[Any]:
            return list(returns[:n_out])

        return plain

    data_written = any(m[2] for m in mutations)

    def epilogue(args: list[Any], returns: Sequence[Any]) -> list[Any]:
        pre: dict[int, torch.Tensor] = {}
        for idx in pre_call_alias:
            a = args[idx]
            pre[idx] = a.as_strided(a.size(), a.stride(), a.storage_offset())
        for pos, idx, data, metadata, storage, hidden, leaf, in_chain in mutations:
            new_layout = apply_view_meta_sequence(pre[idx], in_chain) if in_chain else None
            if idx in rooted_inputs and not args[idx].requires_grad:
                # See Note [Inference graphs and leaves made inside the function]
                with torch.enable_grad():
                    _apply_input_mutation(
                        args[idx], _hidden_leaf(returns[pos]), data=data, metadata=metadata,
                        storage=storage, hidden=hidden, leaf=leaf, new_layout=new_layout,
                    )
                continue
            _apply_input_mutation(
                args[idx], returns[pos], data=data, metadata=metadata, storage=storage,
                hidden=hidden, leaf=leaf, new_layout=new_layout,
            )
        if data_written:
            settle_pending()  # See Note [Saved inputs on a written storage]
        outs = list(returns[n_mut : n_mut + n_out])
        bases = returns[n_mut + n_out :]
        if rooted_outputs or rooted_bases:
            with torch.enable_grad():
                for j, as_view in rooted_outputs:
                    fresh = _hidden_leaf(outs[j])
                    outs[j] = fresh.view(fresh.shape) if as_view else _Rooted.apply(fresh)
                bases = [
                    _hidden_leaf(b) if i in rooted_bases else b for i, b in enumerate(bases)
                ]
        for j, kind, base_idx, requires_grad, rel, chain, no_grad_view, of_no_grad in plan:
            assert base_idx is not None
            if kind is OutputType.is_input:
                outs[j] = args[base_idx]
                continue
            if kind is OutputType.alias_of_input:
                base = pre.get(base_idx, args[base_idx]) if chain is not None else args[base_idx]
            elif kind is OutputType.alias_of_intermediate_base_is_user_output:
                base = outs[base_idx]
            else:
                base = bases[base_idx]
            with torch.no_grad() if no_grad_view or of_no_grad else contextlib.nullcontext():
                outs[j] = regenerate_alias(
                    base, outs[j], requires_grad=requires_grad,
                    relative_storage_offset=rel, view_chain=chain,
                )
            if of_no_grad:
                # See Note [Views of inputs made under no_grad]
                outs[j] = outs[j].view(outs[j].shape)
        for j in fresh_leaves:
            outs[j] = outs[j].detach().requires_grad_()
        if grad_mode_after is not None:
            torch.set_grad_enabled(grad_mode_after)
        return outs

    return epilogue

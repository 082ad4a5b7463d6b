"""The functionalized metadata pass: run the function once and record what it did.

The function runs on fake tensors wrapped as FunctionalTensors. Afterwards every input
wrapper knows whether it was mutated (and how), and every output's storage tells whether it
aliases an input, another output, or an intermediate. See Note [Input mutation kinds] and
Note [Output aliasing kinds] in aotkit_schemas.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch._functorch.config as functorch_config
from aotkit_functional import (
    EagerInplaceChecks,
    from_functional,
    functionalized,
    has_data_mutation,
    has_metadata_mutation,
    has_storage_mutation,
    is_leaf_input,
    is_multi_output_view,
    mutations_hidden_from_autograd,
    mutations_under_no_grad_or_inference_mode,
    overlaps_itself,
    python_mode_reason,
    recorded_view_chain,
    storage_ref,
    storage_was_changed,
    to_functional,
)
from aotkit_schemas import (
    InputAliasInfo,
    MutationType,
    OutputAliasInfo,
    OutputType,
    ViewAndMutationMeta,
)
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ._fresh_leaves import fresh_leaf_outputs


def _is_custom_function_output(t: torch.Tensor) -> bool:
    grad_fn = t.grad_fn
    return grad_fn is not None and (
        isinstance(grad_fn, torch.autograd.function.BackwardCFunction)
        or type(grad_fn).__name__ == "CppFunction"
    )


def _made_from_a_no_grad_view(t: torch.Tensor) -> bool:
    """A view whose autograd CreationMeta is NO_GRAD_MODE (it, or a view it was taken
    from, was made under no_grad). See Note [Views of inputs made under no_grad] in
    aotkit_runtime."""
    if not t._is_view():
        return False
    meta = torch._C._autograd._get_creation_meta(t)  # type: ignore[attr-defined]
    return bool(meta == torch._C._autograd.CreationMeta.NO_GRAD_MODE)  # type: ignore[attr-defined]


def _dynamic_dims(t: torch.Tensor) -> frozenset[int]:
    return frozenset(i for i, s in enumerate(t.shape) if not isinstance(s, int))


def input_alias_info(
    arg: Any, f_arg: Any, *, keep_input_mutations: bool
) -> InputAliasInfo:
    """What the function did to input ``arg``, read off its functional twin ``f_arg`` (a
    Python FunctionalTensor or a native wrapper) after the function ran."""
    storage = has_storage_mutation(f_arg, arg)
    # A set_ also writes the wrapper's data; that write counts for the no_grad question
    # (torch's rule) before the storage mutation suppresses the data flag.
    # See Note [set_ on an input].
    raw_data = has_data_mutation(f_arg)
    data = raw_data and not storage
    metadata = has_metadata_mutation(f_arg, arg)
    info = InputAliasInfo(
        is_leaf=isinstance(arg, torch.Tensor) and arg.is_leaf,
        mutates_data=data,
        mutates_metadata=metadata,
        mutations_hidden_from_autograd=(data or metadata) and mutations_hidden_from_autograd(f_arg),
        mutations_under_no_grad_or_inference_mode=raw_data
        and mutations_under_no_grad_or_inference_mode(f_arg),
        mutates_storage_metadata=storage,
        requires_grad=isinstance(f_arg, torch.Tensor) and f_arg.requires_grad,
        keep_input_mutations=keep_input_mutations,
        view_meta_sequence=recorded_view_chain(f_arg) if metadata and not storage else None,
    )
    _check_storage_mutation(info)
    return info


# Note [set_ on an input]
# ``x.set_(y)`` on an input swaps its storage. Two ways to honour it:
#   * in the graph (``keep_inference_input_mutations``): a trailing ``set_`` under no_grad,
#     allowed, as in torch, only when autograd need not see any of the input's mutations
#     (all under no_grad or hidden from autograd);
#   * out of the graph (aotkit only; torch raises): the epilogue swaps the caller's storage
#     after the graph ran. That is exact only when the swap is the input's one visible
#     change to autograd: a later ``x.mul_(2)`` that autograd records would have to be
#     replayed on the new storage with its grad_fn, which neither path can do.
# Every other combination raises torch's error instead of returning wrong values.


def _check_storage_mutation(info: InputAliasInfo) -> None:
    if not info.mutates_storage_metadata:
        return
    autograd_blind = (
        info.mutations_hidden_from_autograd or info.mutations_under_no_grad_or_inference_mode
    )
    if info.mutation_type is MutationType.MUTATED_IN_GRAPH:
        return
    if not info.keep_input_mutations and (autograd_blind or not info.requires_grad):
        return
    raise AssertionError(
        "Encountered a set_ on a graph input, but the input has other mutations that we cannot\n"
        "keep in the graph. This is not supported today. Current state:\n"
        f"  keep_input_mutations={info.keep_input_mutations}\n"
        f"  mutates_data={info.mutates_data}\n"
        f"  mutates_metadata={info.mutates_metadata}\n"
        f"  mutations_hidden_from_autograd={info.mutations_hidden_from_autograd}\n"
        "  mutations_under_no_grad_or_inference_mode="
        f"{info.mutations_under_no_grad_or_inference_mode}\n"
        f"  requires_grad={info.requires_grad}\n"
        "Fix: do the set_() and every other mutation of this input under torch.no_grad(), "
        "or pass keep_inference_input_mutations=False and leave the set_() as the input's "
        "only change that autograd sees."
    )


def _check_no_overlapping_input_mutated(
    flat_args: Sequence[Any], input_info: Sequence[InputAliasInfo]
) -> None:
    """See Note [Writes into an input whose elements share memory]."""
    for i, (a, info) in enumerate(zip(flat_args, input_info, strict=True)):
        if not (isinstance(a, torch.Tensor) and info.mutates_data):
            continue
        if is_traceable_wrapper_subclass(a) or not overlaps_itself(a):
            continue
        raise RuntimeError(
            f"aotkit: the function writes into input {i} (shape {tuple(a.shape)}, stride "
            f"{a.stride()}), whose elements share memory (an expanded tensor, or a view "
            "whose strides make elements overlap). In eager the write shows in every element that "
            "shares the location; a functional graph cannot express that, so aotkit does "
            "not compile it. Pass a tensor with memory of its own (x.contiguous() or "
            "x.clone()) instead. See Note [Writes into an input whose elements share "
            "memory] in aotkit_analysis."
        )


# Note [Writes into an input whose elements share memory]
# An input with internal overlap (``torch.randn(1).expand(4)``) can still be written
# through a view that does not overlap (``x[:1].add_(1)``); eager then shows the new value
# in all four elements, because they are one memory location. Functionalization treats
# the input's elements as independent (the updated input would be ``[a + 1, a, a, a]``),
# so every later read of the input in the graph, and the write-back into the caller's
# tensor (``copy_`` into overlapping memory, which eager rejects), would be wrong. Direct
# in-place ops on such a tensor raise eager's own error (See Note [In-place errors eager
# raises and functionalization hides]); a write that eager allows raises this clear
# error at trace time, before the caller's tensors are touched.


def tangent_like(t: torch.Tensor) -> torch.Tensor:
    """A fresh tensor with ``t``'s shape, dtype and device (never an alias), laid out as
    the tangent the backward is traced for. See Note [Tangents of subclass outputs] and
    Note [Tangent strides follow the outputs]."""
    if is_traceable_wrapper_subclass(t):
        # a tangent never requires grad (a subclass's flatten context may record it)
        t = t.detach()
        coerce = getattr(t, "__coerce_tangent_metadata__", None)
        if coerce is not None:
            t = coerce()
        attrs, ctx = t.__tensor_flatten__()
        inner = {
            a: tangent_like(v) if isinstance(v, torch.Tensor) else v
            for a, v in ((a, getattr(t, a)) for a in attrs)
        }
        size = t.shape
        stride = _format_strides(size, suggest_memory_format(t)) if size else ()
        return type(t).__tensor_unflatten__(inner, ctx, size, stride)  # type: ignore[attr-defined]
    if tangent_strides_follow_output(t):
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return torch.empty(
        t.shape, dtype=t.dtype, device=t.device, memory_format=suggest_memory_format(t)
    )


def tangent_strides_follow_output(t: torch.Tensor) -> bool:
    """Whether the tangent of plain output ``t`` is guessed with ``t``'s exact strides
    (else with its memory format). See Note [Tangent strides follow the outputs]."""
    return (
        bool(functorch_config.guess_tangent_strides_as_outputs)
        and not t._has_symbolic_sizes_strides
        and t.layout == torch.strided
        and torch._debug_has_internal_overlap(t) != 1
    )


def suggest_memory_format(t: torch.Tensor) -> torch.memory_format:
    """channels_last(_3d) when ``t`` is laid out so, else contiguous_format."""
    return torch._prims_common.suggest_memory_format(t)


def _format_strides(size: Sequence[Any], fmt: torch.memory_format) -> tuple[Any, ...]:
    dims = tuple(size)
    if fmt == torch.channels_last:
        return tuple(torch._prims_common.make_channels_last_2d_strides_for(dims))
    if fmt == torch.channels_last_3d:
        return tuple(torch._prims_common.make_channels_last_3d_strides_for(dims))
    return tuple(torch._prims_common.make_contiguous_strides_for(dims))


# Note [Tangents of subclass outputs]
# The backward is traced for tangents guessed from the outputs (Note [Tangent strides
# follow the outputs]), or, for a tensor subclass output, the same subclass, laid out in
# the output's memory format, around guesses of its inner tensors (after
# ``__coerce_tangent_metadata__``, which lets a subclass pick metadata every runtime
# tangent can be converted to: DTensor turns a Partial placement into Replicate). At run
# time each tangent is converted back to the traced metadata with
# ``__coerce_same_metadata_as_tangent__`` (aotkit_runtime's ``coerce_tangent``). See Note
# [Tensor subclasses are desugared] in aotkit_schemas.

# Note [Tangent strides follow the outputs]
# A tangent's strides are not known when the backward is traced ahead of time. As torch
# (``torch._functorch.config.guess_tangent_strides_as_outputs``, on by default), the
# guess is the output's own layout: a plain output with static sizes and no internal
# overlap gets a tangent with its exact strides (a channels_last conv output gets a
# channels_last tangent, not a ``contiguous()`` copy); a symbolic, internally overlapping
# (``expand``) or subclass output gets a tangent in its memory format
# (``suggest_memory_format``: channels_last(_3d) or contiguous). With the config off,
# every guess is by memory format. At run time the backward restrides each incoming
# tangent to the traced layout when it differs (``aotkit_runtime.coerce_tangent_layout``),
# so the compiled backward only ever sees the strides it was traced (and compiled) for.


def collect_metadata(
    flat_fn: Callable[..., Sequence[Any]],
    flat_args: Sequence[Any],
    *,
    keep_input_mutations: bool,
    is_train: bool,
    static_input_indices: Sequence[int] = (),
    eager_leaf_checks: bool = True,
) -> tuple[ViewAndMutationMeta, list[Any]]:
    """Run ``flat_fn`` functionalized on (fake) ``flat_args``; return its metadata.

    In-place ops eager rejects raise here with eager's message (See Note [In-place errors
    eager raises and functionalization hides]); ``eager_leaf_checks=False`` skips the
    check for leaves that require grad, for callers (export) that reject every mutation
    of an input that requires grad with their own error.

    Also returns the forward graph outputs as plain (fake) tensors, in the order of
    Note [Forward graph calling convention], for callers that need example outputs.
    """
    prior_grad = torch.is_grad_enabled()
    wrapped: dict[int, Any] = {}

    def wrap(a: Any) -> Any:
        if not isinstance(a, torch.Tensor):
            return a
        if id(a) not in wrapped:
            # See Note [Input wrappers that are autograd leaves] in aotkit_functional (not
            # for callers that reject input mutations with their own error)
            wrapped[id(a)] = to_functional(a, leaf=eager_leaf_checks and is_leaf_input(a))
        return wrapped[id(a)]

    # See Note [Effect tokens] in aotkit_tracing: the effectful ops' tokens are discovered
    with functionalized(
        keep_input_mutations=keep_input_mutations, allow_token_discovery=True
    ) as mode:
        f_args = [wrap(a) for a in flat_args]
        leaves = [
            fa
            for a, fa in zip(flat_args, f_args, strict=True)
            if eager_leaf_checks and isinstance(a, torch.Tensor) and a.is_leaf and a.requires_grad
        ]
        # See Note [In-place errors eager raises and functionalization hides]
        checks = EagerInplaceChecks(leaves)
        with checks, _unbacked_symbols_left_to_the_trace(flat_args):
            f_outs = list(flat_fn(*f_args))
        grad_after = torch.is_grad_enabled()
        # Everything below stays inside the mode: reading ``grad_fn`` of a view whose base
        # was mutated regenerates the view, which dispatches on FunctionalTensors.
        input_info = [
            input_alias_info(a, fa, keep_input_mutations=keep_input_mutations)
            for a, fa in zip(flat_args, f_args, strict=True)
        ]
        _check_no_overlapping_input_mutated(flat_args, input_info)
        output_info, intermediate_bases = _classify_outputs(f_args, f_outs)
        output_info = _with_view_chains(output_info, f_outs, input_info)

        tangent_sources: list[torch.Tensor] = []
        for fa, info in zip(f_args, input_info, strict=True):
            if (
                info.mutation_type is MutationType.MUTATED_OUT_GRAPH
                and info.mutates_data
                and info.requires_grad
            ):
                tangent_sources.append(fa)
        for o, oinfo in zip(f_outs, output_info, strict=True):
            if (
                oinfo.output_type
                in (
                    OutputType.non_alias,
                    OutputType.unsafe_view_alias,
                    OutputType.custom_function_view,
                )
                and isinstance(o, torch.Tensor)
                and oinfo.requires_grad_for_backward
            ):
                tangent_sources.append(o)
        tangent_sources.extend(intermediate_bases)
        plain_tangent_sources = [from_functional(t) for t in tangent_sources]

        mutated = [
            fa
            for fa, info in zip(f_args, input_info, strict=True)
            if info.mutation_type is MutationType.MUTATED_OUT_GRAPH
        ]
        fw_outs = [from_functional(t) for t in (*mutated, *f_outs, *intermediate_bases)]
        tokens = {k: from_functional(t) for k, t in mode._tokens.items()}
    grad_enabled_mutation: bool | None = None
    if grad_after != prior_grad:
        grad_enabled_mutation = grad_after
        torch.set_grad_enabled(prior_grad)
    traced_tangents = [tangent_like(t) for t in plain_tangent_sources]
    blocker = _native_blocker(checks, flat_args)
    meta = ViewAndMutationMeta(
        input_info=input_info,
        output_info=output_info,
        num_intermediate_bases=len(intermediate_bases),
        keep_input_mutations=keep_input_mutations,
        traced_tangents=traced_tangents if is_train else [],
        is_train=is_train,
        grad_enabled_mutation=grad_enabled_mutation,
        static_input_indices=tuple(static_input_indices),
        native_functionalization_ok=blocker is None,
        native_functionalization_blocker=blocker,
        tokens=tokens,
    )
    return meta, fw_outs


def _unbacked_symbols_left_to_the_trace(flat_args: Sequence[Any]) -> Any:
    """A data-dependent size (``x.item()`` fed to a factory) made by this run stays
    pending in the shape env, and the graph trace that follows would find it there
    and fail (``PendingUnbackedSymbolNotFound``). The symbols made here are not
    bound to any graph node, so the shape env is told not to expect them; the trace
    makes its own."""
    fake_mode = detect_fake_mode(flat_args)
    shape_env = getattr(fake_mode, "shape_env", None)
    if shape_env is None:
        return contextlib.nullcontext()
    return shape_env.ignore_fresh_unbacked_symbols()


def _native_blocker(checks: EagerInplaceChecks, flat_args: Sequence[Any]) -> str | None:
    """Why the C++ Functionalize key cannot trace this program (None: it can)."""
    if not checks.native_functionalization_ok:
        return python_mode_reason(checks.python_mode_op)
    for a in flat_args:
        if isinstance(a, torch.Tensor) and type(a) not in _NATIVE_INPUT_TYPES:
            return f"an input is a {type(a).__name__}"
    return None


# plain (fake) tensors; subclasses go through the Python mode (Note [Native
# functionalization] in aotkit_functional)
_NATIVE_INPUT_TYPES = (FakeTensor, torch.Tensor, torch.nn.Parameter)


def _twin_requiring_grad(o: torch.Tensor, f_outs: Sequence[Any]) -> torch.Tensor | None:
    """Another output that requires grad and views the same memory as ``o`` exactly."""
    for other in f_outs:
        if (
            other is not o
            and isinstance(other, torch.Tensor)
            and other.requires_grad
            and storage_ref(other) == storage_ref(o)
            and other.shape == o.shape
            and other.stride() == o.stride()
            and other.storage_offset() == o.storage_offset()
            and other.dtype == o.dtype
        ):
            return other
    return None


def _with_view_chains(
    output_info: list[OutputAliasInfo],
    f_outs: Sequence[Any],
    input_info: Sequence[InputAliasInfo],
) -> list[OutputAliasInfo]:
    """Attach to each alias_of_input output the view chain functionalization recorded from
    its input, replayed on the runtime input by the epilogue (See Note [View replay] in
    aotkit_functional). The chain starts from the input as passed, before any in-place
    view (``t_``) of it; not for an input whose storage the function swapped (set_)."""
    result = []
    for o, info in zip(f_outs, output_info, strict=True):
        if (
            info.output_type is OutputType.alias_of_input
            and info.base_idx is not None
            and not input_info[info.base_idx].mutates_storage_metadata
        ):
            chain = recorded_view_chain(o)
            if chain is not None:
                info = dataclasses.replace(info, view_meta_sequence=chain)
        elif info.output_type in _INTERMEDIATE_ALIASES and _base_is_chain_root(o, f_outs, info):
            # See Note [View replay of intermediate aliases]
            chain = recorded_view_chain(o)
            if chain is not None:
                info = dataclasses.replace(info, view_meta_sequence=chain)
        result.append(info)
    return result


# Note [View replay of intermediate aliases]
# An output that views an intermediate is rebuilt at run time from the base the graph
# returns (a user output, or an extra base output). As for views of inputs (See Note [View
# replay] in aotkit_functional), functionalization's recorded view chain of the output is
# replayed on that base, so the result has eager's view grad_fn even when the compiled
# graph's value cannot tell its own base (a compiler that hides ``_base``/``_view_func``,
# as torch's suite does). The chain starts at the root of the output's functional storage,
# so it is recorded only when the regenerated-from base is that root: the output's
# autograd ``_base`` (which is a root tensor), with an empty chain of its own (no
# in-place view such as ``t_`` applied to it). Otherwise the runtime falls back to view
# replay from the graph value, then to ``as_strided``.
_INTERMEDIATE_ALIASES = (
    OutputType.alias_of_intermediate,
    OutputType.alias_of_intermediate_save_as_output,
    OutputType.alias_of_intermediate_base_is_user_output,
)


def _base_is_chain_root(o: Any, f_outs: Sequence[Any], info: OutputAliasInfo) -> bool:
    base = getattr(o, "_base", None)
    if base is None or info.base_idx is None:
        return False
    if info.output_type is OutputType.alias_of_intermediate_base_is_user_output:
        if f_outs[info.base_idx] is not base:
            return False  # regenerated from a twin (``y.detach()``), not from the base
    return recorded_view_chain(base) == []


def _classify_outputs(
    f_args: Sequence[Any], f_outs: Sequence[Any]
) -> tuple[list[OutputAliasInfo], list[torch.Tensor]]:
    """Give every output its OutputType. See Note [Output aliasing kinds]."""
    input_storage: dict[int, int] = {}
    for i, fa in enumerate(f_args):
        if isinstance(fa, torch.Tensor):
            input_storage.setdefault(storage_ref(fa), i)
    input_ids = {id(fa) for fa in f_args if isinstance(fa, torch.Tensor)}
    output_position = {id(o): j for j, o in enumerate(f_outs) if isinstance(o, torch.Tensor)}
    aliases_per_storage: Counter[int] = Counter()
    multi_view_per_storage: Counter[int] = Counter()
    for o in f_outs:
        if isinstance(o, torch.Tensor):
            aliases_per_storage[storage_ref(o)] += 1
            if is_multi_output_view(o):
                multi_view_per_storage[storage_ref(o)] += 1

    infos: list[OutputAliasInfo] = []
    bases: list[torch.Tensor] = []
    base_position: dict[int, int] = {}
    for o in f_outs:
        if not isinstance(o, torch.Tensor):
            infos.append(OutputAliasInfo(OutputType.non_alias, type(o), None, None, False))
            continue
        st = storage_ref(o)
        non_multi_aliases = aliases_per_storage[st] - multi_view_per_storage[st]
        grad_fn = o.grad_fn
        base_idx: int | None = None
        if st in input_storage and _is_custom_function_output(o):
            kind = OutputType.custom_function_view
        elif st in input_storage and not storage_was_changed(o):
            if grad_fn is not None and non_multi_aliases == 0:
                kind = OutputType.non_alias
            elif id(o) in input_ids:
                kind, base_idx = OutputType.is_input, input_storage[st]
            else:
                kind, base_idx = OutputType.alias_of_input, input_storage[st]
        elif storage_was_changed(o) and id(o) in input_ids:
            kind, base_idx = OutputType.is_input, input_storage[st]
        elif o._base is not None and o.requires_grad and o._base.requires_grad:
            # a view made under no_grad (requires_grad, no grad_fn) is regenerated from its
            # base under no_grad, never returned as a plain tensor: autograd would make it
            # non-differentiable (See Note [Views of inputs made under no_grad] in
            # aotkit_runtime)
            if (aliases_per_storage[st] == 1 or non_multi_aliases <= 1) and grad_fn is not None:
                kind = OutputType.unsafe_view_alias
            elif id(o._base) in output_position:
                kind = OutputType.alias_of_intermediate_base_is_user_output
                base_idx = output_position[id(o._base)]
            elif id(o._base) in base_position:
                kind, base_idx = OutputType.alias_of_intermediate, base_position[id(o._base)]
            else:
                kind = OutputType.alias_of_intermediate_save_as_output
                base_idx = base_position[id(o._base)] = len(bases)
                bases.append(o._base)
        elif (
            aliases_per_storage[st] > 1
            and not o.requires_grad
            and (twin := _twin_requiring_grad(o, f_outs)) is not None
        ):
            # ``return y, y.detach()``: regenerate the detached alias from ``y``.
            kind = OutputType.alias_of_intermediate_base_is_user_output
            base_idx = output_position[id(twin)]
        elif (
            o._base is not None
            and id(o._base) in output_position
            and o.shape == o._base.shape
            and o.stride() == o._base.stride()
            and o.storage_offset() == o._base.storage_offset()
            and o.dtype == o._base.dtype
        ):
            kind = OutputType.alias_of_intermediate_base_is_user_output
            base_idx = output_position[id(o._base)]
        else:
            kind = OutputType.non_alias
        requires_grad = bool(o.requires_grad)
        infos.append(
            OutputAliasInfo(
                output_type=kind,
                raw_type=torch.Tensor,
                base_idx=base_idx,
                dynamic_dims=_dynamic_dims(o),
                requires_grad=requires_grad,
                requires_grad_for_backward=requires_grad and (o._base is None or grad_fn is not None),
                grad_view_of_no_grad_view=requires_grad
                and grad_fn is not None
                and _made_from_a_no_grad_view(o),
            )
        )
    # See Note [Leaves made inside the function]
    for j in fresh_leaf_outputs(f_args, f_outs):
        if infos[j].output_type is OutputType.non_alias:
            infos[j] = dataclasses.replace(infos[j], fresh_leaf=True)
    return infos, bases

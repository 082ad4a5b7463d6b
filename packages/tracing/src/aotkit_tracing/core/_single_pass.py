"""One native trace that yields both the metadata and the joint graph of a plain program.

# Note [Single-pass joint trace]
# The general flow runs the user's function twice on fake tensors: once under torch's
# Python FunctionalTensorMode to collect ViewAndMutationMeta, then again inside make_fx to
# trace the joint graph, whose tangent placeholders depend on that metadata. Most training
# programs are plain: they mutate no input, return no alias, keep grad mode, run only
# native ATen ops, on inputs with static shapes. For those the metadata is fully
# determined by the outputs (every output is non_alias; the tangents are the outputs that
# require grad), so ``trace_single_pass`` traces the joint directly with native
# functionalization (See Note [Native functionalization] in aotkit_functional): the
# forward runs once, the metadata is read off its outputs, a tangent placeholder is added
# for every output that requires grad, and the backward is traced into the same graph.
# The result is the graph the two-pass flow produces (same nodes, same names, same
# calling convention: placeholders ``primals_*`` then ``tangents_*``).
#
# Module state updated in training (BatchNorm's running stats and ``num_batches_tracked``)
# is covered too: an input that does not require grad and whose data the function writes
# is a mutated input exactly as the metadata pass would record it (``input_alias_info``
# on its functional twin), and its new value is returned first, before the outputs
# (Note [Forward graph calling convention]). ``torch.batch_norm`` itself is intercepted
# above autograd and called as the op torch's Python dispatcher decomposes
# ``native_batch_norm`` to (``_native_batch_norm_legit``, whose schema declares the
# running-stat writes), because native_batch_norm's own schema hides them from the C++
# Functionalize key.
#
# Whatever breaks the assumptions raises ``NotSinglePass`` and the caller falls back to
# the two-pass flow, which then reports user errors with its own checks:
#   * an op the Python mode treats differently (custom ops, HOPs, native_batch_norm, ...),
#     seen by a dispatch mode under the Functionalize key, or left in the graph;
#   * an in-place op on a tensor whose elements overlap (an expanded view): eager raises,
#     functionalization would not; an out= op (See Note [out= keeps the out tensor's
#     layout] in aotkit_functional);
#   * an input mutated other than in its data, or one that requires grad (the two-pass
#     flow's clone-before-mutate), any output that is a view, an input, a repeat of another
#     output or shares another tensor's storage;
#   * grad mode changed, no output requiring grad (an inference program), no input that
#     requires grad.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from aotkit_analysis import input_alias_info, tangent_like
from aotkit_functional import (
    from_native_functional,
    has_metadata_mutation,
    input_was_changed,
    mutation_count,
    natively_functionalized,
    needs_python_functionalization,
    overlaps_itself,
    python_mode_reason,
    storage_ref,
    to_native_functional,
)
from aotkit_schemas import (
    DecompositionTable,
    InputAliasInfo,
    MutationType,
    OutputAliasInfo,
    OutputType,
    ViewAndMutationMeta,
)
from torch.fx._lazy_graph_module import _use_lazy_graph_module
from torch.fx.experimental.proxy_tensor import (
    disable_proxy_modes_tracing,
    get_proxy_mode,
    make_fx,
    track_tensor_tree,
)
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from aotkit_tracing._hops import hop_in_traceback
from aotkit_tracing._rng_replay import (
    RngTimeline,
    draws_randomness,
    keyed_rng,
    trace_layer,
    unkeyed_if_nothing_drew,
)
from aotkit_tracing._rng_states import NeedsStateOps, rewrite_rng_states
from aotkit_tracing.autocast._autocast_cache import (
    caller_cache_flag,
    cast_cache_leaf,
    check_leaf_flags,
    eager_cast_cache,
    wrapped_as_leaf,
)

from ._direct_decompositions import direct_decompositions, fake_mode_of
from ._grad_flags import BackwardViewFlags, FlagRead, GradFlags
from ._grad_mode_kernels import joint_kernel_choices
from ._joint_parts import STALE_TANGENTS_KEY, primal_grads
from ._saved_detaches import (
    SavedOutputRecorder,
    forward_end,
    match_python_mode_graph,
    nodes_made_so_far,
    tag_forward_and_backward,
)
from ._trace import (
    FlatFn,
    apply_kept_mutation,
    last_graph_node,
    move_kept_mutations,
    needs_python_mode,
)
from ._trace_scope import backward_spanning_scope


class NotSinglePass(Exception):
    """The program needs the two-pass flow. See Note [Single-pass joint trace]."""


class _NativeOpGate:
    """The forward's layer (See Note [One dispatch frame for aotkit's trace layers]): sits
    under the Functionalize key and stops at the first op the Python mode would treat
    differently (higher-order operators included: See Note [Higher-order operators]), and
    sets the forward's fake-cache flags."""

    def __init__(self, flags: GradFlags | None = None) -> None:
        # See Note [Fake-cache keys of the single pass's forward]
        self.flags = flags

    def __call__(
        self,
        func: Any,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        run: Callable[..., Any],
    ) -> Any:
        if needs_python_functionalization(func):
            raise NotSinglePass(python_mode_reason(func))
        out = run(func, args, kwargs)
        if self.flags is not None:
            try:
                self.flags.after_op(args, out)
            except FlagRead as e:
                raise NotSinglePass(str(e)) from None
        return out


# TorchFunctionMode carries no annotations in torch.
class _FunctionGate(TorchFunctionMode):  # type: ignore[misc]
    """One torch-function layer for the single pass (See Note [Single-pass joint trace]):
    * stops at an in-place call (``x.add_``, ``x += y``, ``x[i] = v``) that writes to a
      tensor whose elements share memory, and at every ``out=`` call;
    * runs ``F.batch_norm`` and ``torch.batch_norm`` as the ``_native_batch_norm_legit``
      op family, whose schemas declare the running-stat writes."""

    def __torch_function__(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.batch_norm and _on_cpu(args, kwargs):
            bound = _F_BATCH_NORM.bind(*args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            if a["training"]:
                torch.nn.functional._verify_batch_size(a["input"].size())  # type: ignore[attr-defined]
            return _legit_batch_norm(
                a["input"],
                a["weight"],
                a["bias"],
                a["running_mean"],
                a["running_var"],
                a["training"],
                a["momentum"],
                a["eps"],
            )
        if func is torch.batch_norm and not kwargs and _on_cpu(args, kwargs):
            return _legit_batch_norm(*args[:8])
        name = getattr(func, "__name__", "")
        writes = (
            (name.endswith("_") and not name.endswith("__"))
            or name.startswith("__i")
            or name == "__setitem__"
        )
        targets: list[Any] = []
        if writes and args:
            targets.append(args[0])
        if "out" in kwargs and kwargs["out"] is not None:
            # See Note [out= keeps the out tensor's layout] in aotkit_functional: only
            # the Python mode keeps the out tensor's eager layout
            raise NotSinglePass("an out= op")
        for t in targets:
            if isinstance(t, torch.Tensor) and overlaps_itself(t):
                raise NotSinglePass("an in-place write to overlapping memory")
        return func(*args, **kwargs)


def _on_cpu(args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """batch_norm's input is on the CPU, where torch decomposes it to the legit op family
    (elsewhere cuDNN and friends take other paths; the op gate then abandons)."""
    x = args[0] if args else kwargs.get("input")
    return isinstance(x, torch.Tensor) and x.device.type == "cpu"


_F_BATCH_NORM = inspect.signature(torch.nn.functional.batch_norm)


def _legit_batch_norm(
    x: Any,
    weight: Any,
    bias: Any,
    running_mean: Any,
    running_var: Any,
    training: bool,
    momentum: float,
    eps: float,
) -> Any:
    """``torch.batch_norm``'s output, computed with the op torch's Python dispatcher
    decomposes native_batch_norm to."""
    aten = torch.ops.aten
    # _batch_norm_impl_index allocates an empty "reserve" tensor it does not use; the
    # Python dispatcher's trace records it, so the graph (and its node names) match
    aten.empty.memory_format([0], dtype=torch.uint8, layout=torch.strided, device=x.device)
    if running_mean is None and running_var is None:
        return aten._native_batch_norm_legit.no_stats(x, weight, bias, training, momentum, eps)[0]
    if running_mean is None or running_var is None:
        # native_batch_norm raises its own error (and the op gate abandons the single pass)
        return torch.batch_norm(
            x, weight, bias, running_mean, running_var, training, momentum, eps, False
        )
    if training:
        return aten._native_batch_norm_legit.default(
            x, weight, bias, running_mean, running_var, training, momentum, eps
        )[0]
    return aten._native_batch_norm_legit_no_training.default(
        x, weight, bias, running_mean, running_var, momentum, eps
    )[0]


def _mutated_inputs(
    primals: Sequence[Any], f_primals: Sequence[Any], keep_input_mutations: bool
) -> list[InputAliasInfo]:
    """Every input's InputAliasInfo, as the metadata pass records it; raises NotSinglePass
    unless each mutation is a data write to an input that does not require grad."""
    infos = [
        input_alias_info(p, fp, keep_input_mutations=keep_input_mutations)
        for p, fp in zip(primals, f_primals, strict=True)
    ]
    for info in infos:
        if (
            info.mutates_metadata
            or info.mutates_storage_metadata
            or (info.mutates_data and info.requires_grad)
        ):
            raise NotSinglePass("the function mutates an input in a way the two-pass flow handles")
    return infos


def _output_kinds(f_primals: Sequence[Any], outs: Sequence[Any]) -> list[OutputType]:
    """Every output's OutputType, as the metadata pass gives it; raises NotSinglePass
    unless each output owns its memory, or is the only output viewing an intermediate
    (``unsafe_view_alias`` when both require grad, else ``non_alias``; See Note [Output
    aliasing kinds] in aotkit_analysis)."""
    storages = {storage_ref(p) for p in f_primals if isinstance(p, torch.Tensor)}
    kinds = []
    for o in outs:
        if not isinstance(o, torch.Tensor):
            kinds.append(OutputType.non_alias)
            continue
        if o.is_leaf and o.requires_grad:
            # See Note [Leaves made inside the function] in aotkit_analysis
            raise NotSinglePass("an output is a leaf made inside the function")
        st = storage_ref(o)
        if st in storages:
            raise NotSinglePass("an output aliases an input or another output")
        storages.add(st)
        view_of_grad = o._base is not None and o.requires_grad and o._base.requires_grad
        if view_of_grad and o.grad_fn is None:
            # See Note [Views of inputs made under no_grad] in aotkit_runtime
            raise NotSinglePass("an output is a view made under no_grad")
        kinds.append(OutputType.unsafe_view_alias if view_of_grad else OutputType.non_alias)
    return kinds


def _meta(
    inputs: list[InputAliasInfo],
    outs: Sequence[Any],
    kinds: Sequence[OutputType],
    tangents: Sequence[torch.Tensor],
    static_input_indices: Sequence[int],
) -> ViewAndMutationMeta:
    outputs = [
        OutputAliasInfo(
            kind,
            torch.Tensor,
            None,
            frozenset(),
            bool(o.requires_grad),
            bool(o.requires_grad) and (o._base is None or o.grad_fn is not None),
        )
        if isinstance(o, torch.Tensor)
        else OutputAliasInfo(OutputType.non_alias, type(o), None, None, False)
        for o, kind in zip(outs, kinds, strict=True)
    ]
    return ViewAndMutationMeta(
        input_info=inputs,
        output_info=outputs,
        num_intermediate_bases=0,
        keep_input_mutations=False,
        traced_tangents=list(tangents),
        is_train=True,
        static_input_indices=tuple(static_input_indices),
        native_functionalization_ok=True,
    )


def trace_single_pass(
    flat_fn: FlatFn,
    fake_args: Sequence[Any],
    decompositions: DecompositionTable,
    *,
    static_input_indices: Sequence[int] = (),
    keep_input_mutations: bool = False,
) -> tuple[torch.fx.GraphModule, list[Any], ViewAndMutationMeta, list[Any]]:
    """Trace the joint graph and collect its metadata in one pass, or raise NotSinglePass.

    With ``keep_input_mutations``, data writes to inputs that autograd need not see end the
    joint as ``copy_`` into their placeholder, as in the two-pass flow (See Note [Input
    mutations kept in the training graph]).

    Returns ``(joint, [primals, tangents], meta, forward outputs)``; See Note [Single-pass
    joint trace]. Call it under the fake mode of ``fake_args``, with grad mode on.
    """
    if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in fake_args):
        raise NotSinglePass("no input requires grad")
    found: dict[str, Any] = {}
    stale_tangents: dict[int, tuple[str, str]] = {}

    def joint(primals: list[Any]) -> list[Any]:
        # See Note [Contexts that span the backward trace]
        with backward_spanning_scope(), natively_functionalized():
            # See Note [Autocast's cast cache in the trace]
            f_primals = [to_native_functional(p, leaf=cast_cache_leaf(p)) for p in primals]
            # See Note [Fake-cache keys of the single pass's forward]
            flags = None if decompositions else GradFlags()
            try:
                leaves = [wrapped_as_leaf(p) for p in f_primals]
                # See Note [One dispatch frame for aotkit's trace layers]
                with (
                    _FunctionGate(),
                    trace_layer(_NativeOpGate(flags)),
                    eager_cast_cache(cache_flag),
                ):
                    try:
                        outs = list(flat_fn(*f_primals))
                    except NotSinglePass:
                        raise
                    except Exception as e:
                        hop = hop_in_traceback(e)  # See Note [Higher-order operators]
                        if hop is None:
                            raise
                        reason = f"the higher-order operator {hop} needs the Python functionalization mode"
                        raise NotSinglePass(reason) from e
                check_leaf_flags(f_primals, leaves)
            finally:
                if flags is not None:
                    flags.clear()
            if not torch.is_grad_enabled():
                raise NotSinglePass("the function changed grad mode")
            if any(isinstance(o, torch.Tensor) and is_traceable_wrapper_subclass(o) for o in outs):
                # See Note [Tensor subclasses are desugared] in aotkit_schemas
                raise NotSinglePass("a tensor subclass output")
            input_info = _mutated_inputs(primals, f_primals, keep_input_mutations)
            in_graph = [
                (i, info)
                for i, info in enumerate(input_info)
                if info.mutation_type is MutationType.MUTATED_IN_GRAPH
            ]
            kept_updates = [from_native_functional(f_primals[i]) for i, _ in in_graph]
            found["kinds"] = _output_kinds(f_primals, outs)
            positions = [
                j for j, o in enumerate(outs) if isinstance(o, torch.Tensor) and o.requires_grad
            ]
            if not positions:
                raise NotSinglePass("no output requires grad")
            tangents = _tangent_placeholders([outs[j] for j in positions])
            f_tangents = [to_native_functional(t) for t in tangents]
            writes_after_forward = [mutation_count(fp) for fp in f_primals]
            found["forward_made"] = nodes_made_so_far()
            # See Note [Detach nodes of saved outputs]
            saved_outputs.watch([outs[j] for j in positions])
            try:
                # See Note [An unkeyed backward] and Note [Fake-cache keys of the single
                # pass's backward] (its flags under the forward's guard)
                view_flags = BackwardViewFlags() if flags is not None else None
                with unkeyed_if_nothing_drew(view_flags) as unkeyed:
                    grads, failed = primal_grads(
                        [(k, outs[j], f_tangents[k]) for k, j in enumerate(positions)], f_primals
                    )
            finally:
                saved_outputs.close()
            found["unkeyed_backward"] = unkeyed
            stale_tangents.update(failed)
            if any(
                mutation_count(fp) != n or has_metadata_mutation(fp, p)
                for fp, p, n in zip(f_primals, primals, writes_after_forward, strict=True)
            ) or any(input_was_changed(f, t) for f, t in zip(f_tangents, tangents, strict=True)):
                # a custom backward mutated a saved input or a tangent: the two-pass flow
                # raises torch's error (Note [Metadata mutations in the backward])
                raise NotSinglePass("the backward mutates an input")
            # See Note [Forward graph calling convention]: mutated inputs' new values first
            mutated = [
                fp
                for fp, info in zip(f_primals, input_info, strict=True)
                if info.mutation_type is MutationType.MUTATED_OUT_GRAPH
            ]
            plain_outs = [from_native_functional(o) for o in (*mutated, *outs)]
            plain_grads = [from_native_functional(g) if g is not None else None for g in grads]
        # See Note [Input mutations kept in the training graph]
        kept_nodes_start = len(last_graph_node().graph.nodes)
        for (i, info), new in zip(in_graph, kept_updates, strict=True):
            apply_kept_mutation(primals[i], new, info)
        found.update(kept_nodes_start=kept_nodes_start, n_kept=len(in_graph))
        found.update(input_info=input_info, f_outs=outs, outs=plain_outs, tangents=tangents)
        return [*plain_outs, *plain_grads]

    saved_outputs = SavedOutputRecorder()
    primals = list(fake_args)
    cache_flag = caller_cache_flag()
    try:
        with (
            torch.autograd.set_multithreading_enabled(False),
            _use_lazy_graph_module(True),
            joint_kernel_choices(),  # See Note [Kernels that read grad mode]
            direct_decompositions(fake_mode_of(primals)),  # See Note [Decompositions run directly on meta]
        ):
            timeline = RngTimeline()
            gm = make_fx(keyed_rng(joint, timeline), decomposition_table=decompositions)(primals)
    finally:
        # a function that switched grad mode off and was abandoned must not leave it off
        torch.set_grad_enabled(True)
    # the kept input mutations' copy_ nodes end the joint (the Python mode makes the same)
    kept = next(
        (n for n in list(gm.graph.nodes)[: found["kept_nodes_start"]] if needs_python_mode(n)),
        None,
    )
    if kept is not None:  # an effectful op in a custom backward, for one
        raise NotSinglePass(f"the traced graph keeps {kept.target}, which the Python mode rewrites")
    if found["unkeyed_backward"] and draws_randomness(gm.graph):
        # the forward drew nothing, so every random op is the backward's: See Note [An
        # unkeyed backward]
        raise NotSinglePass("a random op in the backward of a forward that draws none")
    try:  # See Note [RNG replay keys] and Note [Generator states the function sets]
        rewrite_rng_states(gm, timeline, state_ops=False)
    except NeedsStateOps as e:
        raise NotSinglePass(str(e)) from e
    tangents: list[torch.Tensor] = found["tangents"]
    # See Note [Forward and backward tags]
    end = forward_end(gm.graph, found["forward_made"])
    if found["n_kept"]:
        end = move_kept_mutations(gm, end, found["n_kept"])
    tag_forward_and_backward(gm.graph, end)
    match_python_mode_graph(gm, saved_outputs)
    _move_tangents_after_primals(gm, primals, tangents)
    meta = _meta(
        found["input_info"], found["f_outs"], found["kinds"], tangents, static_input_indices
    )
    # See Note [Backward paths through stale saved values] in _capture
    gm.meta[STALE_TANGENTS_KEY] = stale_tangents
    return gm, [primals, tangents], meta, list(found["outs"])


def _tangent_placeholders(outs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Fresh fake tangents for ``outs``, each bound to a new ``tangents_k`` placeholder of
    the graph being traced."""
    mode = get_proxy_mode()
    assert mode is not None, "trace_single_pass runs inside make_fx"
    tracer = mode.tracer
    tangents = []
    exclude = torch._C._ExcludeDispatchKeyGuard(
        torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)
    )
    with disable_proxy_modes_tracing(), exclude:
        for k, o in enumerate(outs):
            # laid out like the tangents of the two-pass flow; See Note [Tangent strides
            # follow the outputs] in aotkit_analysis
            t = tangent_like(o)
            name = f"tangents_{k + 1}"
            proxy = tracer.create_proxy("placeholder", name, (), {}, name=name)
            track_tensor_tree(t, proxy, constant=None, tracer=tracer)
            tangents.append(t)
    return tangents


def _move_tangents_after_primals(
    gm: torch.fx.GraphModule, primals: Sequence[Any], tangents: Sequence[torch.Tensor]
) -> None:
    """Put the tangent placeholders after the primal ones and make the graph's signature
    ``(primals, tangents)``, as if they had been inputs from the start."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    primal_nodes = placeholders[: len(primals)]
    tangent_nodes = placeholders[len(primals) :]
    assert len(tangent_nodes) == len(tangents)
    assert primal_nodes, "a joint graph has at least one primal that requires grad"
    anchor = primal_nodes[-1]
    for node in tangent_nodes:
        anchor.append(node)
        anchor = node
    codegen = gm.graph._codegen
    assert isinstance(codegen, torch.fx.graph._PyTreeCodeGen)
    info = codegen.pytree_info
    in_spec = pytree.tree_structure((list(primals), list(tangents)))
    gm.graph._codegen = torch.fx.graph._PyTreeCodeGen(
        torch.fx.graph._PyTreeInfo(["primals", "tangents"], in_spec, info.out_spec)
    )
    gm.recompile()

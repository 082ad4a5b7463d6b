"""Tracing graphs for export: the front half of the compile_flat pipeline, no runtime.

    flat args ──fakify──▶ metadata pass ──validate──▶ inference or joint trace ──▶ TracedGraphs

Export hands the traced graph itself to the user, so its calling convention must be the
user's flat inputs, one placeholder each: inputs are never deduplicated or merged into
synthetic bases (See Note [Duplicate and aliased inputs]). A tensor passed twice becomes
two distinct inputs (``_distinct_tensors``); a repeated or aliased input that is mutated
is rejected.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch._functorch.config as functorch_config
import torch.fx
from aotkit_analysis import compute_input_layout
from aotkit_functional import leaf_inputs
from aotkit_schemas import AOTConfig, ViewAndMutationMeta
from aotkit_tracing import (
    FlatFn,
    checking_input_rebinds,
    explain_tracing_errors,
    needs_subclass_layer,
    new_compilation,
    token_inputs,
    trace_inference,
    trace_joint,
)
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from aotkit_capture._saved_tensor_hooks import hooks_hidden_while_tracing
from aotkit_capture.compile._compile import _as_inference, _metadata, _output_needs_grad
from aotkit_capture.compile._compile_lock import COMPILE_LOCK
from aotkit_capture.compile._compiled_calls import _tracing_context
from aotkit_capture.inputs._fakify import construct_fake_mode
from aotkit_capture.inputs._generators import check_no_created_generators, recording_generators

from ._export_pre_dispatch import trace_pre_dispatch


class AOTExportError(RuntimeError):
    """A function or module breaks one of the restrictions of aotkit's export APIs."""


DUPLICATED_MUTATED_INPUT_MESSAGE = (
    "Encountered duplicated inputs that are mutated in the graph you are trying to export.\n"
    "This functionality is not supported: flat inputs {indices} are the same tensor and the "
    "function mutates it. Pass distinct tensors (clone one of them) before exporting."
)

ALIASED_MUTATED_INPUT_MESSAGE = (
    "Encountered aliased inputs that are mutated in the graph you are trying to export.\n"
    "This functionality is not supported: flat inputs {indices} share memory and at least "
    "one of them is mutated. Clone the inputs before exporting."
)

SUBCLASS_MESSAGE = (
    "aot_export is not currently supported with traceable tensor subclass.\n"
    "If you need this feature, please comment on <CREATE_ISSUE_LINK>\n"
    "(aotkit: export the module with plain tensors, for example by calling a subclass "
    "parameter's own conversion (DTensor.full_tensor(), dequantize()) first; aot_function, "
    "aot_module and torch.compile support subclasses.)"
)
EFFECTS_EXPORT_MESSAGE = (
    "aotkit: effectful ops ({effects}) in a {kind} export are not supported: only the "
    "inference graph of aot_export_module/aot_export_joint_simple threads effect tokens "
    "(torch 2.15's joint export fails on them too). Export with trace_joint=False, or "
    "move the effectful op out of the exported module. See Note [Effect tokens]."
)
FUNCTIONALIZED_RNG_MESSAGE = (
    "Functionalized RNG is not currently supported in the aot_export workflow. Set "
    "torch._functorch.config.functionalize_rng_ops = False to export."
)


@dataclass
class TracedGraphs:
    """The result of ``trace_for_export``."""

    meta: ViewAndMutationMeta
    # fake versions of the flat inputs, in the same order (no dedupe, no synthetic bases),
    # after the effect tokens of an inference graph (See Note [Effect tokens])
    fake_args: list[Any]
    # ``joint(primals, tangents) -> (*forward_returns, *input_grads)`` when ``meta.is_train``
    # (See Note [Joint graph calling convention]), else ``inference(*args) -> forward returns``;
    # with ``pre_dispatch``, the finished export graph (See Note [Pre-dispatch export])
    graph: torch.fx.GraphModule
    fake_mode: FakeTensorMode
    symbolic: bool


def trace_for_export(
    flat_fn: FlatFn,
    flat_args: Sequence[Any],
    cfg: AOTConfig,
    validate: Callable[[ViewAndMutationMeta], None] | None = None,
    *,
    pre_dispatch: bool = False,
) -> TracedGraphs:
    """Run the metadata pass, ``validate`` the metadata, then trace the graph.

    A training graph is traced when grad mode is on and some input requires grad and some
    output (or visible mutation) needs it; otherwise the inference graph. With
    ``pre_dispatch`` it is always an inference graph, traced above autograd (See Note
    [Pre-dispatch export]); its placeholders are already the flat inputs.
    """
    if functorch_config.functionalize_rng_ops:
        raise AOTExportError(FUNCTIONALIZED_RNG_MESSAGE)
    flat_args, repeated = _distinct_tensors(flat_args)
    # See Note [Generators created while tracing] and Note [Contexts that span the
    # backward trace]
    # See Note [Input wrappers that are autograd leaves] in aotkit_functional
    # See Note [Concurrent first calls]
    with COMPILE_LOCK, recording_generators() as created, new_compilation(), leaf_inputs("none"):
        traced = _trace_for_export(
            checking_input_rebinds(flat_fn), flat_args, cfg, validate, pre_dispatch, repeated
        )  # See Note [Input changes no graph records]
    check_no_created_generators(created, (traced.graph,))
    return traced


def _trace_for_export(
    flat_fn: FlatFn,
    flat_args: list[Any],
    cfg: AOTConfig,
    validate: Callable[[ViewAndMutationMeta], None] | None,
    pre_dispatch: bool,
    repeated: list[list[int]],
) -> TracedGraphs:
    layout = compute_input_layout(flat_args)
    assert layout.is_trivial, "distinct inputs are never deduplicated"
    fake_mode, shape_env = construct_fake_mode(flat_args, dynamic=cfg.dynamic_shapes)
    symbolic = shape_env is not None
    # See Note [Inlined saved-tensors hooks]: the caller's hooks never see fake tensors
    with explain_tracing_errors(), _tracing_context(fake_mode, symbolic), hooks_hidden_while_tracing():
        meta, fake, traced_fn, fw_outs = _metadata(
            flat_fn, flat_args, layout, cfg, fake_mode, shape_env
        )
        if needs_subclass_layer(fake, fw_outs):
            # torch 2.15's aot_export rejects subclasses too (See Note [Tensor subclasses
            # are desugared] in aotkit_schemas for what aot_function does with them)
            raise AOTExportError(SUBCLASS_MESSAGE)
        for group in repeated:
            if any(meta.input_info[i].mutates_anything for i in group):
                raise AOTExportError(DUPLICATED_MUTATED_INPUT_MESSAGE.format(indices=group))
        if meta.is_train and (pre_dispatch or not _output_needs_grad(meta)):
            meta = _as_inference(meta, cfg.keep_inference_input_mutations)
        if validate is not None:
            validate(meta)
        with_bases = compute_input_layout(
            flat_args, lambda i: meta.input_info[i].mutates_anything
        )
        if not with_bases.is_trivial:
            members = sorted(m.user_index for g in with_bases.synthetic_bases for m in g.members)
            raise AOTExportError(ALIASED_MUTATED_INPUT_MESSAGE.format(indices=members))
        if meta.tokens and (pre_dispatch or meta.is_train):
            raise AOTExportError(
                EFFECTS_EXPORT_MESSAGE.format(
                    effects=", ".join(str(k) for k in meta.tokens),
                    kind="pre-dispatch" if pre_dispatch else "joint",
                )
            )
        if pre_dispatch:
            graph = trace_pre_dispatch(traced_fn, fake, meta, cfg.decompositions)
        elif meta.is_train:
            graph, _ = trace_joint(traced_fn, fake, meta, cfg.decompositions)
        else:
            graph = trace_inference(traced_fn, fake, meta, cfg.decompositions)
            # See Note [Effect tokens]: the exported graph takes the tokens first
            fake = [*token_inputs(meta), *fake]
    return TracedGraphs(meta, fake, graph, fake_mode, symbolic)


def _distinct_tensors(flat_args: Sequence[Any]) -> tuple[list[Any], list[list[int]]]:
    """The flat inputs with every tensor a distinct object, and the groups of positions
    that held the same tensor.

    An exported graph takes one placeholder per flat input, and a tensor may come twice:
    a parameter or buffer reachable under two names (tied weights), or an input passed
    twice. Each repeat is replaced by a new tensor on the same memory (a detached alias
    with the same ``requires_grad``), so tracing sees distinct inputs and each position
    keeps its own placeholder and gradient, as in torch's export. Such an input may not be
    mutated.
    """
    first: dict[int, int] = {}
    groups: dict[int, list[int]] = {}
    distinct: list[Any] = []
    for i, a in enumerate(flat_args):
        if isinstance(a, torch.Tensor):
            j = first.setdefault(id(a), i)
            if j != i:
                groups.setdefault(j, [j]).append(i)
                a = a.detach().requires_grad_(a.requires_grad)
        distinct.append(a)
    return distinct, list(groups.values())


def retrace_flat(
    fn: Callable[..., Any], traced: TracedGraphs, *, inference: bool = False
) -> torch.fx.GraphModule:
    """Trace ``fn(*fake_args)`` (a function that calls ``traced.graph``) into a new graph
    whose placeholders are the flat inputs, one each, named ``arg0_1, arg1_1, ...``.

    torch exports its inference graph as traced, so for an ``inference`` graph the re-trace
    only renames the placeholders: nothing is decomposed again (make_fx's default table
    would turn ``detach`` into ``alias``) and values nothing uses (a view of a mutated input
    that functionalization regenerated, for one) are dropped. torch re-traces its joint
    graph with make_fx's defaults and keeps such values; so does the joint re-trace here.
    """
    table: dict[Any, Callable[..., Any]] | None = {} if inference else None
    with COMPILE_LOCK, explain_tracing_errors(), _tracing_context(traced.fake_mode, traced.symbolic):
        gm: torch.fx.GraphModule = make_fx(fn, decomposition_table=table)(*traced.fake_args)
    if inference:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return gm

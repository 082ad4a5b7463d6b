"""Tracing graphs for export: the front half of the compile_flat pipeline, no runtime.

    flat args ──fakify──▶ metadata pass ──validate──▶ inference or joint trace ──▶ TracedGraphs

Export hands the traced graph itself to the user, so its calling convention must be the
user's flat inputs, one placeholder each: inputs are never deduplicated or merged into
synthetic bases (See Note [Duplicate and aliased inputs]); such inputs are rejected.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch._functorch.config as functorch_config
import torch.fx
from aotkit_analysis import compute_input_layout
from aotkit_schemas import AOTConfig, ViewAndMutationMeta
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from ._capture import FlatFn, trace_inference, trace_joint
from ._compile import _as_inference, _metadata, _output_needs_grad, _tracing_context
from ._errors import explain_tracing_errors
from ._fakify import construct_fake_mode


class AOTExportError(RuntimeError):
    """A function or module breaks one of the restrictions of aotkit's export APIs."""


DUPLICATED_MUTATED_INPUT_MESSAGE = (
    "Encountered duplicated inputs that are mutated in the graph you are trying to export.\n"
    "This functionality is not supported: flat inputs {indices} are the same tensor and the "
    "function mutates it. Pass distinct tensors (clone one of them) before exporting."
)

DUPLICATE_INPUT_MESSAGE = (
    "aotkit export: flat inputs {indices} are the same tensor. Exported graphs take one "
    "placeholder per input and cannot deduplicate them; this is usually a parameter shared "
    "between two submodules (tied weights). Pass distinct tensors, or export a module "
    "that owns the shared parameter once."
)

ALIASED_MUTATED_INPUT_MESSAGE = (
    "Encountered aliased inputs that are mutated in the graph you are trying to export.\n"
    "This functionality is not supported: flat inputs {indices} share memory and at least "
    "one of them is mutated. Clone the inputs before exporting."
)

FUNCTIONALIZED_RNG_MESSAGE = (
    "Functionalized RNG is not currently supported in the aot_export workflow. Set "
    "torch._functorch.config.functionalize_rng_ops = False to export."
)


@dataclass
class TracedGraphs:
    """The result of ``trace_for_export``."""

    meta: ViewAndMutationMeta
    # fake versions of the flat inputs, in the same order (no dedupe, no synthetic bases)
    fake_args: list[Any]
    # ``joint(primals, tangents) -> (*forward_returns, *input_grads)`` when ``meta.is_train``
    # (See Note [Joint graph calling convention]), else ``inference(*args) -> forward returns``
    graph: torch.fx.GraphModule
    fake_mode: FakeTensorMode
    symbolic: bool


def trace_for_export(
    flat_fn: FlatFn,
    flat_args: Sequence[Any],
    cfg: AOTConfig,
    validate: Callable[[ViewAndMutationMeta], None] | None = None,
) -> TracedGraphs:
    """Run the metadata pass, ``validate`` the metadata, then trace the graph.

    A training graph is traced when grad mode is on and some input requires grad and some
    output (or visible mutation) needs it; otherwise the inference graph.
    """
    if functorch_config.functionalize_rng_ops:
        raise AOTExportError(FUNCTIONALIZED_RNG_MESSAGE)
    layout = compute_input_layout(flat_args)
    fake_mode, shape_env = construct_fake_mode(flat_args, dynamic=cfg.dynamic_shapes)
    symbolic = shape_env is not None
    with explain_tracing_errors(), _tracing_context(fake_mode, symbolic):
        meta, fake, traced_fn, _ = _metadata(flat_fn, flat_args, layout, cfg, fake_mode, shape_env)
        if not layout.is_trivial:
            dupes = [i for i, first in enumerate(layout.first_occurrence) if first != i]
            indices = sorted({layout.first_occurrence[i] for i in dupes} | set(dupes))
            dupe_mutated = any(
                meta.input_info[ci].mutates_anything
                for i in dupes
                if (ci := layout.compiled_index_of_user_input(i)) is not None
            )
            message = DUPLICATED_MUTATED_INPUT_MESSAGE if dupe_mutated else DUPLICATE_INPUT_MESSAGE
            raise AOTExportError(message.format(indices=indices))
        with_bases = compute_input_layout(
            flat_args, lambda i: meta.input_info[i].mutates_anything
        )
        if not with_bases.is_trivial:
            members = sorted(m.user_index for g in with_bases.synthetic_bases for m in g.members)
            raise AOTExportError(ALIASED_MUTATED_INPUT_MESSAGE.format(indices=members))
        if meta.is_train and not _output_needs_grad(meta):
            meta = _as_inference(meta, cfg.keep_inference_input_mutations)
        if validate is not None:
            validate(meta)
        if meta.is_train:
            graph, _ = trace_joint(traced_fn, fake, meta, cfg.decompositions)
        else:
            graph = trace_inference(traced_fn, fake, meta, cfg.decompositions)
    return TracedGraphs(meta, fake, graph, fake_mode, symbolic)


def retrace_flat(fn: Callable[..., Any], traced: TracedGraphs) -> torch.fx.GraphModule:
    """Trace ``fn(*fake_args)`` (a function that calls ``traced.graph``) into a new graph
    whose placeholders are the flat inputs, one each, named ``arg0_1, arg1_1, ...``."""
    with explain_tracing_errors(), _tracing_context(traced.fake_mode, traced.symbolic):
        gm: torch.fx.GraphModule = make_fx(fn)(*traced.fake_args)
    return gm

"""aot_module_simplified: the low-overhead entry point that torch.compile backends use.

Compared with ``aot_module`` it compiles once, eagerly, for the example inputs it is given
(fake tensors from dynamo, or real ones), does no pytree processing of the inputs, and
reads the parameters and buffers once instead of on every call.

# Note [aot_module_simplified calling convention]
# The module is called as ``mod(*args)`` with flat args (tensors, SymInts, Python scalars)
# and must return a tuple or list. The compiled graph takes
# ``(*parameters, *buffers, *args)``, parameters and buffers taken once at compile time
# with ``named_parameters/named_buffers(remove_duplicate=False)``.
# The returned ``forward`` follows torch's convention: ``forward(*args)``, except when
# ``mod`` is dynamo's ``GmWrapper`` (graphs whose inputs dynamo flattened), where it is
# boxed (See Note [Boxed calling convention] in aotkit_schemas): ``forward(args)`` takes
# one list of the runtime args and clears it. Outputs come back in the container type the
# module used (a tuple stays a tuple).
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Callable, Iterator, KeysView, Sequence
from typing import Any, cast

import torch
import torch._functorch.config as functorch_config
import torch.fx
import torch.nn as nn
from aotkit_capture import (
    call_preserving_node_meta,
    compile_flat,
    entered_until_backward_traced,
    refuse_single_pass,
)
from aotkit_partitioners import default_partition
from aotkit_regions import has_invoke_subgraph, region_schemas, share_repeated_regions
from aotkit_schemas import (
    BufferAOTInput,
    ParamAOTInput,
    disk_cache_enabled,
)
from torch._guards import Source, TracingContext
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.utils import stateless
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ._aot_function import _resolve_partitioner, make_config
from ._disk_cache import disk_cache, fingerprint_or_none
from ._layout_check import LayoutCheck, describe_layout_change, layout_check, written_or_all
from ._layout_graphs import LayoutGraphs
from ._outputs import OutputLayout
from ._pre_grad import check_tensors_kept, passes_identity, pre_grad_timing, tensor_slots
from ._runtime_asserts import (
    Check,
    checking_fake_constants,
    duplicate_input_check,
    register_duplicate_guards,
    requires_grad_check,
)

NOT_A_SEQUENCE_MESSAGE = (
    "aot_module_simplified: the module returned a {kind}, but it must return a tuple or a "
    "list (the graph's outputs are not pytree-processed). Return `(out,)` from the module, "
    "or use aot_module, which accepts any output structure."
)


def dynamo_metadata(
    mod: nn.Module, param_names: KeysView[str], num_full_args: int
) -> tuple[list[Source | None] | None, list[int]]:
    """The sources and static input indices that dynamo attached to ``mod``.

    Returns ``(arg_pos_to_source, static_input_indices)`` over the full args
    ``(*params, *buffers, *user args)``. A graph that dynamo did not capture (no
    ``dynamo_compile_id`` in ``mod.meta``) carries none: ``(None, [])``. A dynamo graph
    without ``_param_name_to_source`` comes from export: its parameters and buffers are the
    static inputs.
    """
    if not (isinstance(mod, torch.fx.GraphModule) and "dynamo_compile_id" in mod.meta):
        return None, []
    if not hasattr(mod, "_param_name_to_source"):
        return None, list(range(len(param_names)))
    name_to_source = cast(dict[str, Source], mod._param_name_to_source)
    seen: set[Source | None] = set()
    sources: list[Source | None] = []

    def claim(source: Source | None, what: str) -> None:
        if source is not None and source in seen:
            raise AssertionError(f"aot_module_simplified: {what} reuses dynamo source {source}")
        seen.add(source)
        sources.append(source)

    for name in param_names:
        if name not in name_to_source:
            raise AssertionError(f"aot_module_simplified: no dynamo source for parameter {name}")
        claim(name_to_source[name], f"parameter {name}")
    static = list(range(len(param_names)))
    for pos, node in enumerate(mod.graph.find_nodes(op="placeholder")):
        if not hasattr(node, "_dynamo_source"):
            raise AssertionError(f"aot_module_simplified: placeholder {node.name} has no _dynamo_source")
        claim(node._dynamo_source, f"placeholder {node.name}")
        tensor_dict = node.meta.get("tensor_dict", {})
        if tensor_dict.get("_dynamo_static_input_type", None):
            static.append(pos + len(param_names))
    if len(sources) != num_full_args:
        raise AssertionError(
            f"aot_module_simplified: {len(sources)} dynamo sources for {num_full_args} inputs"
        )
    return sources, static


def _has_symbolic_fake_inputs(args: Sequence[Any]) -> bool:
    """Whether the first fake tensor among ``args`` lives in a mode with a ShapeEnv."""
    for x in args:
        if isinstance(x, FakeTensor):
            return x.fake_mode.shape_env is not None
    return False


def _is_gm_wrapper(mod: object) -> bool:
    """Whether ``mod`` is dynamo's ``GmWrapper``; asked without importing dynamo, which
    must already be loaded for one to exist. See Note [Import cost]."""
    utils = sys.modules.get("torch._dynamo.utils")
    return utils is not None and isinstance(mod, utils.GmWrapper)


_DISK_CACHE_DEFAULT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "aotkit_disk_cache_default", default=False
)


@contextlib.contextmanager
def disk_cache_default(enabled: bool) -> Iterator[None]:
    """Whether aot_module_simplified uses the on-disk cache when neither AOTKIT_CACHE nor
    ``disk_cache_config.enabled`` decides: on for the aotkit torch.compile backends, off
    for direct calls. See Note [On-disk compile cache] in aotkit_cache."""
    token = _DISK_CACHE_DEFAULT.set(enabled)
    try:
        yield
    finally:
        _DISK_CACHE_DEFAULT.reset(token)


def _checked(
    runner: Callable[[list[Any]], Any],
    checks: list[Check],
    outputs: OutputLayout,
    fits: LayoutCheck | None,
    other_layout: Callable[[list[Any]], Any],
) -> Callable[[list[Any]], Any]:
    """The compiled call with its runtime checks: torch's assertions first, then the
    layout check, whose misses run ``other_layout`` (See Note [Runtime checks of the input
    layout], Note [Graphs for other input layouts])."""
    if not checks and fits is None:
        return lambda flat: outputs.unflatten(runner(flat))

    def checked_runner(flat: list[Any]) -> Any:
        for check in checks:
            check(flat)
        if fits is not None and not fits(flat):
            return other_layout(flat)
        return outputs.unflatten(runner(flat))

    return checked_runner


def _inner_tensors(t: Any) -> list[Any]:
    """``t``'s plain tensors: a traceable wrapper subclass's inner tensors, recursively."""
    if not is_traceable_wrapper_subclass(t):
        return [t]
    attrs, _ = t.__tensor_flatten__()
    return [inner for name in attrs for inner in _inner_tensors(getattr(t, name))]


INVOKE_SUBGRAPH_REASON = "the higher-order operator invoke_subgraph needs the Python functionalization mode"


def _share_regions(mod: nn.Module) -> str | None:
    """Share the repeated regions of dynamo's graph (See Note [Sharing repeated regions]
    in aotkit_regions); the reason the single pass is skipped when the graph then calls
    invoke_subgraph (it cannot trace one: See Note [Higher-order operators] in
    aotkit_tracing), else None."""
    gm = mod.gm if _is_gm_wrapper(mod) else mod
    if not isinstance(gm, torch.fx.GraphModule):
        return None
    if "dynamo_compile_id" in gm.meta:
        share_repeated_regions(gm)
    return INVOKE_SUBGRAPH_REASON if has_invoke_subgraph(gm.graph) else None


def aot_module_simplified(
    mod: nn.Module,
    args: Sequence[Any],
    fw_compiler: Callable[..., Any],
    bw_compiler: Callable[..., Any] | None = None,
    partition_fn: Callable[..., Any] = default_partition,
    decompositions: dict[Any, Callable[..., Any]] | None = None,
    keep_inference_input_mutations: bool = False,
    inference_compiler: Callable[..., Any] | None = None,
    compiler_config_extra: Any = None,
    ignore_shape_env: bool = False,
    disable_functionalization: bool = False,
    pre_grad_passes: Callable[[torch.fx.GraphModule, Sequence[Any]], torch.fx.GraphModule]
    | None = None,
    compile_region_name: str | None = None,
    cudagraphs: Any = None,
) -> Callable[..., Any]:
    """Compile ``mod`` now, for inputs like ``args``; return a boxed ``forward``.

    Same arguments as ``torch._functorch.aot_autograd.aot_module_simplified``. See
    Note [aot_module_simplified calling convention]. ``args`` may be fake tensors: when
    their FakeTensorMode has a ShapeEnv, that mode (and its symbolic sizes) is reused.
    Dynamo's metadata (parameter sources, static inputs) is honoured when present.
    ``pre_grad_passes(gm, args)`` rewrites a GraphModule before it is traced: by default
    after the on-disk cache lookup, on a miss only, as torch runs them after its cache
    lookup (See Note [Pre-grad passes after the cache lookup]).
    ``ignore_shape_env=True`` compiles for static shapes even when the fake inputs carry a
    ShapeEnv. Accepted for compatibility and ignored: ``compiler_config_extra`` and
    ``compile_region_name`` (torch's compile cache and logging), ``cudagraphs`` (older
    torch; aotkit has no CUDA-graph support). ``disable_functionalization=True`` leaves
    in-place ops in the graphs, as torch (See Note [Tracing without functionalization]).

    ``forward`` also exposes the module's ``zero_grad``, ``named_parameters`` and
    ``named_buffers``. Like torch, it raises AssertionError when called with inputs that
    break an assumption of the compilation (a duplicated input no longer duplicated;
    under ``torch._functorch.config.debug_assert``, an input that now requires grad), and
    when the traced joint graph holds a fake tensor constant; see Note [Runtime checks of
    aot_module_simplified]. A call whose inputs alias each other otherwise than the
    compiled graph assumes (a written input that now overlaps another, or overlaps it at
    another offset) runs the module eagerly; see Note [Runtime checks of the input layout].
    """
    del compiler_config_extra, compile_region_name, cudagraphs
    single_pass_refusal = _share_regions(mod)
    # See Note [Pre-grad passes after the cache lookup]
    late_passes = None
    if pre_grad_passes is not None and isinstance(mod, torch.fx.GraphModule):
        if pre_grad_timing() == "early":
            mod = pre_grad_passes(mod, args)
        else:
            late_passes = pre_grad_passes
    named = {
        **dict(mod.named_parameters(remove_duplicate=False)),
        **dict(mod.named_buffers(remove_duplicate=False)),
    }
    names = list(named)
    params_flat = list(named.values())
    full_args = [*params_flat, *args]
    if (tracing := TracingContext.try_get()) is not None:
        # See Note [Metadata in the TracingContext for Inductor's freezing] in
        # aotkit_capture: Inductor's freezing sets the entries of frozen parameters to
        # None, so it gets lists of its own
        tracing.params_flat = list(params_flat)
        unwrapped = [t for p in params_flat for t in _inner_tensors(p)]
        tracing.params_flat_unwrap_subclasses = unwrapped
        tracing.params_unwrapped_to_flat_index = list(range(len(unwrapped)))
    sources, static_indices = dynamo_metadata(mod, named.keys(), len(full_args))
    cfg = make_config(
        fw_compiler, bw_compiler, checking_fake_constants(_resolve_partitioner(partition_fn)),
        decompositions, len(params_flat),
        keep_inference_input_mutations, inference_compiler,
        dynamic=not ignore_shape_env and _has_symbolic_fake_inputs(full_args),
        aot_autograd_arg_pos_to_source=sources,
        static_input_indices=static_indices,
        disable_functionalization=disable_functionalization,
        # See Note [Graph descriptors] in aotkit_schemas: the lifted state by FQN, as torch
        input_descs=[
            ParamAOTInput(n) for n, _ in mod.named_parameters(remove_duplicate=False)
        ] + [BufferAOTInput(n) for n, _ in mod.named_buffers(remove_duplicate=False)],
    )
    outputs = OutputLayout()
    num_params = len(params_flat)
    before_trace: Callable[[], None] | None = None
    if late_passes is not None:
        passes, gm, slots = late_passes, cast(torch.fx.GraphModule, mod), tensor_slots(mod)

        def run_passes() -> None:  # on a miss: See Note [Pre-grad passes after the cache lookup]
            nonlocal mod
            mod = passes(gm, args)
            check_tensors_kept(slots, mod)

        before_trace = run_passes

    def functional_call(*flat: Any) -> list[Any]:
        # See Note [Contexts that span the backward trace]
        with entered_until_backward_traced(
            stateless._reparametrize_module(mod, dict(zip(names, flat[:num_params], strict=True)))
        ):
            # See Note [Preserved node meta]
            out = call_preserving_node_meta(mod, *flat[num_params:])
        if not isinstance(out, (tuple, list)):
            # a tensor is named as the user wrote it, not as the tracing wrapper it is now
            kind = "Tensor" if isinstance(out, torch.Tensor) else type(out).__name__
            raise RuntimeError(NOT_A_SEQUENCE_MESSAGE.format(kind=kind))
        return outputs.record(out)

    debug_assert = functorch_config.debug_assert
    # See Note [On-disk compile cache] in aotkit_cache
    identity = fingerprint_or_none(mod) if disk_cache_enabled(_DISK_CACHE_DEFAULT.get()) else None
    if late_passes is not None:
        identity = passes_identity(identity, late_passes)
    # See Note [Region schemas generated once] in aotkit_regions
    schemas = region_schemas() if single_pass_refusal is not None else contextlib.nullcontext()
    with refuse_single_pass(single_pass_refusal), schemas:
        runner, artifacts = compile_flat(
            functional_call, full_args, cfg, cache=disk_cache(identity, outputs),
            before_trace=before_trace,
        )
    # See Note [Runtime checks of aot_module_simplified]
    register_duplicate_guards(artifacts.layout, sources)
    checks = [duplicate_input_check(artifacts.layout, cfg)]
    if debug_assert and artifacts.meta.is_train:
        checks.append(requires_grad_check(artifacts.layout, full_args, cfg))
    # See Note [Runtime checks of the input layout]
    fits = layout_check(artifacts, full_args)
    layout, watched = artifacts.layout, written_or_all(artifacts, full_args)

    def eager(flat: list[Any]) -> Any:
        return mod(*flat[num_params:])

    # See Note [Graphs for other input layouts]
    other_layouts = LayoutGraphs(functional_call, cfg, outputs.unflatten, eager)

    def other_layout(flat: list[Any]) -> Any:
        return other_layouts(flat, lambda: describe_layout_change(layout, flat, watched))

    run = _checked(runner, [c for c in checks if c is not None], outputs, fits, other_layout)

    forward: Any  # a function carrying the module's zero_grad/named_* as attributes
    if _is_gm_wrapper(mod):

        def boxed_forward(runtime_args: list[Any]) -> Any:
            flat = [*params_flat, *runtime_args]
            runtime_args.clear()
            return run(flat)

        boxed_forward._boxed_call = True  # type: ignore[attr-defined]
        forward = boxed_forward
    else:

        def unboxed_forward(*runtime_args: Any) -> Any:
            return run([*params_flat, *runtime_args])

        forward = unboxed_forward
    forward.zero_grad = mod.zero_grad
    forward.named_parameters = mod.named_parameters
    forward.named_buffers = mod.named_buffers
    result: Callable[..., Any] = forward
    return result

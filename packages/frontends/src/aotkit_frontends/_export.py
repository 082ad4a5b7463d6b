"""aot_export_module and aot_export_joint_simple: hand the traced graph to the user.

Both trace with the same metadata pass and tracers as compile_flat (see _export_trace.py)
but return the graph instead of compiling it. See Note [Exported graph calling convention]
for what aot_export_module's graph takes and returns.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
import torch.nn as nn
import torch.utils._pytree as pytree
from aotkit_capture import (
    AOTExportError,
    TracedGraphs,
    entered_until_backward_traced,
    retrace_flat,
    trace_for_export,
)
from aotkit_partitioners import default_partition
from aotkit_schemas import GraphSignature, OutputType, ViewAndMutationMeta, graph_outputs
from torch._guards import detect_fake_mode

from aotkit_frontends.module_state._attribute_guard import detect_attribute_assignment
from aotkit_frontends.module_state._reparametrize import (
    distinct_slot_names,
    reparametrized,
    shared_slot_names,
)

from ._aot_function import make_config
from ._outputs import OutputLayout, flatten_function
from ._signature import build_graph_signature

NO_LOSS_INDEX_MESSAGE = (
    "aot_export_module: trace_joint=True needs the module to compute its loss: one of its "
    "forward outputs must be a scalar loss. Say which output it is with output_loss_index."
)
BAD_OUTPUT_TYPE_MESSAGE = (
    "aot_export_module: with trace_joint=True the module must return a tensor or a "
    "list/tuple of tensors, found {type}."
)
OTHER_OUTPUT_REQUIRES_GRAD_MESSAGE = (
    "Found an output of the forward that requires gradients, that was not the scalar loss.\n"
    "The joint graph only computes gradients of the loss, so every other output must not "
    "require grad: call .detach() on it. Output {loss} is the loss (output_loss_index), but "
    "output {index} requires gradients."
)
LOSS_NO_GRAD_MESSAGE = (
    "aot_export_module: the output at index {loss} was marked as the loss, but it does not "
    "require gradients: no parameter or input that requires grad contributes to it."
)
LOSS_NOT_SCALAR_MESSAGE = (
    "aot_export_module: the output marked as the loss (at index {loss}) must be a scalar "
    "(one element), but it has shape {shape}. Reduce it, e.g. with .sum() or .mean()."
)
METADATA_MUTATION_MESSAGE = (
    "Found an input that received a metadata mutation, through e.g. a call to `.resize_()` "
    "or `.transpose_()`.\nThis is banned in the aot_export workflow: input {index} ({name}) "
    "changed its size, stride or storage. Exported "
    "graphs are functional and return only new data for mutated inputs, so metadata "
    "mutations of inputs are not supported. Use the out-of-place op (`x = x.t()`).\n{meta}"
)
GRAD_INPUT_MUTATION_MESSAGE = (
    "Found a graph input that requires gradients, and received a mutation.\n"
    "This is banned in the aot_export workflow: input {index} ({name}) requires gradients "
    "and received a data mutation (an in-place op). A joint graph differentiates through "
    "the value before the mutation, "
    "which export does not support. Mutate a clone, or do the update under "
    "torch.no_grad() outside the exported module.\n{meta}"
)
PARAMETER_MUTATION_MESSAGE = (
    "aot_export_module: {name} was mutated, and trace_joint=True. A joint graph "
    "differentiates through the parameters, so it cannot also update one (an inference "
    "export, trace_joint=False, can: see GraphSignature.parameters_to_mutate). Register "
    "the state as a buffer if it changes in forward."
)
UNUSED_PARAMETER_MESSAGE = (
    "aot_export_module: {name} requires grad but did not receive a gradient: the loss does "
    "not depend on it. Set requires_grad=False on it (or detach its use) before exporting."
)

# See Note [A submodule reachable under two names]
SHARED_SLOT_MESSAGE = (
    "aot_export_module: a submodule is registered under two names, so one parameter has "
    "several names ({names}); a joint export lifts each name as its own input and only one "
    "of them would receive the gradient. Register the submodule once (call it twice in "
    "forward instead of listing it twice), or export with trace_joint=False."
)


def _not_a_compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    raise AssertionError("export traces graphs; it never compiles them")


def _export_config(num_params_buffers: int, decompositions: Any, dynamic: bool) -> Any:
    return make_config(
        _not_a_compiler, None, default_partition, decompositions, num_params_buffers,
        False, None, dynamic=dynamic, is_export=True,
    )


def _infer_dynamic(flat_args: Sequence[Any], mod: Any, dynamic_shapes: bool | None) -> bool:
    """``dynamic_shapes``, or whether the inputs (else the graph's values) are symbolic."""
    if dynamic_shapes is not None:
        return dynamic_shapes
    mode = detect_fake_mode(list(flat_args))
    if mode is None and isinstance(mod, torch.fx.GraphModule):
        mode = detect_fake_mode([n.meta["val"] for n in mod.graph.nodes if "val" in n.meta])
    return mode is not None and mode.shape_env is not None


def _input_names(param_names: Sequence[str], buffer_names: Sequence[str]) -> Callable[[int], str]:
    """``name(i)``: how error messages refer to flat input ``i``."""
    n_params, n_buffers = len(param_names), len(buffer_names)

    def name(i: int) -> str:
        if i < n_params:
            return f"parameter {param_names[i]}"
        if i < n_params + n_buffers:
            return f"buffer {buffer_names[i - n_params]}"
        return f"user input {i - n_params - n_buffers}"

    return name


def _check_export_meta(
    meta: ViewAndMutationMeta, *, trace_joint: bool, num_params: int, name: Callable[[int], str]
) -> None:
    for i, info in enumerate(meta.input_info):
        if info.mutates_metadata:
            raise AOTExportError(
                METADATA_MUTATION_MESSAGE.format(index=i, name=name(i), meta=meta.describe())
            )
        if trace_joint and info.mutates_data and info.requires_grad:
            raise AOTExportError(
                GRAD_INPUT_MUTATION_MESSAGE.format(index=i, name=name(i), meta=meta.describe())
            )
        if trace_joint and info.mutates_data and i < num_params:
            raise AOTExportError(PARAMETER_MUTATION_MESSAGE.format(name=name(i)))


def _loss_checked(fn: Callable[..., Any], loss_index: int) -> Callable[..., Any]:
    """Wrap the module call with the joint-export checks on its outputs."""

    def checked(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            out = (out,)
        if not isinstance(out, (tuple, list)):
            raise AOTExportError(BAD_OUTPUT_TYPE_MESSAGE.format(type=type(out).__name__))
        for i, o in enumerate(out):
            if i != loss_index and isinstance(o, torch.Tensor) and o.requires_grad:
                raise AOTExportError(
                    OTHER_OUTPUT_REQUIRES_GRAD_MESSAGE.format(loss=loss_index, index=i)
                )
        loss = out[loss_index]
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise AOTExportError(LOSS_NO_GRAD_MESSAGE.format(loss=loss_index))
        if loss.numel() != 1:
            raise AOTExportError(LOSS_NOT_SCALAR_MESSAGE.format(loss=loss_index, shape=loss.shape))
        return out

    return checked


def _flat_joint_without_tangents(
    traced: TracedGraphs, fqn_or_input: Callable[[int], str]
) -> tuple[torch.fx.GraphModule, list[int]]:
    """Re-trace the joint graph as ``(*args) -> (*forward returns, *grads that exist)``.

    The only tangent is the loss's (the checks guarantee it), and it is one.
    See Note [Exported graph calling convention].
    """
    meta = traced.meta
    if len(meta.traced_tangents) != 1:
        raise AOTExportError(
            "aot_export_module: the loss must be the only value that needs a gradient; "
            f"found {len(meta.traced_tangents)}.\n{meta.describe()}"
        )
    (loss_like,) = meta.traced_tangents
    n_returns = meta.num_forward_returns
    grad_inputs = [
        i for i, a in enumerate(traced.fake_args)
        if isinstance(a, torch.Tensor) and a.requires_grad
    ]

    def flat_joint(*args: Any) -> tuple[Any, ...]:
        seed = torch.ones(loss_like.shape, dtype=loss_like.dtype, device=loss_like.device)
        outs = traced.graph(list(args), [seed])
        grads = outs[n_returns:]
        for i in grad_inputs:
            if grads[i] is None:
                raise AOTExportError(UNUSED_PARAMETER_MESSAGE.format(name=fqn_or_input(i)))
        return (*outs[:n_returns], *(grads[i] for i in grad_inputs))

    with torch.no_grad():
        return retrace_flat(flat_joint, traced), grad_inputs


def aot_export_module(
    mod: nn.Module,
    args: Sequence[Any],
    *,
    decompositions: dict[Any, Callable[..., Any]] | None = None,
    trace_joint: bool,
    output_loss_index: int | None = None,
    pre_dispatch: bool = False,
    dynamic_shapes: bool | None = None,
    kwargs: dict[str, Any] | None = None,
) -> tuple[torch.fx.GraphModule, GraphSignature]:
    """Trace ``mod(*args, **kwargs)`` into one functional ATen graph and its signature.

    Same arguments as ``torch._functorch.aot_autograd.aot_export_module``. The graph takes
    the parameters, the buffers and the flat user inputs, and returns the updated inputs,
    the flat user outputs and, with ``trace_joint``, the gradients of the loss: see
    Note [Exported graph calling convention]. Restrictions, each raising an AOTExportError
    (a RuntimeError) that explains it:

    * with ``trace_joint``, ``output_loss_index`` must name an output that is a scalar
      requiring grad, and no other output may require grad;
    * no input may have its metadata mutated (``t_``, ``resize_``, ``set_``);
    * with ``trace_joint``, no input that requires grad may be mutated, and no parameter
      (an inference graph may update parameters: ``parameters_to_mutate``);
    * a forward may not assign a tensor to a module attribute (the attribute is restored);
    * a mutated input may not alias another input, nor come twice.

    A parameter or buffer reachable under several names (tied weights) is lifted once per
    name, as torch does, and a user input passed twice is two inputs: each placeholder
    stands for the uses at its position, so a joint graph returns one partial gradient per
    position (their sum is the tensor's gradient).

    With ``pre_dispatch=True`` (inference only) the graph is traced above autograd under
    the caller's grad mode: it keeps CompositeImplicit ops (``aten.linear``) and grad-mode
    changes, still functionalized, with the same calling convention and signature (See
    Note [Pre-dispatch export]).
    """
    if pre_dispatch and trace_joint:
        raise RuntimeError("pre_dispatch is not supported when trace_joint is True.")
    if trace_joint and output_loss_index is None:
        raise AOTExportError(NO_LOSS_INDEX_MESSAGE)
    named_parameters = dict(mod.named_parameters(remove_duplicate=False))
    named_buffers = dict(mod.named_buffers(remove_duplicate=False))
    param_names, buffer_names = list(named_parameters), list(named_buffers)
    fqns = [*param_names, *buffer_names]
    params_flat = [*named_parameters.values(), *named_buffers.values()]
    n_pb = len(params_flat)

    distinct = distinct_slot_names(mod, fqns)
    if trace_joint and len(distinct) < len(fqns):
        shared = shared_slot_names(mod, fqns)
        raise AOTExportError(SHARED_SLOT_MESSAGE.format(names=", ".join(" = ".join(g) for g in shared)))

    def functional_call(*full_args: Any, **kw: Any) -> Any:
        # See Note [A submodule reachable under two names] and Note [Parameters and
        # buffers reassigned in forward]
        # See Note [Contexts that span the backward trace]
        with entered_until_backward_traced(
            reparametrized(mod, {fqns[i]: full_args[i] for i in distinct}, who="aotkit export")
        ):
            return mod(*full_args[n_pb:], **kw)

    fn = functional_call
    if trace_joint:
        assert output_loss_index is not None
        # unlike torch's, this check forwards kwargs: torch's joint export fails on them
        fn = _loss_checked(functional_call, output_loss_index)
    full_args = (*params_flat, *args)
    flat_args, in_spec = pytree.tree_flatten((full_args, kwargs or {}))
    outputs = OutputLayout()
    flat_fn = flatten_function(fn, in_spec, outputs)
    cfg = _export_config(n_pb, decompositions, _infer_dynamic(flat_args, mod, dynamic_shapes))
    name = _input_names(param_names, buffer_names)

    def validate(meta: ViewAndMutationMeta) -> None:
        _check_export_meta(meta, trace_joint=trace_joint, num_params=len(param_names), name=name)

    # an inference graph is traced under no_grad, except a pre-dispatch one: it records
    # grad-mode changes, so it sees the caller's (See Note [Pre-dispatch export])
    grad_mode = contextlib.nullcontext() if trace_joint or pre_dispatch else torch.no_grad()
    with grad_mode, detect_attribute_assignment(mod):
        traced = trace_for_export(flat_fn, flat_args, cfg, validate, pre_dispatch=pre_dispatch)
        grad_inputs: list[int] | None = None
        if pre_dispatch:
            gm = traced.graph
        elif traced.meta.is_train:
            gm, grad_inputs = _flat_joint_without_tangents(traced, name)
        else:
            gm = retrace_flat(lambda *a: tuple(traced.graph(*a)), traced, inference=True)
    if trace_joint and grad_inputs is None:
        # the checks above guarantee the loss requires grad, so a joint graph was traced
        raise AssertionError("aot_export_module: expected a joint graph")
    return gm, build_graph_signature(
        gm,
        traced.meta,
        in_spec=in_spec,
        out_spec=outputs.spec,
        param_names=param_names,
        buffer_names=buffer_names,
        num_user_outputs=traced.meta.num_outputs,
        grad_inputs=grad_inputs,
        loss_index=output_loss_index,
    )


def aot_export_joint_simple(
    func: Callable[..., Any],
    args: Sequence[Any],
    *,
    trace_joint: bool,
    num_params_buffers: int = 0,
    decompositions: dict[Any, Callable[..., Any]] | None = None,
) -> torch.fx.GraphModule:
    """Trace ``func(*args)`` without changing its calling convention.

    Same arguments as ``torch._functorch.aot_autograd.aot_export_joint_simple``.
    * With no input requiring grad (or ``trace_joint=False``), the graph is an inference
      graph with exactly ``func``'s inputs and outputs: ``gm(*args) == func(*args)``.
    * Otherwise it is the joint graph ``gm(primals, tangents) -> ((*outputs,), (*input grads,))``
      (See Note [Joint graph calling convention]); partitioning it gives a forward with
      ``func``'s calling convention.

    That guarantee needs: flat ``args`` (no pytrees), a list/tuple of tensors as output, no
    input mutation, and no output aliasing an input or another output. Each violation
    raises a RuntimeError.
    """
    flat_args, arg_spec = pytree.tree_flatten(tuple(args))
    if not all(child.is_leaf() for child in arg_spec.children()):
        raise AOTExportError(
            "aot_export_joint_simple requires individual inputs not to be pytrees. "
            f"in_spec={arg_spec}"
        )
    outputs = OutputLayout()
    flat_fn = flatten_function(func, pytree.tree_flatten((tuple(args), {}))[1], outputs)
    cfg = _export_config(num_params_buffers, decompositions, _infer_dynamic(flat_args, func, None))
    grad_mode = contextlib.nullcontext() if trace_joint else torch.no_grad()
    with grad_mode:
        traced = trace_for_export(flat_fn, flat_args, cfg)
    meta = traced.meta
    for i, info in enumerate(meta.input_info):
        if info.mutates_metadata:
            raise AOTExportError(
                METADATA_MUTATION_MESSAGE.format(index=i, name=f"input {i}", meta=meta.describe())
            )
        if trace_joint and info.mutates_data and info.requires_grad:
            # torch's joint trace rejects this first, with its own message
            raise AOTExportError(
                GRAD_INPUT_MUTATION_MESSAGE.format(index=i, name=f"input {i}", meta=meta.describe())
            )
    if any(i.mutates_anything for i in meta.input_info):
        raise AOTExportError(
            # torch's text: the summary follows on the same line
            f"aot_export_joint_simple does not support input mutations. {meta.describe()}"
        )
    if any(o.output_type is not OutputType.non_alias for o in meta.output_info):
        raise AOTExportError(
            "aot_export_joint_simple does not support outputs that alias inputs or other "
            f"outputs.\n{meta.describe()}"
        )
    out_spec = outputs.spec
    assert out_spec is not None
    if out_spec.is_leaf() or out_spec.type not in (tuple, list):
        raise AOTExportError(
            f"aot_export_joint_simple requires outputs to be a single list/tuple. out_spec={out_spec}"
        )
    if not all(child.is_leaf() for child in out_spec.children()) or outputs.constants:
        raise AOTExportError(
            "aot_export_joint_simple requires individual outputs to be tensors, not pytrees "
            f"or constants. out_spec={out_spec}"
        )
    if meta.is_train:
        return _nest_joint_outputs(traced.graph, len(outputs.graph_leaf_indices))
    return retrace_flat(lambda *a: tuple(traced.graph(*a)), traced, inference=True)


def _nest_joint_outputs(gm: torch.fx.GraphModule, num_outputs: int) -> torch.fx.GraphModule:
    """Make ``gm(primals, tangents)`` return ``((*outputs,), (*input grads,))`` as torch's
    does, while the output node keeps its flat values (what partitioners read; See Note
    [Joint graph calling convention])."""
    flat = graph_outputs(gm)
    spec = pytree.tree_flatten(
        (tuple(range(num_outputs)), tuple(range(num_outputs, len(flat))))
    )[1]
    codegen = gm.graph._codegen
    info = getattr(codegen, "pytree_info", None)
    if info is not None:
        codegen.pytree_info = info._replace(out_spec=spec)  # type: ignore[attr-defined]
        gm.recompile()
    return gm

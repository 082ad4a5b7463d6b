"""torch 2.15's ``aot_export_joint_with_descriptors`` / ``aot_compile_joint_with_descriptors``.

See Note [Exporting the joint graph with descriptors].
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.nn as nn
import torch.utils._pytree as pytree
from aotkit_capture import graph_descriptors
from aotkit_partitioners import default_partition
from aotkit_schemas import BufferAOTInput, ParamAOTInput

from ._aot_function import _StateSlots, aot_function
from .module_state._reparametrize import reparametrized

# Note [Exporting the joint graph with descriptors]
# ``aot_export_joint_with_descriptors(stack, mod, args, kwargs)`` traces ``mod`` with its
# parameters then buffers (``named_parameters``/``named_buffers`` with
# ``remove_duplicate=False``: a tied parameter under each name, ``params_spec`` and
# ``buffers_spec``) and the user's flattened arguments as inputs, and returns the joint
# graph before partitioning, with its descriptors (See Note [Graph descriptors] in
# aotkit_schemas); aotkit's layout passes a tied parameter once, so its joint has one
# placeholder for it, named by its first FQN. ``aot_compile_joint_with_descriptors(jd)``
# compiles ``jd.graph_module`` *as the user left it* into a callable of (parameters,
# buffers, user arguments): the pipeline traces the module again (for the metadata and
# runtime wrappers: the export traces twice), checks that the fresh joint has the exported
# joint's descriptors and input shapes, and a joint pass (See Note [Joint graph passes])
# swaps in the user's graph before the partitioner. Errors torch does not raise:
# JointDescriptorError for a graph without descriptors, placeholders whose descriptors
# changed, a call with other input shapes or with grad disabled (the edited joint would
# not run); ``serializable=True`` raises NotImplementedError.


class JointDescriptorError(RuntimeError):
    """A joint graph with descriptors that aotkit cannot compile as asked."""


@dataclass
class JointWithDescriptors:
    """The exported joint graph; ``graph_module`` may be replaced or edited in place."""

    graph_module: torch.fx.GraphModule
    params_spec: list[str]
    buffers_spec: list[str]
    in_spec: pytree.TreeSpec
    out_spec: pytree.TreeSpec
    _flat_fn: Callable[..., Any] = field(repr=False)
    _options: dict[str, Any] = field(repr=False)
    # the exported joint's placeholder descriptors and (shape, dtype) of each input
    _signature: tuple[Any, ...] = field(repr=False)


class _JointCaptured(Exception):
    def __init__(self, joint: torch.fx.GraphModule) -> None:
        super().__init__("joint captured")
        self.joint = joint


def _signature(joint: torch.fx.GraphModule) -> tuple[Any, ...]:
    descs = graph_descriptors(joint)
    if isinstance(descs, str):
        raise JointDescriptorError(
            f"the joint graph has no descriptors on {descs}; aotkit writes them on every "
            "joint it traces without a tensor subclass layer (See Note [Where descriptors "
            "are attached]), so a graph built or rebuilt elsewhere must keep node.meta['desc']"
        )
    vals = tuple(
        (tuple(v.shape), v.dtype) if isinstance(v := n.meta.get("val"), torch.Tensor) else repr(v)
        for n in joint.graph.nodes if n.op == "placeholder"
    )
    return (tuple(descs[0]), vals)


def aot_export_joint_with_descriptors(
    stack: contextlib.ExitStack,
    mod: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    decompositions: dict[Any, Callable[..., Any]] | None = None,
    keep_inference_input_mutations: bool = False,
    ignore_shape_env: bool = False,
    disable_functionalization: bool = False,
    _record_nn_module_stack: bool = False,
    _disable_torch_fn_metadata_mode: bool = False,
) -> JointWithDescriptors:
    """The joint graph of ``mod(*args, **kwargs)`` with descriptors, as torch's function of
    this name. See Note [Exporting the joint graph with descriptors]."""
    del stack, ignore_shape_env, _record_nn_module_stack, _disable_torch_fn_metadata_mode
    state = _StateSlots(mod)
    names = [*state.param_names, *state.buffer_names]
    full = [*state.current(), *args]
    flat, in_spec = pytree.tree_flatten((full, dict(kwargs or {})))
    out_specs: list[pytree.TreeSpec] = []

    def flat_fn(*flat_args: Any) -> tuple[Any, ...]:
        full_args, kw = pytree.tree_unflatten(list(flat_args), in_spec)
        tensors = {names[i]: full_args[i] for i in state.distinct}
        with reparametrized(mod, tensors, who="aot_export_joint_with_descriptors"):
            out = mod(*full_args[len(names):], **kw)
        leaves, spec = pytree.tree_flatten(out)
        out_specs[:] = [spec]
        return tuple(leaves)

    options: dict[str, Any] = dict(
        decompositions=decompositions, num_params_buffers=len(names),
        keep_inference_input_mutations=keep_inference_input_mutations,
        disable_functionalization=disable_functionalization,
        _input_descs=[ParamAOTInput(n) for n in state.param_names]
        + [BufferAOTInput(n) for n in state.buffer_names],
    )

    def capture(joint: torch.fx.GraphModule, *_: Any, **__: Any) -> Any:
        raise _JointCaptured(joint)

    try:
        with torch.enable_grad():
            aot_function(flat_fn, _nop, partition_fn=capture, **options)(*flat)
    except _JointCaptured as captured:
        joint = captured.joint
    else:
        raise JointDescriptorError(
            "aot_export_joint_with_descriptors: nothing the module returns or mutates needs a "
            "gradient, so there is no joint graph; give a parameter or input requires_grad=True"
        )
    return JointWithDescriptors(
        joint, list(state.param_names), list(state.buffer_names), in_spec, out_specs[0],
        flat_fn, options, _signature(joint),
    )


def _nop(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
    return gm


def aot_compile_joint_with_descriptors(
    jd: JointWithDescriptors,
    *,
    partition_fn: Callable[..., Any] = default_partition,
    fw_compiler: Callable[..., Any] = _nop,
    bw_compiler: Callable[..., Any] | None = _nop,
    serializable: bool = False,
) -> Callable[..., Any]:
    """Compile ``jd.graph_module`` (as edited) into ``fn(*params, *buffers, *args, **kwargs)``.
    See Note [Exporting the joint graph with descriptors]."""
    if serializable:
        raise NotImplementedError(
            "aot_compile_joint_with_descriptors(serializable=True) needs torch's bundled "
            "AOTAutogradCache entries, which aotkit does not produce; compile with "
            "serializable=False (aotkit's own on-disk cache is AOTKIT_CACHE=1)"
        )
    edited = jd.graph_module
    if _signature(edited)[0] != jd._signature[0]:
        raise JointDescriptorError(
            "the edited joint graph's placeholders do not carry the exported descriptors in "
            "order; aotkit calls it with the exported joint's inputs, so keep the placeholders "
            "(and their node.meta['desc']) and edit what computes from them"
        )

    def swap_in(joint: torch.fx.GraphModule, joint_inputs: Any) -> torch.fx.GraphModule:
        if _signature(joint) != jd._signature:
            raise JointDescriptorError(
                "this call traced a joint graph with other inputs (shapes, dtypes or "
                "descriptors) than the exported one; export again for these inputs"
            )
        return edited

    compiled = aot_function(
        jd._flat_fn, fw_compiler, bw_compiler, partition_fn=partition_fn, joint_pass=swap_in,
        **jd._options,
    )
    cache = compiled._aotkit_cache  # type: ignore[attr-defined]
    kw_keys = list(jd.in_spec.child(1).context or [])

    def unflattened_compiled_fn(*args: Any, **kwargs: Any) -> Any:
        flat = pytree.tree_leaves((list(args), {k: kwargs[k] for k in kw_keys}))
        out = compiled(*flat)
        if any(a.joint_module is not edited for a in cache.artifacts):
            raise JointDescriptorError(
                "this call needed no gradient (grad mode off, or no input requiring grad), "
                "so aotkit compiled an inference graph and the joint graph would not run; "
                "call the compiled function with grad enabled"
            )
        return pytree.tree_unflatten(list(out), jd.out_spec)

    return unflattened_compiled_fn

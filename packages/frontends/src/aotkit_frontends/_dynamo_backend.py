"""torch.compile backends built on aot_module_simplified.

``aot_autograd(fw_compiler=...)`` turns a pair of graph compilers into a dynamo backend, the
way ``torch._dynamo.backends.common.aot_autograd`` does. ``register_dynamo_backends()``
registers the two aotkit backends under names usable as ``torch.compile(backend=...)``:

* ``aotkit_eager``: the nop compiler for the forward and backward graphs (checks aotkit's
  tracing, partitioning and runtime without any code generation) and aotkit's min-cut
  rematerialization partitioner, as torch's ``aot_eager`` pairs ``boxed_nop`` with its
  min-cut partitioner (so both save the same kind of activations for the backward);
* ``aotkit_inductor``: TorchInductor's ``compile_fx_inner`` for both graphs, Inductor's
  decomposition table, and aotkit's min-cut rematerialization partitioner after
  Inductor's joint-graph passes, each graph compiled with its role, as torch's
  ``inductor`` backend does (See Note [Inductor's graph roles] in aotkit_backends).

# Note [Backend calling convention]
# Dynamo calls a backend's result as ``compiled(*args)``, except for graphs whose inputs
# are lists, tuples or dicts: those are flattened by ``flatten_graph_inputs``, which calls
# the result boxed, ``compiled(flat_args)``, after wrapping the graph in a ``GmWrapper``.
# aot_module_simplified returns the matching convention for each case
# (See Note [aot_module_simplified calling convention]). Both the backward compiler and the
# compiled callable are wrapped with
# ``torch._dynamo.disable`` so that dynamo never traces into them.

# Note [Import cost]
# Importing ``torch._dynamo`` imports most of torch.compile, Inductor included: several
# seconds, more than ``import torch`` itself; sympy (through torch's symbolic_shapes),
# networkx and triton (through torch.utils.flop_counter) add about 3.5 s more. A user of ``aot_function`` with their own compilers, or of
# ``aotkit_partitioners`` alone, needs none of them at import time, so no aotkit module
# imports dynamo, Inductor, symbolic_shapes, flop_counter or networkx at module level; each is imported
# where it is first used (tests/test_import_cost.py checks ``sys.modules``):
#   * the backends ``aotkit_eager`` and ``aotkit_inductor`` are module attributes here, and
#     dynamo's registry finds them through this package's ``torch_dynamo_backends`` entry
#     points the first time ``torch.compile(backend="aotkit_eager")`` looks the name up;
#     ``register_dynamo_backends()`` registers them by hand (a source checkout without
#     installed metadata), and ``import aotkit`` calls it when dynamo is already loaded;
#   * what a backend call needs from dynamo (counters, ``disable``, ``defake``,
#     ``flatten_graph_inputs``) is imported inside the call; by then dynamo is loaded;
#   * ``isinstance(mod, GmWrapper)`` is asked only when ``torch._dynamo.utils`` is loaded
#     (a GmWrapper cannot exist otherwise); likewise aotkit_capture's error translation
#     checks for ``GuardOnDataDependentSymNode`` only when symbolic_shapes is loaded;
#   * the ShapeEnv, its printer and dynamo's ``Source`` classes are imported when shapes
#     are made dynamic (aotkit_capture); the partitioners import symbolic_shapes' helpers,
#     the FLOP formulas and networkx when they first need them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.fx
from aotkit_backends import (
    GraphRole,
    inductor_decompositions,
    inductor_joint_graph_passes,
    inductor_pre_grad_passes,
    inductor_settings_key,
    make_inductor_compiler,
    mark_user_visible_outputs,
    nop,
)
from aotkit_partitioners import min_cut_rematerialization_partition
from aotkit_schemas import mark_cache_key, mark_uses_donated_inputs, uses_donated_inputs
from torch._decomp import get_decompositions
from torch.utils._python_dispatch import _disable_current_modes

from ._simplified import aot_module_simplified, disk_cache_default

DecompositionsArg = dict[Any, Callable[..., Any]] | Callable[[], dict[Any, Callable[..., Any]]]


class AotAutograd:
    """A dynamo backend: compiles each captured graph with ``aot_module_simplified``.

    ``kwargs`` are aot_module_simplified's keyword arguments; ``fw_compiler`` is required.
    ``decompositions`` may be a zero-argument callable returning the table, resolved at the
    first compilation (Inductor's table is expensive to import).
    """

    def __init__(self, *, disk_cache: bool = False, **kwargs: Any) -> None:
        if "fw_compiler" not in kwargs or kwargs["fw_compiler"] is None:
            raise TypeError("aot_autograd: fw_compiler is required")
        self.__name__ = "compiler_fn"
        self.kwargs = kwargs
        # what the user passed, before the first compile resolves it: See Note [Pickling
        # a backend]
        self._given = dict(kwargs, disk_cache=disk_cache)
        self._registered_as: str | None = None
        # the on-disk cache's default for this backend (See Note [On-disk compile cache]
        # in aotkit_cache): on for aotkit_eager and aotkit_inductor
        self.disk_cache = disk_cache

    # Note [Pickling a backend]
    # ``pickle.dumps(torch.compile(model, backend=b))`` pickles the backend ``b`` (inside
    # the OptimizedModule's dynamo context). Like torch's AotAutograd, the first compile
    # rewrites ``self.kwargs`` (the decompositions thunk resolved, the backward compiler
    # wrapped in a dynamo-disabled function carrying the wrapped compiler's name, which
    # pickle cannot find). So a backend pickles what its user gave it, not what it turned
    # that into: the registered ``aotkit_eager``/``aotkit_inductor`` by reference (they
    # unpickle to the same objects), any other AotAutograd by its given kwargs (which
    # pickle when the user's compilers do: module-level functions, not closures). torch's
    # own ``aot_autograd(...)`` result does not pickle once it has compiled; aotkit's does.
    def __reduce__(self) -> str | tuple[Any, ...]:
        if self._registered_as is not None:
            return self._registered_as
        return (_rebuild_backend, (self._given,))

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any
    ) -> Callable[..., Any]:
        if any(isinstance(x, (list, tuple, dict)) for x in example_inputs):
            # See Note [Backend calling convention]
            from torch._dynamo.utils import flatten_graph_inputs  # See Note [Import cost]

            flattened: Callable[..., Any] = flatten_graph_inputs(gm, example_inputs, self._compile)
            return flattened
        return self._compile(gm, example_inputs)

    def _compile(self, gm: torch.nn.Module, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        decompositions = self.kwargs.get("decompositions")
        if callable(decompositions):
            self.kwargs["decompositions"] = decompositions()
        fw_compiler = self.kwargs["fw_compiler"]
        bw_compiler = self.kwargs.get("bw_compiler") or fw_compiler
        if not getattr(bw_compiler, "_aotkit_disabled_bw", False):
            bw_compiler = _disable_backward(bw_compiler)
        self.kwargs["bw_compiler"] = bw_compiler
        self.kwargs["inference_compiler"] = self.kwargs.get("inference_compiler") or fw_compiler
        from torch._dynamo.utils import counters  # See Note [Import cost]

        counters["aot_autograd"]["total"] += 1
        try:
            with disk_cache_default(self.disk_cache):
                forward = aot_module_simplified(gm, example_inputs, **self.kwargs)
        except Exception:
            counters["aot_autograd"]["not_ok"] += 1
            raise
        counters["aot_autograd"]["ok"] += 1
        return _disable(forward, "do not trace the AOT-compiled graph")


def _rebuild_backend(given: dict[str, Any]) -> AotAutograd:
    """Unpickle an AotAutograd (See Note [Pickling a backend])."""
    return AotAutograd(**given)


def _disable(fn: Callable[..., Any], reason: str) -> Callable[..., Any]:
    """``fn`` wrapped so that dynamo runs it eagerly instead of tracing it."""
    import torch._dynamo  # See Note [Import cost]

    disabled: Callable[..., Any] = torch._dynamo.disable(fn, reason=reason)  # type: ignore[no-untyped-call]
    return disabled


def _disable_backward(bw_compiler: Callable[..., Any]) -> Callable[..., Any]:
    """Keep dynamo out of the backward compiler and of the backward it produces."""

    @functools.wraps(bw_compiler)
    def compile_backward(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        compiled = _disable(bw_compiler, "do not trace the backward compiler")(gm, example_inputs)
        disabled = _disable(compiled, "do not trace the compiled backward")
        if uses_donated_inputs(compiled):  # See Note [Donated buffers reused by the backward's compiler]
            mark_uses_donated_inputs(disabled)
        return disabled

    compile_backward._aotkit_disabled_bw = True  # type: ignore[attr-defined]
    return compile_backward


def aot_autograd(**kwargs: Any) -> AotAutograd:
    """A torch.compile backend that runs aotkit on every graph dynamo captures.

    Takes aot_module_simplified's keyword arguments (``fw_compiler`` required; see
    AotAutograd). Use as ``torch.compile(model, backend=aot_autograd(fw_compiler=...))``.
    """
    return AotAutograd(**kwargs)


# The ops torch's memory-efficient-fusion recipe decomposes: backward ops of pointwise
# activations and a few composite ops, so that the partitioner sees cheap pointwise
# primitives it may recompute.
_DEFAULT_DECOMPOSITION_OPS: list[Any] = [
    torch.ops.aten.detach,
    torch.ops.aten.gelu_backward,
    torch.ops.aten.leaky_relu_backward,
    torch.ops.aten.sigmoid_backward,
    torch.ops.aten.threshold_backward,
    torch.ops.aten.hardtanh_backward,
    torch.ops.aten.hardsigmoid_backward,
    torch.ops.aten.hardswish_backward,
    torch.ops.aten.tanh_backward,
    torch.ops.aten.silu_backward,
    torch.ops.aten.elu_backward,
    torch.ops.aten.cudnn_batch_norm,
    torch.ops.aten.cudnn_batch_norm_backward,
    torch.ops.aten.masked_fill.Scalar,
    torch.ops.aten.masked_fill.Tensor,
    torch.ops.aten.elu,
    torch.ops.aten.leaky_relu,
    torch.ops.aten.hardtanh,
    torch.ops.aten.hardswish,
    torch.ops.aten.hardsigmoid,
    torch.ops.aten.conj_physical,
    torch.ops.aten.is_same_size,
]


# The decomposition table of the memory-efficient-fusion recipe: a dict, like torch's
# ``functorch.compile.default_decompositions``, so it can be passed as ``decompositions=``.
default_decompositions: dict[Any, Callable[..., Any]] = get_decompositions(
    _DEFAULT_DECOMPOSITION_OPS
)


def mem_efficient_fusion_kwargs(use_decomps: bool) -> dict[str, Any]:
    """aot_autograd kwargs for memory-efficient fusion: min-cut partitioning.

    torch's recipe compiles both graphs with TorchScript; aotkit has no TorchScript
    compiler, so both graphs run through the nop compiler and the benefit is the
    partitioner's choice of what to save.
    """
    kwargs: dict[str, Any] = {
        "fw_compiler": nop,
        "bw_compiler": nop,
        "partition_fn": min_cut_rematerialization_partition,
    }
    if use_decomps:
        kwargs["decompositions"] = dict(default_decompositions)
    return kwargs


def fake_tensor_unsupported(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a backend that needs real inputs: fake example inputs become zero tensors."""

    @functools.wraps(fn)
    def wrapper(model: Any, inputs: Sequence[Any], **kwargs: Any) -> Any:
        from torch._dynamo.utils import defake  # See Note [Import cost]

        with _disable_current_modes():
            real = [defake(x) for x in inputs]
            return fn(model, real, **kwargs)

    return wrapper


def device_from_inputs(example_inputs: Iterable[Any]) -> torch.device:
    """The device of the first tensor input (CPU when there is none)."""
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            return x.device
    return torch.device("cpu")


def dtype_from_inputs(example_inputs: Iterable[Any]) -> torch.dtype:
    """The dtype of the first tensor input (float32 when there is none)."""
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            return x.dtype
    return torch.float32


# Note [Layout optimization in aotkit_inductor]
# Inductor's layout optimization (on by default, as in torch's ``inductor`` backend) may
# return the forward's saved activations channels-last where the trace had them
# contiguous (only in graphs with convolutions: others compile as they are). aotkit_inductor
# keeps it on when the backward will be compiled for the
# strides the forward really produces (See Note [Saved tensors keep the compiled
# forward's strides] in aotkit_capture): the forward compiles while the strides are
# listened to (``TracingContext.output_strides`` is a list), its user outputs are marked
# user-visible (so Inductor pins their strides to the trace's; the partition step marks
# them; a forward restored from the disk cache keeps the mark: See Note [User-visible
# output stamps of cached graphs] in aotkit_capture), and Inductor reported one stride per
# forward output. Otherwise (no TracingContext, a forward from another partitioner, effect
# tokens unlifted around Inductor) the forward is compiled with the optimization off, so every
# output keeps the trace's strides. The backward and inference graphs keep it on: all their
# outputs are user-visible, and the backward's inputs are the restrided saved tensors and
# the tangents coerced to their traced layouts.


def _inductor_for_role(role: GraphRole) -> Callable[..., Callable[[list[Any]], Any]]:
    """An Inductor compiler for graphs of ``role``, its layout optimization on where the
    backward follows the forward's layouts. See Note [Layout optimization in
    aotkit_inductor]."""
    # traced with Inductor's table (``inductor_decompositions``): See Note [Why
    # inductor_compiler re-traces] in aotkit_backends
    inner = make_inductor_compiler(retrace=False, role=role)

    def compile_for_role(
        gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
    ) -> Callable[[list[Any]], Any]:
        from torch._guards import TracingContext
        from torch._inductor import config  # imported on first compile: Inductor is slow to import

        conv = torch.ops.aten.convolution.default
        if role != "forward" or not gm.graph.find_nodes(op="call_function", target=conv):
            return inner(gm, example_inputs)  # Inductor optimizes layouts for convolutions only
        context = TracingContext.try_get()
        reported = None if context is None else context.output_strides
        output = gm.graph.find_nodes(op="output")[0]
        # Inductor's own key, set by ``mark_user_visible_outputs`` (the partition step)
        if reported is not None and "user_visible_output_idxs" in output.meta:
            compiled = inner(gm, example_inputs)
            outs = output.args[0]
            if isinstance(outs, list | tuple) and len(reported) == len(outs):
                return compiled
            reported.clear()  # not one stride per output: compiled again keeping layouts
        with config.patch(layout_optimization=False):
            return inner(gm, example_inputs)

    compile_for_role.__name__ = f"inductor_{role}"
    compile_for_role.__qualname__ = compile_for_role.__name__
    # See Note [Inductor settings in the on-disk cache key] in aotkit_backends
    mark_cache_key(
        compile_for_role, f"aotkit.inductor.layouts.{role}/2", settings=inductor_settings_key
    )
    return compile_for_role


def _inductor_partition(
    joint_module: torch.fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **kwargs: Any
) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """aotkit_inductor's partition function: Inductor's joint-graph passes on the joint
    graph, then aotkit's min-cut partitioner (which, as torch's, does not recompute what the
    backward would materialize: See Note [Values the backward must materialize] in
    aotkit_partitioners), the forward's non-saved outputs
    marked as the ones whose strides the caller observes. See Note [Inductor's graph roles]
    in aotkit_backends."""
    joint_module = inductor_joint_graph_passes(joint_module, joint_inputs)
    fw, bw = min_cut_rematerialization_partition(
        joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs
    )
    mark_user_visible_outputs(fw, num_fwd_outputs)
    return fw, bw


# Inductor's joint-graph passes read its config: See Note [Inductor settings in the
# on-disk cache key] in aotkit_backends
mark_cache_key(_inductor_partition, "aotkit.inductor.partition/4", settings=inductor_settings_key)


# The registered backends: module attributes, so that dynamo's registry can load them by
# name through the entry points in this package's pyproject. See Note [Import cost].
# Like torch's aot_eager and inductor backends, both keep eligible input mutations in the
# graph (a custom backward's write to a buffer the forward also wrote needs it; See Note
# [Data mutations in the backward] in aotkit_capture).
aotkit_eager = AotAutograd(
    disk_cache=True,
    fw_compiler=nop,
    bw_compiler=nop,
    partition_fn=min_cut_rematerialization_partition,
    keep_inference_input_mutations=True,
)
aotkit_inductor = AotAutograd(
    disk_cache=True,
    fw_compiler=_inductor_for_role("forward"),
    bw_compiler=_inductor_for_role("backward"),
    inference_compiler=_inductor_for_role("inference"),
    partition_fn=_inductor_partition,
    decompositions=inductor_decompositions,
    keep_inference_input_mutations=True,
    # See Note [Inductor pre-grad passes] in aotkit_backends
    pre_grad_passes=inductor_pre_grad_passes,
)
_BACKENDS = {"aotkit_eager": aotkit_eager, "aotkit_inductor": aotkit_inductor}
for _name, _backend in _BACKENDS.items():
    _backend._registered_as = _name  # See Note [Pickling a backend]
_REGISTERED: set[str] = set()


def register_dynamo_backends() -> list[str]:
    """Register ``aotkit_eager`` and ``aotkit_inductor`` with dynamo; return their names.

    An installed aotkit needs no call: dynamo finds both through the
    ``torch_dynamo_backends`` entry points on first use (See Note [Import cost]). Safe to
    call more than once: later calls do nothing.
    """
    from torch._dynamo.backends import registry  # See Note [Import cost]

    for name, backend in _BACKENDS.items():
        # dynamo may have loaded it through the entry point already (a torch.compile call
        # with the backend's name came first); registering it again would raise
        if name not in _REGISTERED and name not in registry._COMPILER_FNS:
            registry.register_backend(compiler_fn=backend, name=name)
        _REGISTERED.add(name)
    return list(_BACKENDS)

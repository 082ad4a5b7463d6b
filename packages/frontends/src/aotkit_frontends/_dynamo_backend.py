"""torch.compile backends built on aot_module_simplified.

``aot_autograd(fw_compiler=...)`` turns a pair of graph compilers into a dynamo backend, the
way ``torch._dynamo.backends.common.aot_autograd`` does. ``register_dynamo_backends()``
registers the two aotkit backends under names usable as ``torch.compile(backend=...)``:

* ``aotkit_eager``: the nop compiler for the forward and backward graphs (checks aotkit's
  tracing, partitioning and runtime without any code generation);
* ``aotkit_inductor``: TorchInductor's ``compile_fx_inner`` for both graphs, Inductor's
  decomposition table, and aotkit's min-cut rematerialization partitioner.

# Note [Backend calling convention]
# Dynamo calls a backend's result as ``compiled(*args)``, except for graphs whose inputs
# are lists, tuples or dicts: those are flattened by ``flatten_graph_inputs``, which calls
# the result boxed, ``compiled(flat_args)``, after wrapping the graph in a ``GmWrapper``.
# aot_module_simplified returns the matching convention for each case
# (See Note [aot_module_simplified calling convention]). Both the backward compiler and the
# compiled callable are wrapped with
# ``torch._dynamo.disable`` so that dynamo never traces into them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch._dynamo
import torch.fx
from aotkit_backends import inductor_compiler, nop
from aotkit_partitioners import default_partition
from aotkit_schemas import mark_cache_key
from torch._decomp import get_decompositions
from torch._dynamo.backends.registry import register_backend
from torch._dynamo.utils import counters, defake, flatten_graph_inputs
from torch.utils._python_dispatch import _disable_current_modes

from ._simplified import aot_module_simplified, disk_cache_default

_min_cut: Callable[..., Any]
try:
    from aotkit_partitioners import (  # type: ignore[attr-defined, unused-ignore]
        min_cut_rematerialization_partition as _min_cut,
    )
except ImportError:
    # TODO: drop this fallback once aotkit_partitioners exports
    # min_cut_rematerialization_partition; until then aotkit_inductor saves every
    # activation the default partitioner chooses instead of recomputing cheap ones.
    _min_cut = default_partition

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
        # the on-disk cache's default for this backend (See Note [On-disk compile cache])
        self.disk_cache = disk_cache

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any
    ) -> Callable[..., Any]:
        if any(isinstance(x, (list, tuple, dict)) for x in example_inputs):
            # See Note [Backend calling convention]
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
        counters["aot_autograd"]["total"] += 1
        try:
            with disk_cache_default(self.disk_cache):
                forward = aot_module_simplified(gm, example_inputs, **self.kwargs)
        except Exception:
            counters["aot_autograd"]["not_ok"] += 1
            raise
        counters["aot_autograd"]["ok"] += 1
        return _disable(forward, "do not trace the AOT-compiled graph")


def _disable(fn: Callable[..., Any], reason: str) -> Callable[..., Any]:
    """``fn`` wrapped so that dynamo runs it eagerly instead of tracing it."""
    disabled: Callable[..., Any] = torch._dynamo.disable(fn, reason=reason)  # type: ignore[no-untyped-call]
    return disabled


def _disable_backward(bw_compiler: Callable[..., Any]) -> Callable[..., Any]:
    """Keep dynamo out of the backward compiler and of the backward it produces."""

    @functools.wraps(bw_compiler)
    def compile_backward(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        compiled = _disable(bw_compiler, "do not trace the backward compiler")(gm, example_inputs)
        return _disable(compiled, "do not trace the compiled backward")

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
        "partition_fn": _min_cut,
    }
    if use_decomps:
        kwargs["decompositions"] = dict(default_decompositions)
    return kwargs


def fake_tensor_unsupported(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a backend that needs real inputs: fake example inputs become zero tensors."""

    @functools.wraps(fn)
    def wrapper(model: Any, inputs: Sequence[Any], **kwargs: Any) -> Any:
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


def _inductor_decompositions() -> dict[Any, Callable[..., Any]]:
    # Imported when the first graph is compiled: importing Inductor takes seconds.
    from torch._inductor.decomposition import select_decomp_table

    table: dict[Any, Callable[..., Any]] = select_decomp_table()
    return table


def _inductor_keeping_layouts(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
) -> Callable[[list[Any]], Any]:
    """``inductor_compiler`` with Inductor's layout optimization off.

    With it on, Inductor may return convolution activations in channels-last layout from
    the forward graph, while the backward graph is compiled for the strides the trace
    saw (torch feeds the forward's real output strides back into the backward compile;
    aotkit does not yet). Keeping eager layouts makes the two agree.
    """
    from torch._inductor import config  # imported on first compile: Inductor is slow to import

    with config.patch(layout_optimization=False):
        return inductor_compiler(gm, example_inputs)


mark_cache_key(_inductor_keeping_layouts, "aotkit.inductor.keeping_layouts")


def _make_backends() -> dict[str, AotAutograd]:
    return {
        "aotkit_eager": AotAutograd(
            fw_compiler=nop, bw_compiler=nop, partition_fn=default_partition, disk_cache=True
        ),
        "aotkit_inductor": AotAutograd(
            disk_cache=True,
            fw_compiler=_inductor_keeping_layouts,
            bw_compiler=_inductor_keeping_layouts,
            partition_fn=_min_cut,
            decompositions=_inductor_decompositions,
        ),
    }


_REGISTERED: set[str] = set()


def register_dynamo_backends() -> list[str]:
    """Register ``aotkit_eager`` and ``aotkit_inductor`` with dynamo; return their names.

    Safe to call more than once: later calls do nothing.
    """
    backends = _make_backends()
    for name, backend in backends.items():
        if name not in _REGISTERED:
            register_backend(compiler_fn=backend, name=name)
            _REGISTERED.add(name)
    return list(backends)

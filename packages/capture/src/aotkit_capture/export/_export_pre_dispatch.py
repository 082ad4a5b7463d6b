"""Tracing a pre-dispatch graph for ``aot_export_module(..., pre_dispatch=True)``.

# Note [Pre-dispatch export]
# A pre-dispatch graph is traced *above* autograd: make_fx(pre_dispatch=True) records
# every op at the PreDispatch key, before the Autograd key has had a chance to decompose
# it. So the graph keeps
# * CompositeImplicitAutograd ops (``aten.linear``, ``aten.conv2d``, ``aten.matmul``):
#   autograd would have decomposed them, the pre-dispatch tracer sees them first;
# * grad-mode changes, as ``torch._C._set_grad_enabled`` calls (the tracer's torch-function
#   mode records them; they are side-effectful so dead-code elimination keeps them).
# An autograd.Function's forward is traced inline (its backward is not part of an
# inference graph), as in torch's pre-dispatch export.
# It is still functional: torch's FunctionalTensorMode, in its pre-dispatch form, sits on
# the same PreDispatch mode stack above the proxy mode and turns every mutation and view
# into its functional form. In its export form it decomposes only the CompositeImplicit
# ops that mutate or alias (``absolute_``; ``batch_norm``, which updates the running
# stats, arrives as ``_native_batch_norm_legit_functional``), keeps ``dropout`` as one op
# and freezes its output, so mutating it raises.
#
# The calling convention is the one of the ordinary inference export (See Note [Exported
# graph calling convention]): ``(*params, *buffers, *flat inputs) -> (*updated inputs,
# *flat outputs)``. Unlike the ordinary export, the trace runs under the caller's grad mode
# (a pre-dispatch graph records grad-mode changes, so it must see the real one), and the
# graph is traced directly with one placeholder per flat input: re-tracing it below
# autograd would drop exactly what pre-dispatch keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from aotkit_functional import assert_functional_graph, from_functional, to_functional
from aotkit_schemas import DecompositionTable, ViewAndMutationMeta
from aotkit_tracing import FlatFn
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.functional_tensor import FunctionalTensorMode
from torch.fx.experimental.proxy_tensor import make_fx


def trace_pre_dispatch(
    flat_fn: FlatFn,
    fake_args: Sequence[Any],
    meta: ViewAndMutationMeta,
    decompositions: DecompositionTable,
) -> torch.fx.GraphModule:
    """Trace ``args -> (*updated inputs, *outputs)`` above autograd, functionalized.

    ``meta`` is the inference metadata of ``flat_fn`` (no input mutation kept in the
    graph); See Note [Pre-dispatch export].
    """
    if meta.keep_input_mutations:
        raise AssertionError("pre-dispatch export returns every input mutation as an output")
    mutated = meta.mutated_inp_runtime_indices

    def pre_dispatch_forward(*args: Any) -> tuple[Any, ...]:
        # Only the Python mode functionalizes: the C++ Functionalize key stays off above it.
        exclude = torch._C._ExcludeDispatchKeyGuard(
            torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)
        )
        with exclude:
            f_args = [to_functional(a) for a in args]
            outs = list(flat_fn(*f_args))
        if len(outs) != len(meta.output_info):
            raise AssertionError(
                f"the function returned {len(outs)} values on the pre-dispatch trace, "
                f"{len(meta.output_info)} on the metadata pass"
            )
        returns = [*(f_args[i] for i in mutated), *outs]
        return tuple(from_functional(r) for r in returns)

    mode = FunctionalTensorMode(pre_dispatch=True, export=True, _keep_input_mutations=False)
    with enable_python_dispatcher(), mode:
        gm: torch.fx.GraphModule = make_fx(
            pre_dispatch_forward,
            decomposition_table=decompositions,
            record_module_stack=True,
            pre_dispatch=True,
        )(*fake_args)
    assert_functional_graph(gm.graph)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm

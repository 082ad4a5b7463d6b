"""The strides the compiled forward gives the tensors it saves for the backward, fed to the
backward's compile.

# Note [Saved tensors keep the compiled forward's strides]
# A compiler may lay out a forward output that only the backward reads as it likes:
# Inductor's layout optimization returns convolution activations channels-last when the
# trace had them contiguous. The backward must then be compiled for the strides the
# compiled forward really produces, not the ones the trace saw, or a compiler that bakes
# input strides into its code (Inductor) computes with the wrong ones. As torch does, the
# forward compiles inside ``TracingContext.report_output_strides()``; a compiler that
# knows its outputs' strides (Inductor) appends one entry per forward output (None when
# unknown). The backward's example inputs for the saved tensors are then restrided to the
# reported strides where they differ (decided on proofs only, so no guard is installed on
# a dynamic size). A report that does not have one entry per forward output is not used.
# The compiler is told that its strides are listened to by ``TracingContext.output_strides``
# being a list: without a TracingContext (``aot_function`` outside dynamo) nothing is
# reported, and aotkit_inductor then keeps eager layouts (See Note [Layout optimization
# in aotkit_inductor] in aotkit_frontends). The user-visible forward outputs keep the
# trace's strides whatever the compiler does (Inductor pins them); the tangents are
# coerced to the traced layouts at run time (See Note [Tangent strides follow the
# outputs] in aotkit_analysis).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from aotkit_schemas import PartitionResult
from torch._guards import TracingContext

Strides = list[tuple[Any, ...] | None]


@contextlib.contextmanager
def reported_output_strides() -> Iterator[Strides | None]:
    """The strides the compiler reports for the forward it compiles inside this block
    (filled when the block ends), or None without a TracingContext. See Note [Saved
    tensors keep the compiled forward's strides]."""
    with TracingContext.report_output_strides() as strides:
        yield strides


def saved_tensor_strides(
    strides: Strides | None, partition: PartitionResult
) -> Strides | None:
    """The reported strides of the saved tensors, in saved order; None when the report
    does not have one entry per forward output (or no entry differs from unknown)."""
    if not strides:
        return None
    n_outs = partition.num_fwd_outputs + partition.num_saved_tensors + partition.num_saved_symints
    if len(strides) != n_outs:
        return None
    start = partition.num_fwd_outputs
    saved = list(strides[start : start + partition.num_saved_tensors])
    return saved if any(s is not None for s in saved) else None


def restride_saved(
    bw_example: list[Any], saved_strides: Strides | None, partition: PartitionResult
) -> list[Any]:
    """``bw_example`` (the backward's placeholder values: saved symints, saved tensors,
    tangents) with each saved tensor restrided to the forward's reported stride where it
    differs. See Note [Saved tensors keep the compiled forward's strides]."""
    if saved_strides is None:
        return bw_example
    # See Note [Import cost] in aotkit_frontends
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    out = list(bw_example)
    first = partition.num_saved_symints
    for k, stride in enumerate(saved_strides):
        i = first + k
        ph = out[i] if i < len(out) else None
        if stride is None or not isinstance(ph, torch.Tensor) or len(stride) != ph.dim():
            continue
        if all(statically_known_true(a == b) for a, b in zip(ph.stride(), stride, strict=True)):
            continue
        out[i] = ph.as_strided(ph.size(), stride)
    return out


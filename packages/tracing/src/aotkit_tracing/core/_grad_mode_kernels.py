"""Joint traces avoid kernels whose saved state depends on grad mode at run time.

# Note [Kernels that read grad mode]
# On CPU with oneDNN enabled, ``nn.LSTM`` runs ``aten.lstm``'s composite kernel, which
# calls ``aten.mkldnn_rnn_layer`` once per layer and direction. That kernel returns its
# training ``workspace`` (read by ``mkldnn_rnn_layer_backward``) only when grad mode is on
# *when it runs*: under no_grad it returns an undefined tensor, whatever its ``train``
# argument says. A compiled forward always runs under no_grad (it is the body of an
# autograd.Function's forward, in torch's AOTAutograd as here), so a joint graph holding
# ``mkldnn_rnn_layer`` saves an undefined workspace and its backward fails ("Expected a
# proper Tensor but got None ... 'workspace'"); torch's own AOTAutograd fails the same way.
#
# The joint is therefore traced with oneDNN's RNN path switched off: the composite kernel
# then unrolls each layer into plain differentiable cell ops (matmuls and pointwise ops,
# with eager's dropout between layers), as it already does for GRU and RNN, and the
# backward is autograd's derivative of those ops. Values equal eager's up to floating-point
# reassociation. Only the joint is affected: inference graphs (no backward) keep the fused
# kernel, whose workspace is never read. The flag is process-global, so it is restored in
# a ``finally`` even if the trace raises.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

# Note [Compilers see the caller's oneDNN setting]
# The switch above is process-global and, under a ShapeEnv (always, under dynamo), held for
# the whole compile (See Note [Recurrent layers under the Python dispatcher]). The
# compilers and the partitioner must not see it: Inductor reads it to choose channels-last
# layouts for convolutions and its oneDNN fusions and weight prepacking, so with it off an
# aotkit_inductor graph compiled to slower code than torch's ``inductor`` for the same
# graph. ``compiler_kernel_choices`` switches oneDNN back on for a compiler call when a
# ``joint_kernel_choices`` switched it off, and off again after.
_switched_off: list[bool] = []


@contextlib.contextmanager
def joint_kernel_choices() -> Iterator[None]:
    """Trace a joint graph with kernels whose backward does not depend on run-time grad mode.

    See Note [Kernels that read grad mode].
    """
    enabled = torch._C._get_mkldnn_enabled()
    if not enabled:
        yield
        return
    torch._C._set_mkldnn_enabled(False)
    _switched_off.append(True)
    try:
        yield
    finally:
        _switched_off.pop()
        torch._C._set_mkldnn_enabled(True)


@contextlib.contextmanager
def compiler_kernel_choices() -> Iterator[None]:
    """oneDNN as the caller had it, for a compiler or partitioner call. See Note [Compilers
    see the caller's oneDNN setting]."""
    if not _switched_off or torch._C._get_mkldnn_enabled():
        yield
        return
    torch._C._set_mkldnn_enabled(True)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(False)


# Note [Recurrent layers under the Python dispatcher]
# Symbolic traces run with the Python dispatcher, which makes ``aten.lstm``, ``aten.gru``,
# ``aten.rnn_tanh`` and ``aten.rnn_relu`` take torch's Python decompositions instead of
# their C++ composite kernels. Those decompositions never apply the dropout between layers
# (their test ``num_layers < i - 1`` is never true), so a multi-layer RNN with
# ``dropout > 0`` in training mode silently loses its dropout (torch's AOTAutograd does,
# under dynamic shapes). Eager runs the C++ kernels, which apply it. aotkit's symbolic
# traces therefore take the C++ composite kernels of these ops: their Python kernels are
# set aside for the duration of the trace and restored after it. With oneDNN off (the LSTM
# kernel's oneDNN check reads ``numel()``, which a symbolic tensor cannot answer) the C++
# kernels trace with symbolic sizes; the sequence length is specialized, as in torch's
# decompositions, which loop over it.
_RECURRENT_OPS = (
    "lstm.input",
    "lstm.data",
    "gru.input",
    "gru.data",
    "rnn_tanh.input",
    "rnn_tanh.data",
    "rnn_relu.input",
    "rnn_relu.data",
)
_COMPOSITE_KEYS = (
    torch._C.DispatchKey.Autograd,
    torch._C.DispatchKey.CompositeImplicitAutograd,
)


@contextlib.contextmanager
def symbolic_dispatch(symbolic: bool) -> Iterator[None]:
    """The Python dispatcher for a symbolic trace, recurrent layers on their C++ kernels.

    See Note [Recurrent layers under the Python dispatcher].
    """
    if not symbolic:
        yield
        return
    from torch._dispatch.python import enable_python_dispatcher

    saved: list[tuple[Any, Any, Any]] = []
    for name in _RECURRENT_OPS:
        packet, overload = name.split(".")
        op = getattr(getattr(torch.ops.aten, packet), overload)
        for key in _COMPOSITE_KEYS:
            if key in op.py_kernels:
                saved.append((op, key, op.py_kernels.pop(key)))
        op._dispatch_cache.clear()
    try:
        with enable_python_dispatcher(), joint_kernel_choices():
            yield
    finally:
        for op, key, kernel in saved:
            op.py_kernels[key] = kernel
            op._dispatch_cache.clear()

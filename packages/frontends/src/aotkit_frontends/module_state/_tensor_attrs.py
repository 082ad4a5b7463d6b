"""Tensors held in plain module attributes, passed to aot_module's graphs as inputs.

# Note [Tensor attributes of aot_module's modules]
# A forward may read a tensor kept in a plain attribute, neither parameter nor buffer:
# ``self.t = torch.ones(3)`` in ``__init__``, or state a previous call left
# (``self.last = y.detach()``, replayed after each call: See Note [Tensors a forward
# assigns to module attributes]). Eager reads the attribute's current tensor on every call.
# torch's aot_module fails on both ("Please convert all Tensors to FakeTensors first",
# "Unexpected fake buffer _tensor_constant0"); before, aotkit raised CapturedTensorError.
# A graph cannot keep such a tensor as a constant (its later values would be ignored, no
# gradient would reach it, an in-place update of it would be lost), so aot_module passes
# it as an input, as it does parameters and buffers:
#   * discovery: reads are recorded during the trace (See Note [Recording module attribute
#     reads]). When a trace read an attribute that holds a tensor (whether the trace then
#     failed on the real tensor, or only read its shape and succeeded), the attribute
#     becomes a "tensor input" of the module (``ModuleAttrs.take_tensor_reads``), the
#     trace's result is dropped, and the call is made again (``RetryWithTensorAttributes``,
#     caught by AOTModule.forward): one extra trace, only for such modules.
#   * calls: AOTModule.forward reads the current value of each tensor input from its
#     submodule's ``__dict__`` and passes them, after the user's arguments, in the keyword
#     argument ``TENSOR_ATTRIBUTES`` (left out when none holds a tensor, so that such a
#     call finds the graphs compiled before any attribute was an input); so they are flat inputs of the graph, guarded like any
#     input (shape, dtype, strides, requires_grad), with gradients and input mutations
#     written back to the user's tensor as for any input. Rebinding the attribute to
#     another tensor of the same kind needs no recompilation and reads the new tensor.
#   * the key: a tensor input is a watched slot of ModuleAttrs keyed by its value's type
#     (See Note [Plain module attributes in aot_module's key]), so ``self.last = None``
#     after a tensor (or the reverse, as in ``if self.last is not None``) compiles the
#     other branch, and a tensor then has no flat input (None in its place).
#   * the trace: the traced function swaps each traced tensor input into its attribute
#     for the forward (``swapped_tensor_attributes``) and puts the user's tensor back
#     after it, unless the forward assigned the attribute itself, whose new tensor is then
#     an extra output as before. Every other attribute holding a tensor gets a meta
#     stand-in of its metadata for the forward: a discovery trace, whose result is
#     dropped, must not run on the user's tensor (``self.count.add_(1)`` on the real
#     tensor, once per trace pass, counted calls that never happened).
# Tensors inside lists, dicts or tuples held by attributes are not inputs: a trace that
# reads one still raises CapturedTensorError, which names the attribute. A module with a
# tensor in a plain attribute is not stored in the on-disk cache (a restored entry runs no
# trace, so it could not discover the read).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn

from ._module_attrs import ModuleAttrs
from ._reparametrize import swapping_module_state

TENSOR_ATTRIBUTES = "__aotkit_tensor_attributes__"
RETRY_LIMIT = 8


class RetryWithTensorAttributes(Exception):
    """A trace read tensors held in plain module attributes that were not inputs yet: the
    call is made again with them as inputs. See Note [Tensor attributes of aot_module's
    modules]."""


@contextlib.contextmanager
def swapped_tensor_attributes(
    mod: nn.Module, attrs: ModuleAttrs, values: tuple[Any, ...]
) -> Iterator[None]:
    """Put the traced ``values`` in the tensor-input attributes for the body, and meta
    stand-ins in the other attributes of ``mod``'s submodules that hold a tensor; put the
    user's tensors back after it, except where the body assigned the attribute."""
    swapped: list[tuple[dict[str, Any], str, Any, Any]] = []
    places = attrs.tensor_input_places() if values else []  # () when none holds a tensor
    inputs = set()
    for (table, attr, _), value in zip(places, values, strict=True):
        inputs.add((id(table), attr))
        if isinstance(value, torch.Tensor):
            swapped.append((table, attr, table.get(attr), value))
    stand_ins: dict[int, torch.Tensor] = {}
    for sub in mod.modules():
        table = sub.__dict__
        for attr, value in table.items():
            if isinstance(value, torch.Tensor) and (id(table), attr) not in inputs:
                stand_in = stand_ins.get(id(value))
                if stand_in is None:
                    stand_in = stand_ins[id(value)] = _meta_like(value)
                swapped.append((table, attr, value, stand_in))
    with swapping_module_state():  # See Note [Module state read while another thread traces]
        for table, attr, _, new in swapped:
            table[attr] = new
        try:
            yield
        finally:
            for table, attr, original, value in swapped:
                if table.get(attr) is value:
                    table[attr] = original


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with ``t``'s metadata: read by a discovery trace instead of the user's
    tensor, so nothing the trace does to it reaches the user's data. See Note [Tensor
    attributes of aot_module's modules]."""
    meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    return meta.requires_grad_(t.requires_grad) if t.is_floating_point() or t.is_complex() else meta

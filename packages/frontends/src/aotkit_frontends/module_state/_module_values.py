"""What module-state tracking reads about values: nn.Module's own bookkeeping, the plain
values a trace may bake in (See Note [Plain module attributes in aot_module's key]), and
tensors a trace created."""

from __future__ import annotations

import enum
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor

# nn.Module's own bookkeeping: hooks, parameter/buffer/submodule tables, training flag.
_MODULE_INTERNALS = frozenset({
    "_backward_hooks", "_backward_pre_hooks", "_buffers", "_forward_hooks",
    "_forward_hooks_always_called", "_forward_hooks_with_kwargs", "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs", "_is_full_backward_hook",
    "_load_state_dict_post_hooks", "_load_state_dict_pre_hooks", "_modules",
    "_non_persistent_buffers_set", "_parameters", "_state_dict_hooks",
    "_state_dict_pre_hooks", "training", "_initialize_hook", "_load_hook",
})

# Caches torch's own modules rebuild from their parameters (nn.RNNBase re-reads its
# weights when it sees them swapped): restored silently, never reported.
_DERIVED_CACHES = frozenset({"_flat_weights", "_flat_weight_refs"})

_SCALAR_TYPES = frozenset({
    bool, int, float, complex, str, type(None), torch.dtype, torch.device, torch.layout,
    torch.memory_format,
})

def is_plain(value: Any) -> bool:
    """A value a trace bakes in that compares by value: See Note [Plain module attributes
    in aot_module's key]."""
    t = type(value)
    if t in _SCALAR_TYPES or isinstance(value, enum.Enum):
        return True
    if t is tuple or t is list:
        return all(is_plain(v) for v in value)
    if t is dict:
        return all(is_plain(k) and is_plain(v) for k, v in value.items())
    return False


def is_tracing_tensor(t: torch.Tensor) -> bool:
    """A fake, functional or meta tensor: one a trace created, never a user's value."""
    return (
        isinstance(t, (FakeTensor, FunctionalTensor))
        or torch._is_functional_tensor(t)
        or t.device.type == "meta"
    )

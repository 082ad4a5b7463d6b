"""Device queries answered in aotkit's own dispatch modes of a trace.

# Note [Device queries in the trace's dispatch modes]
# A C++ FunctionalTensorWrapper takes its inner tensor's "custom device" policy, and a
# FakeTensor has one: every ``.device`` of a natively functionalized tensor (C++ code
# asks too: the wrapper's constructor, autograd's engine, the Functionalize kernels)
# dispatches ``prim.device`` down to the inner fake tensor, through every Python dispatch
# mode of the trace: aotkit's (the single pass's op gate, the RNG keying), then
# make_fx's proxy mode, which passes it on untraced, then FakeTensorMode, which answers
# from the fake tensor (``meta`` inside a fake kernel, else its fake device). On timm's
# resnet18 that is about 480 queries per compile, each several Python frames.
#
# The topmost aotkit mode answers it itself, as FakeTensor's ``device`` property does
# (the same answer FakeTensorMode gives), when nothing but aotkit's own modes (which pass
# a device query on unchanged) and torch's infrastructure modes (proxy, fake) lies below
# it: no other Python mode is on the stack (a user's mode still sees every query), no
# Python functionalization mode, and the argument is a FakeTensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import ProxyTorchDispatchMode

_PRIM_DEVICE = torch.ops.prim.device.default
_FUNCTIONAL = torch._C._TorchDispatchModeKey.FUNCTIONAL

# aotkit's trace modes, each passing a device query on unchanged (they register here),
# and torch's infrastructure modes of a trace
OWN_MODES: set[type] = set()
_INFRA_MODES = (FakeTensorMode, ProxyTorchDispatchMode)


def _only_own_modes_below() -> bool:
    n = torch._C._len_torch_dispatch_stack()
    for i in range(n):
        kind = type(torch._C._get_dispatch_stack_at(i))
        if kind not in OWN_MODES and kind not in _INFRA_MODES:
            return False
    return True


def is_device_query(func: Any, args: Sequence[Any]) -> bool:
    """Whether a dispatch mode may answer ``func(*args)`` with ``fake_device``. See Note
    [Device queries in the trace's dispatch modes]."""
    return (
        func is _PRIM_DEVICE
        and len(args) == 1
        and isinstance(args[0], FakeTensor)
        and torch._C._get_dispatch_mode(_FUNCTIONAL) is None
        and _only_own_modes_below()
    )


def fake_device(t: FakeTensor) -> torch.device:
    """What FakeTensorMode answers to ``prim.device`` of ``t``."""
    device: torch.device = t.device
    return device

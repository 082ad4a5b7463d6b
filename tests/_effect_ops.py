"""The effectful custom ops the effect-token tests share (``aotkit_effects_test::log`` and
``::tick``), in one module: test files import it by name, so the ops are registered once
and every test reads the same ``LOG`` (a test module imported from another test module
under pytest's importlib mode is a second copy, whose registration would replace the
first one's kernel and write to another list).
"""

from __future__ import annotations

import torch
from torch._higher_order_ops.effects import _EffectType, _register_effectful_op
from torch._library.effects import EffectType

LOG: list[str] = []


@torch.library.custom_op("aotkit_effects_test::log", mutates_args=())
def _log(x: torch.Tensor, tag: str) -> torch.Tensor:
    LOG.append(tag)
    return x.clone()


@_log.register_fake
def _(x: torch.Tensor, tag: str) -> torch.Tensor:
    return torch.empty_like(x)


_log.register_autograd(lambda ctx, g: (g * 3, None))
_HANDLE = _register_effectful_op(torch.ops.aotkit_effects_test.log.default, _EffectType.ORDERED)


@torch.library.custom_op("aotkit_effects_test::tick", mutates_args=())
def _tick(x: torch.Tensor) -> torch.Tensor:
    LOG.append("tick")
    return x + 1


@_tick.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


_tick.register_autograd(lambda ctx, g: g)
# a custom op marked effectful through its own API (same effect type: one chain with log)
_tick.register_effect(EffectType.ORDERED)


def log(x: torch.Tensor, tag: str) -> torch.Tensor:
    out: torch.Tensor = torch.ops.aotkit_effects_test.log(x, tag)
    return out

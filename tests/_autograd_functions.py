"""Custom autograd.Functions shared by several test files (one definition, imported)."""

from __future__ import annotations

from typing import Any

import torch


class SaveInput(torch.autograd.Function):
    """Returns its input and saves it: the suite's ``SAF`` (a saved tensor that is also a
    user-visible value, so never a donated buffer)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx: Any, gx: torch.Tensor) -> torch.Tensor:
        (saved,) = ctx.saved_tensors
        return gx + saved

"""A small model for the ``aotkit inspect`` / ``compare`` CLI tests (file.py:factory)."""

import torch
import torch.nn as nn


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32))
        self.head = nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.encoder(x))).sum()


def make() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Small(), (torch.randn(8, 16),)


def not_a_pair() -> int:
    return 3

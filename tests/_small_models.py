"""Small models and the fresh-dynamo fixture shared by the compile-path tests
(test_compile_paths, test_grad_flags, test_device_queries)."""

from __future__ import annotations

from collections.abc import Iterator

import aotkit
import pytest
import torch._dynamo
import torch.nn as nn


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """Import it into a test module to reset dynamo around each of its tests."""
    aotkit.register_dynamo_backends()
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))


def convnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1)
    )


def attention() -> nn.Module:
    return nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)

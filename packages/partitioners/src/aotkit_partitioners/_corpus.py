"""A corpus of small joint graphs: each case is a function plus an input factory.

Adding a case is one entry in ``CASES``; the conformance kit runs every partitioner on all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F

from ._tracing import TracedJoint, TracingMode, make_joint


@dataclass(frozen=True)
class JointCase:
    """A function to differentiate, a factory for its primals and how to trace it."""

    fn: Callable[..., Any]
    # called with a seed offset; returns the primals (tensors with requires_grad set)
    inputs: Callable[[int], tuple[Any, ...]]
    tracing_mode: TracingMode = "fake"
    # the primals again with other sizes, for symbolic cases (None: same sizes only)
    resized_inputs: Callable[[int], tuple[Any, ...]] | None = None


def _t(*shape: int, grad: bool = True, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g).requires_grad_(grad)


def _mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2).tanh()


def _two_outputs(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = x @ w
    return h.relu(), (h.sigmoid() * x).sum(0)


def _pointwise_chain(x: torch.Tensor) -> torch.Tensor:
    for _ in range(6):
        x = F.gelu(x) * x.sigmoid() + x.cos()
    return x


def _norms(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    h = F.layer_norm(x, (x.shape[-1],), w, b)
    return F.softmax(h @ h.transpose(-1, -2), dim=-1).sum(-1).log1p()


def _views(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = (x.reshape(4, 2, 8).transpose(1, 2) @ w).permute(2, 0, 1).contiguous()
    return y.view(-1).exp()[::2].view(2, 8, 8).amax(-1)


def _dropout(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.dropout(F.relu(x @ w), 0.5, training=True) * x.sum()


def _conv_bn(
    x: torch.Tensor, w: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    h = F.conv2d(x, w, padding=1)
    h = F.batch_norm(h, None, None, gamma, beta, training=True)
    return F.relu(h).mean((2, 3))


def _symbolic(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.shape[0]
    h = (x * y.sum()).sin() / n
    return h.reshape(-1).cumsum(0), (x.t() @ x).sum() * x.shape[1]


CASES: dict[str, JointCase] = {
    "mlp": JointCase(
        _mlp,
        lambda s: (
            _t(6, 8, seed=s),
            _t(16, 8, seed=s),
            _t(16, grad=False, seed=s),
            _t(4, 16, seed=s),
        ),
    ),
    "two_outputs": JointCase(_two_outputs, lambda s: (_t(5, 5, seed=s), _t(5, 5, seed=s))),
    "pointwise_chain": JointCase(_pointwise_chain, lambda s: (_t(8, 8, seed=s),)),
    "norms": JointCase(_norms, lambda s: (_t(3, 5, 6, seed=s), _t(6, seed=s), _t(6, seed=s))),
    "views": JointCase(_views, lambda s: (_t(4, 16, seed=s), _t(2, 8, seed=s))),
    "dropout": JointCase(_dropout, lambda s: (_t(6, 6, seed=s), _t(6, 6, seed=s))),
    "conv_bn": JointCase(
        _conv_bn,
        lambda s: (_t(2, 3, 6, 6, seed=s), _t(4, 3, 3, 3, seed=s), _t(4, seed=s), _t(4, seed=s)),
    ),
    "symbolic": JointCase(
        _symbolic,
        lambda s: (_t(5, 3, seed=s), _t(4, seed=s)),
        tracing_mode="symbolic",
        resized_inputs=lambda s: (_t(7, 2, seed=s), _t(3, seed=s)),
    ),
}


@cache
def traced_case(name: str) -> TracedJoint:
    """The joint graph of ``CASES[name]`` (traced once per process)."""
    case = CASES[name]
    return make_joint(case.fn, case.inputs(0), tracing_mode=case.tracing_mode)

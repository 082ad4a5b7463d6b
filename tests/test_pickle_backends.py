"""A torch.compile'd model pickles and unpickles to a model that trains as eager does.

See Note [Pickling a backend] in aotkit_frontends.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch._dynamo
import torch.nn as nn
from aotkit_backends import inductor_available, inductor_unavailable_reason, nop
from aotkit_frontends import aot_autograd, register_dynamo_backends
from aotkit_frontends._dynamo_backend import aotkit_eager, aotkit_inductor
from functorch.compile import nop as torch_nop
from torch._dynamo.backends.common import aot_autograd as torch_aot_autograd


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    register_dynamo_backends()
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.GELU(), nn.Linear(8, 3))


def _train(model: nn.Module, steps: int, seed: int) -> list[torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        loss = model(torch.randn(5, 6, generator=gen)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses


def _backend(name: str) -> Any:
    if name == "aotkit_inductor" and not inductor_available():
        pytest.skip(inductor_unavailable_reason())
    if name == "aot_autograd(nop)":
        return aot_autograd(fw_compiler=nop)
    return name


@pytest.mark.parametrize(
    "name", ["aotkit_eager", "aotkit_inductor", "aot_autograd(nop)", "aot_eager"]
)
def test_compiled_model_pickles_and_trains_as_eager(name: str) -> None:
    eager = _model()
    compiled = torch.compile(copy.deepcopy(eager), backend=_backend(name))
    # compile first: the backend's first compile rewrites its kwargs
    torch.testing.assert_close(_train(compiled, 2, seed=1), _train(eager, 2, seed=1))
    loaded = pickle.loads(pickle.dumps(compiled))
    assert type(loaded) is type(compiled)
    assert loaded is not compiled and loaded._orig_mod is not compiled._orig_mod
    for p_l, p_e in zip(loaded.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p_l, p_e)
    torch.testing.assert_close(_train(loaded, 3, seed=2), _train(eager, 3, seed=2))
    for p_l, p_e in zip(loaded.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p_l, p_e)
    for b_l, b_e in zip(loaded.buffers(), eager.buffers(), strict=True):
        torch.testing.assert_close(b_l, b_e)


def test_registered_backends_unpickle_to_themselves() -> None:
    assert pickle.loads(pickle.dumps(aotkit_eager)) is aotkit_eager
    assert pickle.loads(pickle.dumps(aotkit_inductor)) is aotkit_inductor


def test_factory_result_pickles_after_compiling() -> None:
    backend = aot_autograd(fw_compiler=nop)
    torch.compile(_model(), backend=backend)(torch.randn(5, 6)).sum().backward()
    clone = pickle.loads(pickle.dumps(backend))
    assert clone.kwargs == {"fw_compiler": nop}
    # torch's factory result does not pickle once it has compiled (a local bw wrapper)
    oracle = torch_aot_autograd(fw_compiler=torch_nop)
    torch.compile(_model(), backend=oracle)(torch.randn(5, 6)).sum().backward()
    with pytest.raises((AttributeError, pickle.PicklingError)):
        pickle.dumps(oracle)

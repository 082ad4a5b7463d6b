"""Red-team programs: plain module attributes changed after the first call.

See Note [Plain module attributes in aot_module's key]. Each program runs eagerly and
through aotkit after every change; torch's aot_module is run once to pin its stale graph.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator

import pytest
import torch
import torch.nn as nn
from aotkit_backends import nop
from aotkit_capture import CapturedTensorError
from aotkit_frontends import aot_module
from aotkit_schemas import set_logs
from functorch.compile import nop as torch_nop
from torch._functorch import aot_autograd as torch_aot


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.offset = 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.offset


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()
        self.scale = 2.0
        self.use_relu = True
        self.unused = "never read"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x) * self.scale
        return torch.relu(y) if self.use_relu else torch.tanh(y)


@pytest.fixture
def recompiles(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    set_logs("recompiles")
    caplog.set_level(logging.INFO, logger="aotkit.cache.recompiles")
    try:
        yield caplog
    finally:
        set_logs()


def _reasons(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "aotkit.cache.recompiles"]


def _check(eager: nn.Module, mod: nn.Module, compiled: nn.Module) -> None:
    """Outputs and parameter gradients of eager and aotkit on the same input."""
    x = torch.randn(4, 3)
    out_e, out_c = eager(x), compiled(x)
    torch.testing.assert_close(out_c, out_e)
    out_e.sum().backward()
    out_c.sum().backward()
    for (name, p_e), (_, p_c) in zip(eager.named_parameters(), mod.named_parameters(), strict=True):
        torch.testing.assert_close(p_c.grad, p_e.grad, msg=name)
        p_e.grad = p_c.grad = None


def _set(mods: tuple[nn.Module, nn.Module], path: str, value: object) -> None:
    for m in mods:
        owner, _, leaf = path.rpartition(".")
        setattr(m.get_submodule(owner), leaf, value)


def test_changed_attributes_recompile_and_match_eager(
    recompiles: pytest.LogCaptureFixture,
) -> None:
    torch.manual_seed(0)
    eager = Scaled()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    cache = compiled._compiled._aotkit_cache  # type: ignore[union-attr]
    _check(eager, mod, compiled)
    assert len(cache.entries) == 1
    steps = [
        ("scale", 3.0, "self.scale changed from 2.0 to 3.0"),
        ("use_relu", False, "self.use_relu changed from True to False"),
        ("inner.offset", -1.25, "self.inner.offset changed from 0.5 to -1.25"),
        ("scale", 3, "self.scale changed from 3.0 to 3"),  # same value, another type
    ]
    for n, (path, value, words) in enumerate(steps, start=2):
        _set((eager, mod), path, value)
        _check(eager, mod, compiled)
        assert len(cache.entries) == n, path
        assert words in _reasons(recompiles)[-1]
    _check(eager, mod, compiled)  # nothing changed: no compilation
    assert len(cache.entries) == len(steps) + 1
    # back to values seen before: the old graph is found, not compiled again
    _set((eager, mod), "scale", 2.0)
    _set((eager, mod), "use_relu", True)
    _set((eager, mod), "inner.offset", 0.5)
    _check(eager, mod, compiled)
    assert len(cache.entries) == len(steps) + 1


def test_attribute_changed_to_a_non_plain_value_recompiles() -> None:
    np = pytest.importorskip("numpy")
    torch.manual_seed(0)
    eager = Scaled()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    cache = compiled._compiled._aotkit_cache  # type: ignore[union-attr]
    _check(eager, mod, compiled)
    _set((eager, mod), "scale", np.float64(4.0))
    _check(eager, mod, compiled)
    _set((eager, mod), "scale", np.float64(5.0))  # another object: compiled again
    _check(eager, mod, compiled)
    assert len(cache.entries) == 3
    # a tensor attribute is a captured tensor: a clear error, never the stale graph
    _set((eager, mod), "scale", torch.tensor(6.0))
    with pytest.raises(CapturedTensorError, match="not one of its inputs"):
        compiled(torch.randn(4, 3))


def test_builtin_layer_attributes_are_checked() -> None:
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(3, 3), nn.LeakyReLU(0.1), nn.LayerNorm(3))
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    _check(eager, mod, compiled)
    _set((eager, mod), "1.negative_slope", 0.7)
    _set((eager, mod), "2.eps", 0.5)
    _check(eager, mod, compiled)


def test_torch_aot_module_runs_the_stale_graph() -> None:
    """The bug this guards against, pinned in torch (if torch fixes it, drop this)."""
    torch.manual_seed(0)
    mod = Scaled()
    compiled = torch_aot.aot_module(mod, torch_nop)
    x = torch.randn(4, 3)
    first = compiled(x)
    mod.scale = 3.0
    torch.testing.assert_close(compiled(x), first)
    assert not torch.allclose(mod(x), first)


def test_unread_attribute_change_never_gives_a_wrong_result() -> None:
    """``unused`` is never read; changing it recompiles (reads are not recorded, see the
    Note), and the result stays eager's."""
    torch.manual_seed(0)
    eager = Scaled()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    _check(eager, mod, compiled)
    _set((eager, mod), "unused", "still never read")
    _check(eager, mod, compiled)

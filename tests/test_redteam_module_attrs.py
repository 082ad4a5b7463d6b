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
    # a tensor attribute is an input of the graph, read on each call (See Note [Tensor
    # attributes of aot_module's modules]); before, a clear CapturedTensorError
    _set((eager, mod), "scale", torch.tensor(6.0))
    _check(eager, mod, compiled)
    _set((eager, mod), "scale", torch.tensor(7.0))  # another tensor: read, not recompiled
    _check(eager, mod, compiled)
    assert len(cache.entries) == 4


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
    """``unused`` is never read; changing it does not recompile (reads are recorded, See
    Note [Recording module attribute reads]), and the result stays eager's."""
    torch.manual_seed(0)
    eager = Scaled()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    cache = compiled._compiled._aotkit_cache  # type: ignore[union-attr]
    _check(eager, mod, compiled)
    _set((eager, mod), "unused", "still never read")
    _check(eager, mod, compiled)
    assert len(cache.entries) == 1


# ---- only the attributes a trace read are keyed -----------------------------------------


class Counted(nn.Module):
    """A training-loop counter (``step``) the forward never reads, next to read ones."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()
        self.scale = 2.0
        self.step = 0
        self.tag = (1, "a")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * self.scale


def _cache(compiled: nn.Module) -> object:
    return compiled._compiled._aotkit_cache  # type: ignore[union-attr]


def test_an_unread_counter_bumped_each_call_compiles_once(
    recompiles: pytest.LogCaptureFixture,
) -> None:
    torch.manual_seed(0)
    eager = Counted()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    for step in range(6):
        _set((eager, mod), "step", step + 1)
        _set((eager, mod), "tag", (step, "b"))
        _check(eager, mod, compiled)
    assert len(_cache(compiled).entries) == 1  # type: ignore[attr-defined]
    assert _reasons(recompiles) == []
    assert _cache(compiled).attr_names == ["scale", "inner.offset"]  # type: ignore[attr-defined]
    # a read one still recompiles, with the log naming it, and gives eager's values
    _set((eager, mod), "inner.offset", 4.0)
    _check(eager, mod, compiled)
    assert len(_cache(compiled).entries) == 2  # type: ignore[attr-defined]
    assert "self.inner.offset changed from 0.5 to 4.0" in _reasons(recompiles)[-1]


def test_an_unread_attribute_holding_a_new_object_each_call_is_not_keyed() -> None:
    torch.manual_seed(0)
    eager = Counted()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    attrs = _cache(compiled).module_attrs  # type: ignore[attr-defined]
    for _ in range(4):
        _set((eager, mod), "step", object())  # was an int: a slot, never read
        _check(eager, mod, compiled)
    assert len(_cache(compiled).entries) == 1  # type: ignore[attr-defined]
    assert not hasattr(attrs, "_pinned")  # nothing kept alive per call


def test_an_attribute_read_only_in_a_forward_hook(recompiles: pytest.LogCaptureFixture) -> None:
    def hooked() -> nn.Module:
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
        m[1].gain = 1.5  # type: ignore[assignment]
        m[1].register_forward_hook(lambda mod, args, out: out * mod.gain)
        m[0].register_forward_pre_hook(lambda mod, args: (args[0] + mod.shift,))
        m[0].shift = 0.25  # type: ignore[assignment]
        return m

    eager, mod = hooked(), hooked()
    compiled = aot_module(mod, nop)
    _check(eager, mod, compiled)
    assert sorted(_cache(compiled).attr_names) == ["0.shift", "1.gain"]  # type: ignore[attr-defined]
    _set((eager, mod), "1.gain", -2.0)
    _check(eager, mod, compiled)
    assert "self.1.gain changed from 1.5 to -2.0" in _reasons(recompiles)[-1]
    _set((eager, mod), "0.shift", 1.0)
    _check(eager, mod, compiled)
    assert len(_cache(compiled).entries) == 3  # type: ignore[attr-defined]


class WithProperty(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self._temperature = 2.0

    @property
    def temperature(self) -> float:
        return self._temperature

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) / self.temperature


def test_an_attribute_read_through_a_property() -> None:
    torch.manual_seed(0)
    eager = WithProperty()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    _check(eager, mod, compiled)
    _set((eager, mod), "_temperature", 0.5)
    _check(eager, mod, compiled)
    assert len(_cache(compiled).entries) == 2  # type: ignore[attr-defined]


class Branchy(nn.Module):
    """Which attribute is read depends on a flag."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.use_a = True
        self.a = 2.0
        self.b = -3.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * (self.a if self.use_a else self.b)


def test_a_branch_flag_selects_the_attributes_read() -> None:
    torch.manual_seed(0)
    eager = Branchy()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    _check(eager, mod, compiled)
    _set((eager, mod), "b", 7.0)  # not read yet: no compilation
    _check(eager, mod, compiled)
    assert len(_cache(compiled).entries) == 1  # type: ignore[attr-defined]
    _set((eager, mod), "use_a", False)  # now b is read
    _check(eager, mod, compiled)
    _set((eager, mod), "b", 1.0)
    _check(eager, mod, compiled)
    assert len(_cache(compiled).entries) == 3  # type: ignore[attr-defined]
    # back to the first graph's values: found again. b is watched for every entry now (the
    # union of the reads), and the first entry was compiled with b = -3.0
    _set((eager, mod), "use_a", True)
    _set((eager, mod), "b", -3.0)
    _check(eager, mod, compiled)
    _set((eager, mod), "use_a", False)  # and the third's
    _set((eager, mod), "b", 1.0)
    _check(eager, mod, compiled)
    assert len(_cache(compiled).entries) == 3  # type: ignore[attr-defined]
    for a in (5.0, 6.0):  # a is read by the first graph only, but watched: never wrong
        _set((eager, mod), "a", a)
        _check(eager, mod, compiled)


def test_a_read_attribute_holding_an_object_raises() -> None:
    from aotkit_capture import UnsupportedInputError

    class Cfg:
        def __init__(self, s: float) -> None:
            self.s = s

    torch.manual_seed(0)
    eager = Scaled()
    mod = copy.deepcopy(eager)
    compiled = aot_module(mod, nop)
    _check(eager, mod, compiled)
    mod.scale = Cfg(3.0)  # type: ignore[assignment]
    mod.forward = lambda x: mod.inner(x) * mod.scale.s  # type: ignore[method-assign]
    with pytest.raises(UnsupportedInputError, match=r"read self\.scale, which holds a Cfg"):
        compiled(torch.randn(4, 3))
    assert "__getattribute__" not in nn.Module.__dict__  # the recorder is gone


def test_the_recorder_is_off_outside_compilations() -> None:
    torch.manual_seed(0)
    compiled = aot_module(Scaled(), nop)
    compiled(torch.randn(4, 3))
    assert "__getattribute__" not in nn.Module.__dict__
    assert nn.Module.__getattribute__ is object.__getattribute__


def test_the_disk_cache_never_restores_a_graph_traced_with_other_values(
    tmp_path: object,
) -> None:
    """A second aot_module of the same program with another ``scale`` (as a second
    process would) misses the disk cache; one with the same values hits it."""
    from aotkit_cache import cache_counters
    from aotkit_schemas import disk_cache_config

    disk_cache_config.dir, disk_cache_config.enabled = str(tmp_path), True
    try:
        for scale, hit in ((2.0, False), (3.0, False), (3.0, True)):
            torch.manual_seed(0)
            eager = Scaled()
            eager.scale = scale
            mod = copy.deepcopy(eager)
            before = cache_counters["hit"]
            _check(eager, mod, aot_module(mod, nop))
            assert (cache_counters["hit"] > before) is hit, scale
    finally:
        disk_cache_config.dir, disk_cache_config.enabled = None, None


class CondOnAttribute(nn.Module):
    """``torch.cond`` runs dynamo on its branches inside aot_module's trace, and the
    branch reads ``self.scale`` (an int: dynamo lifts a float closure
    as a SymFloat, which cond rejects). See Note [Recording module attribute reads]."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.scale = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def true_fn(x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * self.scale

        def false_fn(x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) - self.scale

        return torch.cond(x.sum() > 0, true_fn, false_fn, (x,))


def test_an_attribute_read_inside_a_cond_branch_is_checked() -> None:
    torch.manual_seed(0)
    eager = CondOnAttribute()
    compiled = aot_module(copy.deepcopy(eager), nop)
    x = torch.ones(2, 3)
    torch.testing.assert_close(compiled(x), eager(x), rtol=0, atol=0)
    for scale in (3, -1):
        eager.scale = scale
        compiled.orig_module.scale = scale
        torch.testing.assert_close(compiled(x), eager(x), rtol=0, atol=0)
    # the recorder is back off nn.Module after the compilation
    assert "__getattribute__" not in nn.Module.__dict__

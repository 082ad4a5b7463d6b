"""aotkit_inductor offers the backward's donated buffers to Inductor, which reuses them in
place as with torch's AOTAutograd; a backward that keeps its graph after that raises
torch's error, and a first backward that keeps its graph gets no donation. Compared with
eager and with torch's inductor. See Note [Donated buffers reused by the backward's
compiler] in aotkit_schemas and Note [Inductor reads donated buffers from the
TracingContext] in aotkit_backends."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch._dynamo
import torch.nn as nn
from aotkit_backends import inductor_available, inductor_unavailable_reason
from aotkit_frontends import register_dynamo_backends
from aotkit_schemas import (
    DONATED_BUFFER_KEEP_GRAPH_ERROR,
    DONATED_INPUTS_KEY,
    DonatedInputs,
    mark_uses_donated_inputs,
    uses_donated_inputs,
)

pytestmark = pytest.mark.skipif(not inductor_available(), reason=str(inductor_unavailable_reason()))

BACKENDS = ("aotkit_inductor", "inductor")


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from torch._inductor import config

    register_dynamo_backends()
    torch._dynamo.reset()
    monkeypatch.setenv("AOTKIT_CACHE", "0")
    with config.patch(fx_graph_cache=False, fx_graph_remote_cache=False):
        yield
    torch._dynamo.reset()


@pytest.fixture
def donated_seen(monkeypatch: pytest.MonkeyPatch) -> list[list[int] | None]:
    """What Inductor's graph lowering read as the donated buffers, per compiled graph."""
    import torch._inductor.graph as inductor_graph

    seen: list[list[int] | None] = []
    real = inductor_graph.get_donated_idxs

    def spy() -> list[int] | None:
        got = real()
        seen.append(None if got is None else list(got))
        return got

    monkeypatch.setattr(inductor_graph, "get_donated_idxs", spy)
    return seen


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 6 * 6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x)))
        return torch.relu(self.fc(h.flatten(1))).sum()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return Net()


def _x() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(2, 3, 8, 8)


def _steps(
    backend: str | None, backwards: list[dict[str, bool]]
) -> tuple[list[Any], nn.Module]:
    """One forward per entry of ``backwards``, then ``backward(**entry)`` (twice when it
    retains the graph); the losses and gradients, or the error's text."""
    m = _model()
    f: Callable[..., torch.Tensor] = m if backend is None else torch.compile(m, backend=backend)
    x = _x()
    got: list[Any] = []
    for kwargs in backwards:
        loss = f(x)
        try:
            loss.backward(**kwargs)
            if kwargs.get("retain_graph"):
                loss.backward()
        except RuntimeError as e:
            got.append(str(e))
            continue
        got.append((loss.detach(), [p.grad.clone() for p in m.parameters()]))  # type: ignore[union-attr]
        m.zero_grad(set_to_none=True)
    return got, m


def _assert_same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if isinstance(x, str) or isinstance(y, str):
            assert x == y
            continue
        torch.testing.assert_close(x[0], y[0])
        for gx, gy in zip(x[1], y[1], strict=True):
            torch.testing.assert_close(gx, gy)


def test_the_backward_reuses_donated_buffers_and_matches_eager_and_torch(
    donated_seen: list[list[int] | None],
) -> None:
    eager, m_eager = _steps(None, [{}, {}])
    results = {}
    for backend in BACKENDS:
        donated_seen.clear()
        results[backend], m = _steps(backend, [{}, {}])
        _assert_same(eager, results[backend])
        for b_eager, b in zip(m_eager.buffers(), m.buffers(), strict=True):
            torch.testing.assert_close(b_eager, b)
        # the backward (compiled last) was offered the donated saved tensors (torch's
        # forward reads them too, and ignores them)
        assert donated_seen and donated_seen[-1], (backend, donated_seen)
        results[backend + " offered"] = donated_seen[-1]
    # the partitions differ slightly (torch saves the last ReLU's mask as well), so the
    # lists are not compared


def test_keeping_the_graph_after_a_donating_backward_raises_torchs_error() -> None:
    plan = [{}, {"retain_graph": True}, {}]
    eager, _ = _steps(None, plan)
    assert all(not isinstance(r, str) for r in eager)
    got = {backend: _steps(backend, plan)[0] for backend in BACKENDS}
    assert got["aotkit_inductor"][1] == DONATED_BUFFER_KEEP_GRAPH_ERROR
    _assert_same(got["aotkit_inductor"], got["inductor"])
    # the refused backward left nothing half-done: the next step is right
    _assert_same([eager[2]], [got["aotkit_inductor"][2]])


def test_a_first_backward_keeping_its_graph_gets_no_donation(
    donated_seen: list[list[int] | None],
) -> None:
    plan = [{"retain_graph": True}, {"retain_graph": True}, {}]
    eager, _ = _steps(None, plan)
    got = _steps("aotkit_inductor", plan)[0]
    # backward twice through the same saved tensors: right only if none was overwritten
    _assert_same(eager, got)
    assert not any(donated_seen), donated_seen


def test_aotkit_eager_keeps_retain_graph_after_a_first_plain_backward() -> None:
    plan = [{}, {"retain_graph": True}]
    eager, _ = _steps(None, plan)
    _assert_same(eager, _steps("aotkit_eager", plan)[0])


def test_donated_inputs_offered_unless_withheld() -> None:
    assert DonatedInputs((1, 2)).offered == (1, 2)
    assert DonatedInputs((1, 2), withheld=True).offered == ()

    def compiled(args: list[Any]) -> None:
        return None

    assert not uses_donated_inputs(compiled)
    mark_uses_donated_inputs(compiled)
    assert uses_donated_inputs(compiled)
    assert isinstance(DONATED_INPUTS_KEY, str)


def test_a_withheld_graph_is_compiled_without_inductors_caches() -> None:
    from aotkit_backends._inductor_donation import inductor_donation
    from torch._inductor import config

    gm = torch.fx.symbolic_trace(copy.deepcopy(nn.ReLU()))
    gm.meta[DONATED_INPUTS_KEY] = DonatedInputs((0,), withheld=True)
    with config.patch(fx_graph_cache=True), inductor_donation(gm) as donation:
        assert donation.withheld and not donation.used
        assert not config.fx_graph_cache
    # no TracingContext: nothing offered
    gm.meta[DONATED_INPUTS_KEY] = DonatedInputs((0,))
    with inductor_donation(gm) as donation:
        assert not donation.used

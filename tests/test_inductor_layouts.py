"""aotkit_inductor with Inductor's layout optimization: channels-last saved activations, the
backward compiled for them, user-visible strides kept; and the static-lifetime input
indices every partitioner is handed, compared with torch's. See Note [Layout optimization
in aotkit_inductor] in aotkit_frontends and Note [Saved tensors keep the compiled forward's
strides] in aotkit_capture."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch._dynamo
import torch.nn as nn
from aotkit_backends import inductor_available, inductor_unavailable_reason, nop
from aotkit_frontends import aot_autograd, register_dynamo_backends
from aotkit_partitioners import min_cut_rematerialization_partition

needs_inductor = pytest.mark.skipif(
    not inductor_available(), reason=str(inductor_unavailable_reason())
)


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    register_dynamo_backends()
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def _no_caches(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Inductor's FX graph cache could serve a graph compiled before, and aotkit's disk cache
    # a restored forward (compiled keeping layouts): each test compiles afresh
    from torch._inductor import config

    monkeypatch.setenv("AOTKIT_CACHE", "0")
    with config.patch(fx_graph_cache=False, fx_graph_remote_cache=False):
        yield


class ConvNet(nn.Module):
    """Convolutions (Inductor lays their activations out channels-last), BatchNorm, a
    feature map returned to the caller (its strides are observed) and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.ReLU(),
        )
        self.tail = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.SiLU())
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feats = self.body(x)
        y = self.tail(feats)
        return feats, self.head(y.mean((2, 3)))


def _train(
    model: nn.Module, backend: str | None, xs: list[torch.Tensor]
) -> tuple[list[tuple[torch.Tensor, ...]], list[dict[str, torch.Tensor]], int]:
    """Outputs and gradients of each step, and how many 4-d channels-last tensors (not
    contiguous) the last compiled step saved for the backward."""
    fn: Callable[..., Any] = model if backend is None else torch.compile(model, backend=backend)
    outs: list[tuple[torch.Tensor, ...]] = []
    grads: list[dict[str, torch.Tensor]] = []
    channels_last = 0
    seen: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen.append(t)
        return t

    for x in xs:
        seen.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = fn(x)
        channels_last = sum(
            1
            for t in seen
            if t.dim() == 4 and t.size(1) > 1 and not t.is_contiguous()
            and t.is_contiguous(memory_format=torch.channels_last)
        )
        feats, logits = out
        (feats.square().mean() + logits.square().sum()).backward()
        outs.append((feats.detach().clone(), logits.detach().clone()))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        model.zero_grad()
    return outs, grads, channels_last


@pytest.mark.slow
@needs_inductor
@pytest.mark.usefixtures("_no_caches")
@pytest.mark.parametrize("input_format", ["contiguous", "channels_last"])
def test_channels_last_training_matches_eager(input_format: str) -> None:
    torch.manual_seed(0)
    reference = ConvNet()
    xs = [torch.randn(4, 3, 16, 16) for _ in range(2)]
    if input_format == "channels_last":
        xs = [x.contiguous(memory_format=torch.channels_last) for x in xs]
    results = {}
    for backend in (None, "inductor", "aotkit_inductor"):
        model = ConvNet()
        model.load_state_dict(reference.state_dict())
        results[backend] = (*_train(model, backend, xs), model)
    eager_outs, eager_grads, _, eager_model = results[None]
    torch_outs, torch_grads, torch_cl, _ = results["inductor"]
    ours_outs, ours_grads, ours_cl, ours_model = results["aotkit_inductor"]

    # Inductor's layout optimization is on: the saved activations are channels-last, as
    # with torch's inductor backend (the backward was compiled for them)
    assert torch_cl > 0
    assert ours_cl == torch_cl
    for step, (ours, ref, theirs) in enumerate(zip(ours_outs, eager_outs, torch_outs, strict=True)):
        for o, r, t in zip(ours, ref, theirs, strict=True):
            torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-5, msg=f"step {step}")
            # the user sees eager's strides (the feature map: Inductor pins them)
            assert o.stride() == r.stride() == t.stride(), step
    for step, (ours_g, ref_g) in enumerate(zip(ours_grads, eager_grads, strict=True)):
        assert ours_g.keys() == ref_g.keys()
        for name in ref_g:
            torch.testing.assert_close(
                ours_g[name], ref_g[name], rtol=1e-4, atol=1e-5, msg=f"{name} step {step}"
            )
            assert ours_g[name].stride() == ref_g[name].stride(), name
    for (name, b), c in zip(ours_model.named_buffers(), eager_model.buffers(), strict=True):
        torch.testing.assert_close(b, c, msg=name)  # BatchNorm running stats
    # as close to eager as torch's inductor is, or closer
    for ours, ref, theirs in zip(ours_grads, eager_grads, torch_grads, strict=True):
        for name in ref:
            ours_err = (ours[name] - ref[name]).abs().max().item()
            torch_err = (theirs[name] - ref[name]).abs().max().item()
            assert ours_err <= max(2 * torch_err, 1e-6), name


@pytest.mark.slow
@needs_inductor
@pytest.mark.usefixtures("_no_caches")
def test_channels_last_tangent_for_a_user_visible_feature_map() -> None:
    """The feature map's gradient arrives channels-last (the caller's loss made it so); the
    backward, compiled for the traced layout, gets it coerced."""
    torch.manual_seed(0)
    reference = ConvNet()
    x = torch.randn(2, 3, 8, 8)
    feats_grads = [
        torch.randn(2, 32, 4, 4).contiguous(memory_format=torch.channels_last) for _ in range(2)
    ]
    grads = []
    for backend in (None, "aotkit_inductor"):
        model = ConvNet()
        model.load_state_dict(reference.state_dict())
        fn: Callable[..., Any] = model if backend is None else torch.compile(model, backend=backend)
        for g in feats_grads:
            model.zero_grad()
            feats, logits = fn(x)
            torch.autograd.backward([feats, logits], [g, torch.ones_like(logits)])
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-5, msg=name)


def _recording_partitioner(calls: list[list[int] | None]) -> Callable[..., Any]:
    def partition(joint: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        indices = kwargs.get("static_lifetime_input_indices")
        calls.append(None if indices is None else list(indices))
        return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)

    return partition


class _WithBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.bn = nn.BatchNorm1d(6)
        self.register_buffer("scale", torch.full((6,), 0.5))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(x)) * self.scale + y


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: (nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)),
                              (torch.randn(3, 4),)), id="mlp"),
        pytest.param(lambda: (_WithBuffer(), (torch.randn(5, 6), torch.randn(5, 6, requires_grad=True))),
                     id="buffers_and_a_grad_input"),
    ],
)
def test_partitioner_gets_torchs_static_lifetime_input_indices(
    make: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]],
) -> None:
    from torch._dynamo.backends.common import aot_autograd as torch_aot_autograd

    torch.manual_seed(0)
    model, args = make()
    seen: dict[str, list[list[int] | None]] = {"torch": [], "aotkit": []}
    backends = {
        "torch": torch_aot_autograd(
            fw_compiler=nop, bw_compiler=nop, partition_fn=_recording_partitioner(seen["torch"])
        ),
        "aotkit": aot_autograd(
            fw_compiler=nop, bw_compiler=nop, partition_fn=_recording_partitioner(seen["aotkit"])
        ),
    }
    results = {}
    for name, backend in backends.items():
        torch._dynamo.reset()
        out = torch.compile(model, backend=backend)(*args)
        out.sum().backward()
        results[name] = out.detach()
    torch.testing.assert_close(results["aotkit"], results["torch"])
    assert seen["torch"], "torch's partitioner was not called"
    assert seen["aotkit"] == seen["torch"]
    assert seen["aotkit"][0], "the parameters are static-lifetime inputs"


def test_partitioner_without_the_keyword_still_works() -> None:
    """A partitioner that takes no ``static_lifetime_input_indices`` is called without it."""
    calls = []

    def partition(
        joint: torch.fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int
    ) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
        calls.append(num_fwd_outputs)
        return min_cut_rematerialization_partition(
            joint, joint_inputs, num_fwd_outputs=num_fwd_outputs
        )

    model = nn.Linear(4, 2)
    x = torch.randn(3, 4)
    out = torch.compile(model, backend=aot_autograd(fw_compiler=nop, partition_fn=partition))(x)
    out.sum().backward()
    assert calls == [1]
    torch.testing.assert_close(out, model(x))


class _SavesAUserInput(nn.Module):
    """Parameters, a buffer, and a plain user input saved for the backward."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.register_buffer("scale", torch.full((6,), 0.5))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (self.lin(x) * self.scale).sin() * y


@needs_inductor
@pytest.mark.usefixtures("_no_caches")
def test_static_input_idxs_match_torchs_inductor(monkeypatch: pytest.MonkeyPatch) -> None:
    """See Note [Static inputs of aotkit_inductor's graphs]: Inductor is told the same static
    inputs of the forward (parameters, buffers) and of the backward (saved values, not the
    saved user input) as under torch's ``inductor`` backend."""
    import torch._inductor.compile_fx as compile_fx

    seen: list[tuple[str, list[int]]] = []
    inner = compile_fx._compile_fx_inner

    def recording(gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        role = "backward" if kwargs.get("is_backward") else "forward"
        seen.append((role, list(kwargs.get("static_input_idxs") or ())))
        return inner(gm, example_inputs, **kwargs)

    monkeypatch.setattr(compile_fx, "_compile_fx_inner", recording)
    torch.manual_seed(0)
    model = _SavesAUserInput()
    x, y = torch.randn(3, 6), torch.randn(3, 6, requires_grad=True)
    runs: dict[str, Any] = {}
    for backend in ("inductor", "aotkit_inductor"):
        torch._dynamo.reset()
        seen.clear()
        out = torch.compile(model, backend=backend)(x, y)
        out.sum().backward()
        runs[backend] = (out.detach(), y.grad.clone(), list(seen))  # type: ignore[union-attr]
        y.grad = None
        model.zero_grad(set_to_none=True)
    torch.testing.assert_close(runs["aotkit_inductor"][0], runs["inductor"][0])
    torch.testing.assert_close(runs["aotkit_inductor"][1], runs["inductor"][1])
    assert [r for r, _ in runs["inductor"][2]] == ["forward", "backward"]
    assert runs["aotkit_inductor"][2] == runs["inductor"][2]
    assert runs["inductor"][2][0][1], "the parameters and buffer are static"
    # the saved user input is not static in the backward: the static saved values are not
    # all the leading inputs
    bw_static = runs["inductor"][2][1][1]
    assert bw_static != list(range(len(bw_static))), bw_static

"""Tangent layouts (Note [Tangent strides follow the outputs] in aotkit_analysis): the
backward is traced for tangents laid out like their outputs, and runtime tangents are
restrided to that layout. Differential: the strides the compiled backward sees are
torch's AOTAutograd's, and outputs and gradients are eager's. Also jagged NestedTensor
inputs and tangents (Note [Nested ints in outer sizes] in aotkit_runtime).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from aotkit import aot_function, nop
from aotkit_capture import record_compilations
from torch.testing._internal.two_tensor import TwoTensor

SEEN: list[tuple[int, ...]] = []


@torch.library.custom_op("aotkit_tangent_layout::seen", mutates_args=())
def _seen(x: torch.Tensor) -> torch.Tensor:
    """Records the strides of the gradient the backward passes through it (at run time:
    a custom op is opaque to the graphs)."""
    SEEN.append(tuple(x.stride()))
    return x.clone()


@_seen.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("aotkit_tangent_layout::probe", mutates_args=())
def _probe(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@_probe.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


_probe.register_autograd(lambda ctx, g: torch.ops.aotkit_tangent_layout.seen(g))


def probe(x: torch.Tensor) -> torch.Tensor:
    """Identity whose backward records its incoming gradient's strides."""
    out: torch.Tensor = torch.ops.aotkit_tangent_layout.probe(x)
    return out


TANGENTS: list[tuple[int, ...]] = []


def recording_bw(gm: torch.fx.GraphModule, example: Any) -> Any:
    """A backward compiler that records, at run time, the strides of the tangent
    arguments (placeholders ``tangents_*``) the compiled backward receives."""
    from functorch.compile import make_boxed_func

    names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    tangent_positions = [i for i, n in enumerate(names) if n.startswith("tangents")]

    def run(*args: Any) -> Any:
        TANGENTS.extend(tuple(args[i].stride()) for i in tangent_positions)
        return gm(*args)

    return make_boxed_func(run)


def _boxed(gm: torch.fx.GraphModule, example: Any) -> Any:
    from functorch.compile import make_boxed_func

    return make_boxed_func(gm.forward)


def _torch_aot_function(fn: Callable[..., Any], bw: Any = _boxed) -> Callable[..., Any]:
    from functorch.compile import aot_function as torch_aot_function

    return torch_aot_function(fn, fw_compiler=_boxed, bw_compiler=bw)  # type: ignore[no-any-return]


def conv_channels_last(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.conv2d(x, w)


def conv_with_view_output(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    # the view of an intermediate sends the program down the two-pass flow
    r = torch.nn.functional.conv2d(x, w)
    return r, r.transpose(0, 1)


def transposed(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.sum((2, 3)) @ w.sum((2, 3))).t().contiguous().t()


def unused_transposed_output(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    # the second output gets no gradient: its zero tangent is made in its traced layout
    a = (x.sum((2, 3)) @ w.sum((2, 3))).t().contiguous().t()
    b = x.sin().transpose(2, 3).contiguous().transpose(2, 3)
    return a, b


PROGRAMS: dict[str, tuple[Callable[..., Any], str]] = {
    "conv_channels_last": (conv_channels_last, "single pass"),
    "conv_with_view_output": (conv_with_view_output, "python"),
    "transposed": (transposed, "single pass"),
    "unused_transposed_output": (unused_transposed_output, "single pass"),
}


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 5).to(memory_format=torch.channels_last).requires_grad_(True)
    w = torch.randn(3, 3, 3, 3).to(memory_format=torch.channels_last).requires_grad_(True)
    return x, w


def _run(fn: Callable[..., Any]) -> tuple[list[torch.Tensor], list[tuple[int, ...]]]:
    """Call ``fn`` twice (the second call runs the cached entry), backward through the
    first output only (``sum()``: an expanded, stride-0 gradient); outputs, gradients and
    the tangent strides the compiled backward received."""
    results: list[torch.Tensor] = []
    TANGENTS.clear()
    for _ in range(2):
        x, w = _inputs()
        out = fn(x, w)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        outs[0].sum().backward()
        assert x.grad is not None and w.grad is not None
        results += [*(o.detach() for o in outs), x.grad, w.grad]
    return results, list(TANGENTS)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_tangents_follow_output_strides(name: str) -> None:
    fn, path = PROGRAMS[name]
    eager, _ = _run(fn)
    with record_compilations() as compiled:
        ours, our_strides = _run(aot_function(fn, nop, bw_compiler=recording_bw))
    assert [c.path for c in compiled] == [path]
    theirs, their_strides = _run(_torch_aot_function(fn, recording_bw))
    assert our_strides == their_strides
    assert our_strides
    for a, e, t in zip(ours, eager, theirs, strict=True):
        torch.testing.assert_close(a, e)
        torch.testing.assert_close(a, t)
        assert a.stride() == t.stride()


def test_channels_last_tangent_is_not_made_contiguous() -> None:
    _, strides = _run(aot_function(conv_channels_last, nop, bw_compiler=recording_bw))
    x, w = _inputs()
    expected = torch.nn.functional.conv2d(x, w).stride()
    assert expected != torch.empty(2, 3, 3, 3).stride()
    assert strides == [expected, expected]


def test_subclass_tangent_inner_layouts() -> None:
    """A TwoTensor output whose inner tensors are channels_last: the backward sees
    channels_last inner tangents, as torch's."""

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = probe(torch.nn.functional.conv2d(x, w))
        return out

    def run(f: Callable[..., Any]) -> tuple[list[torch.Tensor], list[tuple[int, ...]]]:
        SEEN.clear()
        x, w = _inputs()
        tx = TwoTensor(x.detach().clone(), x.detach().clone() * 2).requires_grad_(True)
        out = f(tx, w)
        out.sum().backward()
        assert tx.grad is not None and w.grad is not None
        g = tx.grad
        return [out.a.detach(), out.b.detach(), g.a, g.b, w.grad], list(SEEN)  # type: ignore[attr-defined]

    eager, _ = run(fn)
    ours, our_strides = run(aot_function(fn, nop))
    theirs, their_strides = run(_torch_aot_function(fn))
    assert our_strides == their_strides
    assert len(our_strides) == 2 and all(s == (27, 1, 9, 3) for s in our_strides)
    for a, e, t in zip(ours, eager, theirs, strict=True):
        torch.testing.assert_close(a, e)
        torch.testing.assert_close(a, t)


def test_guess_by_memory_format_when_configured_off() -> None:
    """``guess_tangent_strides_as_outputs=False``: tangents are guessed by memory format
    (a transposed output's tangent is contiguous), as torch's."""
    with torch._functorch.config.patch(guess_tangent_strides_as_outputs=False):
        _, ours = _run(aot_function(transposed, nop, bw_compiler=recording_bw))
        _, theirs = _run(_torch_aot_function(transposed, recording_bw))
    assert ours == theirs
    assert ours[0] == (3, 1)


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("backend", ["aotkit_eager", "aot_eager"])
def test_jagged_nested_tensor_tangent(backend: str) -> None:
    """A jagged NestedTensor (nested int in its outer size) through torch.compile: the
    outputs' values and the gradients of the components are eager's."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sin()

    def run(f: Callable[..., Any]) -> list[torch.Tensor]:
        torch.manual_seed(0)
        parts = [torch.randn(n, 3, dtype=torch.float64, requires_grad=True) for n in (2, 3, 4)]
        nt = torch.nested.as_nested_tensor(parts, layout=torch.jagged)
        out = f(nt)
        grads = torch.autograd.grad(out.values().sum(), parts)
        return [out.values().detach(), out.offsets(), *grads]

    eager = run(fn)
    compiled = run(torch.compile(fn, backend=backend, fullgraph=True))
    for a, e in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, e)

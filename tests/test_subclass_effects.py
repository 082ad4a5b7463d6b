"""Effectful ops in tensor-subclass programs (Note [Effect tokens], Note [Tensor subclasses
are desugared] in aotkit_schemas): differential tests against eager and torch 2.15's
AOTAutograd, which supports them.

torch threads the tokens through the desugared graphs as it does for plain programs: the
forward takes the token first (``primals_1``) and returns the chain's end first; an
effectful op that a subclass's ``__torch_dispatch__`` runs once per inner tensor is one
``with_effects`` per inner tensor on the same chain; an effectful op in the backward
starts the backward's own chain from ``tangents_token``. aotkit's graphs must be torch's,
text for text, and take plain tensors only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aotkit
import functorch.compile as torch_compile
import pytest
import torch
from _effect_ops import LOG, log
from aotkit_backends import inductor_available
from test_subclass_layer import Graphs, _recording, assert_plain_graphs, assert_same
from torch.testing._internal.two_tensor import TwoTensor


class LoggedBackwardOnly(torch.autograd.Function):
    """``x * 2`` whose backward (only) calls the effectful op."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return log(g, "bw") * 2


def _two(requires_grad: bool = True) -> torch.Tensor:
    t = TwoTensor(torch.randn(3), torch.randn(3))
    return t.requires_grad_(requires_grad)  # type: ignore[no-any-return]


def _print_then_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    torch.ops.aten._print("hello")  # no tensor argument: one with_effects
    return (x * y).sin()


# name: (function, inputs, training)
CASES: dict[str, tuple[Callable[..., Any], Callable[[], list[Any]], bool]] = {
    # the effectful op on a TwoTensor: TwoTensor's dispatch runs it on both inner tensors
    "forward_effect_on_a_subclass": (
        lambda t, y: log((t * y).sin(), "s"),
        lambda: [_two(), torch.randn(3, requires_grad=True)],
        True,
    ),
    "print_in_training": (
        _print_then_mul,
        lambda: [_two(), torch.randn(3, requires_grad=True)],
        True,
    ),
    "print_in_inference": (_print_then_mul, lambda: [_two(False), torch.randn(3)], False),
    "effect_in_the_backward_only": (
        lambda t: LoggedBackwardOnly.apply(t).sin(),
        lambda: [_two()],
        True,
    ),
    "effects_in_forward_and_backward": (
        lambda t: LoggedBackwardOnly.apply(log(t.cos(), "fw")) * 3,
        lambda: [_two()],
        True,
    ),
    # a subclass the function creates from a plain input, then logged
    "effect_on_a_created_subclass": (
        lambda x: log(TwoTensor(x * 2, x + 1), "c").sin(),
        lambda: [torch.randn(3, requires_grad=True)],
        True,
    ),
}


def _run(fn: Callable[..., Any], args: list[Any], training: bool) -> tuple[Any, list[Any], list[str]]:
    """Output, input gradients, and the effect log (forward, "|", backward)."""
    LOG.clear()
    out = fn(*args)
    fw_log = [*LOG, "|"]
    LOG.clear()
    grads: list[Any] = []
    if training:
        out.sum().backward()
        grads = [a.grad for a in args]
    return out.detach(), grads, [*fw_log, *LOG]


def _codes(graphs: Graphs) -> list[str]:
    return [gm.code.strip() for gm in graphs]


@pytest.mark.parametrize("name", list(CASES))
def test_effects_in_subclass_programs_as_torch(name: str) -> None:
    fn, make, training = CASES[name]
    results = []
    graphs: Graphs = []
    examples: list[list[Any]] = []
    torch_graphs: Graphs = []
    rec = _recording(graphs, examples, aotkit.nop)
    trec = _recording(torch_graphs, [], torch_compile.nop)
    for f in (fn, aotkit.aot_function(fn, rec, rec), torch_compile.aot_function(fn, trec, trec)):
        for _ in range(2):  # each call runs each effect once, in order
            torch.manual_seed(0)
            results.append(_run(f, make(), training))
    eager, got, oracle = results[0], results[2], results[4]
    assert_same(results[3], got)
    assert_same(got, eager)
    assert_same(got, oracle)
    assert_plain_graphs(graphs, examples)
    # torch's graphs, text for text: tokens first, one with_effects per inner tensor
    assert _codes(graphs) == _codes(torch_graphs)
    assert any("with_effects" in code for code in _codes(graphs))


def test_backward_token_placeholder_as_torch() -> None:
    fn, make, _ = CASES["effects_in_forward_and_backward"]
    graphs: Graphs = []
    rec = _recording(graphs, [], aotkit.nop)
    f = aotkit.aot_function(fn, rec, rec)
    f(*make()).sum().backward()
    fw, bw = graphs
    fw_inputs = [n.name for n in fw.graph.find_nodes(op="placeholder")]
    bw_inputs = [n.name for n in bw.graph.find_nodes(op="placeholder")]
    assert fw_inputs == ["primals_1", "primals_2", "primals_3"]  # token, x.a, x.b
    assert bw_inputs[-1] == "tangents_token"
    (artifacts,) = f._aotkit_cache.artifacts  # type: ignore[attr-defined]
    assert artifacts.meta.requires_subclass_dispatch
    assert len(artifacts.meta.tokens) == 1
    assert artifacts.meta.num_backward_tokens == 1


@pytest.mark.parametrize(
    ("name", "backends"),
    [
        ("forward_effect_on_a_subclass", ("aotkit_eager", "aot_eager")),
        ("effects_in_forward_and_backward", ("aotkit_eager", "aot_eager")),
        # Inductor gets the tokens unlifted (See Note [Unlifted tokens for Inductor])
        pytest.param(
            "effects_in_forward_and_backward",
            ("aotkit_inductor", "inductor"),
            marks=pytest.mark.skipif(not inductor_available(), reason="no Inductor"),
        ),
    ],
)
def test_effects_in_subclass_programs_through_torch_compile(
    name: str, backends: tuple[str, str]
) -> None:
    fn, make, training = CASES[name]
    aotkit.register_dynamo_backends()
    results = []
    for backend in (None, *backends):
        torch._dynamo.reset()
        f = fn if backend is None else torch.compile(fn, backend=backend, fullgraph=True)
        torch.manual_seed(0)
        results.append(_run(f, make(), training))
    assert_same(results[1], results[0])
    assert_same(results[1], results[2])

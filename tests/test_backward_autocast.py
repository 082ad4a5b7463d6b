"""Autocast and the compiled backward: functorch's ``backward_pass_autocast`` setting, graphs
traced under autocast run without it, and a failed trace attempt leaves autocast as it was.

See Note [Autocast in the backward trace], Note [Compiled graphs run without autocast] and
Note [A failed trace leaves autocast as it found it] in aotkit_tracing. Each case runs
eagerly (where eager has an answer), through aotkit and through torch's AOTAutograd, and
compares values, gradients and the backward graph's text with torch's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aotkit
import functorch.compile as torch_compile
import pytest
import torch
import torch._dynamo
import torch._functorch.config as fconfig
from aotkit_capture import AOTCompileError


@pytest.fixture
def foo_op() -> Iterator[Any]:
    """``mylib.foo``: clone, but ``x + 1`` under CPU autocast; and a Function whose forward
    and backward both call it."""
    with torch.library._scoped_library("mylib", "FRAGMENT") as lib:
        lib.define("foo(Tensor x) -> Tensor")
        lib.impl("foo", torch.clone, "CompositeExplicitAutograd")
        lib.impl("foo", lambda x: x + 1, "AutocastCPU")
        foo = torch.ops.mylib.foo.default

        class Foo(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
                ctx.save_for_backward(x)
                return foo(x)

            @staticmethod
            def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
                (x,) = ctx.saved_tensors
                return grad * foo(x)

        def fn(x: torch.Tensor) -> torch.Tensor:
            with torch.amp.autocast("cpu", enabled=False):
                return Foo.apply(x)  # type: ignore[no-any-return]

        yield fn
    torch._dynamo.reset()


def _run(api: Any, fn: Any, forward_autocast: bool, via_dynamo: bool) -> tuple[Any, ...]:
    bw_graphs: list[str] = []

    def fw(gm: torch.fx.GraphModule, _: Any) -> Any:
        return api.make_boxed_func(gm.forward)

    def bw(gm: torch.fx.GraphModule, _: Any) -> Any:
        bw_graphs.append(gm.code.strip())
        return api.make_boxed_func(gm.forward)

    x = torch.tensor(0.0, requires_grad=True)
    if via_dynamo:
        torch._dynamo.reset()
        backend = "aotkit_eager" if api is aotkit else "aot_eager"
        compiled = torch.compile(fn, backend=backend, fullgraph=True)
    else:
        compiled = api.aot_function(fn, fw, bw)
    if forward_autocast:
        with torch.amp.autocast("cpu"):
            out = compiled(x)
            still_on = torch.is_autocast_enabled("cpu")
        assert still_on  # See Note [A failed trace leaves autocast as it found it]
    else:
        out = compiled(x)
    (grad,) = torch.autograd.grad(out, x)
    return out.detach(), grad, bw_graphs


SETTINGS = [
    ("same_as_forward", True, 1.0),
    ("off", True, 0.0),
    ([{"device_type": "cpu"}], False, 1.0),
    ([{"device_type": "cpu"}], True, 1.0),
    ("same_as_forward", False, 0.0),
]


@pytest.mark.parametrize("via_dynamo", [False, True], ids=["aot_function", "torch.compile"])
@pytest.mark.parametrize(("setting", "forward_autocast", "expected_grad"), SETTINGS)
def test_backward_pass_autocast_matches_torch(
    foo_op: Any, setting: Any, forward_autocast: bool, expected_grad: float, via_dynamo: bool
) -> None:
    with fconfig.patch(backward_pass_autocast=setting):
        ours = _run(aotkit, foo_op, forward_autocast, via_dynamo)
        theirs = _run(torch_compile, foo_op, forward_autocast, via_dynamo)
    # the forward runs foo with autocast off (as eager does) whatever the ambient state
    assert ours[0].item() == theirs[0].item() == 0.0
    assert ours[1].item() == theirs[1].item() == expected_grad
    if not via_dynamo:
        assert ours[2] == theirs[2]


def test_forward_traced_under_autocast_runs_without_it(foo_op: Any) -> None:
    """The graph holds ``mylib.foo`` traced with autocast off; running it under the same
    autocast must not take foo's Autocast kernel (eager's value is 0)."""
    x = torch.tensor(0.0)
    with torch.amp.autocast("cpu"):
        eager = foo_op(x)
        ours = aotkit.aot_function(foo_op, aotkit.nop)(x)
        theirs = torch_compile.aot_function(foo_op, torch_compile.nop)(x)
    assert eager.item() == ours.item() == theirs.item() == 0.0


def test_setting_is_part_of_the_compile_key(foo_op: Any) -> None:
    fn = aotkit.aot_function(foo_op, aotkit.nop)
    x = torch.tensor(0.0, requires_grad=True)
    grads = []
    for setting in ("same_as_forward", "off", "same_as_forward"):
        with fconfig.patch(backward_pass_autocast=setting), torch.amp.autocast("cpu"):
            out = fn(x)
        grads.append(torch.autograd.grad(out, x)[0].item())
    assert grads == [1.0, 0.0, 1.0]


def test_invalid_setting_is_refused_with_the_accepted_values(foo_op: Any) -> None:
    x = torch.tensor(0.0, requires_grad=True)
    with fconfig.patch(backward_pass_autocast="sometimes"):
        with pytest.raises(AOTCompileError, match="same_as_forward.*'off'.*list of dicts"):
            aotkit.aot_function(foo_op, aotkit.nop)(x)

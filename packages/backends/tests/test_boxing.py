"""make_boxed_func / make_boxed_compiler behave like torch's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from aotkit_backends import is_boxed, make_boxed_compiler, make_boxed_func
from torch._functorch._aot_autograd.utils import make_boxed_func as torch_make_boxed_func
from torch.fx.experimental.proxy_tensor import make_fx


def add(x: int, y: int) -> int:
    """Adds."""
    return x + y


def test_boxed_func_takes_one_list() -> None:
    g = make_boxed_func(add)
    assert is_boxed(g)
    assert g([1, 2]) == 3


def test_boxed_func_does_not_clear_the_list() -> None:
    args = [1, 2]
    make_boxed_func(add)(args)
    assert args == [1, 2]


def test_boxed_func_copies_the_same_attributes_as_torch() -> None:
    add.custom = "kept"  # type: ignore[attr-defined]
    ours, theirs = make_boxed_func(add), torch_make_boxed_func(add)
    for attr in ("__doc__", "__annotations__", "__wrapped__", "custom", "_boxed_call"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    # like torch's simple_wraps: the wrapper keeps its own name
    assert ours.__name__ == theirs.__name__ == "g"


def test_boxed_graph_module_runs_the_graph() -> None:
    gm = make_fx(lambda x: [x.sin()])(torch.ones(2))
    boxed = make_boxed_func(gm)
    assert boxed.__wrapped__ is gm  # type: ignore[attr-defined]
    torch.testing.assert_close(boxed([torch.zeros(2)])[0], torch.zeros(2))


def test_boxed_compiler_boxes_the_compiled_callable() -> None:
    seen: list[Sequence[Any]] = []

    def compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> torch.fx.GraphModule:
        """My compiler."""
        seen.append(example_inputs)
        return gm

    boxed_compiler = make_boxed_compiler(compiler)
    assert boxed_compiler.__name__ == "compiler"
    assert boxed_compiler.__doc__ == "My compiler."
    gm = make_fx(lambda x: [x + 1])(torch.ones(2))
    compiled = boxed_compiler(gm, [torch.ones(2)])
    assert is_boxed(compiled)
    assert len(seen) == 1
    torch.testing.assert_close(compiled([torch.ones(2)])[0], torch.full((2,), 2.0))


def test_boxed_compiler_does_not_box_twice() -> None:
    def already_boxed(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        return make_boxed_func(gm)

    gm = make_fx(lambda x: [x * 3])(torch.ones(1))
    compiled = make_boxed_compiler(already_boxed)(gm, [torch.ones(1)])
    torch.testing.assert_close(compiled([torch.ones(1)])[0], torch.full((1,), 3.0))


def test_is_boxed_needs_true() -> None:
    def f(args: list[Any]) -> None:
        return None

    assert not is_boxed(f)
    f._boxed_call = 1  # type: ignore[attr-defined]
    assert not is_boxed(f)

"""nop and the print compilers behave like torch's nop and print_compile."""

from __future__ import annotations

import io

import pytest
import torch
from aotkit_backends import is_boxed, make_print_compiler, nop, print_compiler
from torch._functorch.compilers import nop as torch_nop
from torch.fx.experimental.proxy_tensor import make_fx


def _graph() -> torch.fx.GraphModule:
    return make_fx(lambda x, y: [x * y, x.t()])(torch.ones(2, 3), torch.ones(2, 3))


def test_nop_returns_the_graph_boxed_like_torch() -> None:
    gm = _graph()
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    ours, theirs = nop(gm, [x, y]), torch_nop(gm, [x, y])
    assert is_boxed(ours) and is_boxed(theirs)
    assert ours.__wrapped__ is gm  # type: ignore[attr-defined]
    out, ref = ours([x, y]), theirs([x, y])
    assert type(out) is type(ref) is list
    for a, b in zip(out, ref, strict=True):
        torch.testing.assert_close(a, b)
    # nop runs the graph itself, so a view output really is a view of the input
    assert out[1]._base is x


def test_print_compiler_prints_the_code(capsys: pytest.CaptureFixture[str]) -> None:
    gm = _graph()
    compiled = print_compiler(gm, [])
    assert capsys.readouterr().out == gm.code + "\n"
    assert is_boxed(compiled)
    torch.testing.assert_close(compiled([torch.ones(2, 3), torch.ones(2, 3)])[0], torch.ones(2, 3))


def test_make_print_compiler_writes_to_file(capsys: pytest.CaptureFixture[str]) -> None:
    buf = io.StringIO()
    gm = _graph()
    make_print_compiler(file=buf)(gm, [])
    assert buf.getvalue() == gm.code + "\n"
    assert capsys.readouterr().out == ""

"""A compiler that prints the code of each graph it is given and then runs it as it is."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import torch.fx

from ._boxing import BoxedCallable, make_boxed_func


def make_print_compiler(
    file: TextIO | None = None,
) -> Callable[[torch.fx.GraphModule, Sequence[Any]], BoxedCallable]:
    """A compiler that writes ``gm.code`` to ``file`` and returns ``gm`` boxed.

    ``file=None`` means ``sys.stdout`` as it is at compile time (so pytest's ``capsys``
    and ``contextlib.redirect_stdout`` see the output).
    """

    def print_compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> BoxedCallable:
        print(gm.code, file=sys.stdout if file is None else file)
        return make_boxed_func(gm)

    return print_compiler


def print_compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> BoxedCallable:
    """Print ``gm.code`` to stdout and return ``gm`` boxed, like torch's ``print_compile``."""
    return make_print_compiler()(gm, example_inputs)

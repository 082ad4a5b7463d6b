"""Every built-in compiler passes the conformance kit, and the kit catches broken ones."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx
from aotkit_backends import (
    inductor_available,
    inductor_compiler,
    inductor_unavailable_reason,
    make_boxed_compiler,
    make_boxed_func,
    make_print_compiler,
    nop,
    print_compiler,
)
from aotkit_backends.testing import CONFORMANCE_CASES, CompilerConformance, ConformanceCase
from aotkit_schemas import Compiler


class TestNop(CompilerConformance):
    @pytest.fixture
    def compiler(self) -> Compiler:
        return nop


class TestPrintCompiler(CompilerConformance):
    @pytest.fixture
    def compiler(self) -> Compiler:
        return print_compiler


class TestPrintCompilerToFile(CompilerConformance):
    @pytest.fixture
    def compiler(self) -> Compiler:
        return make_print_compiler(file=io.StringIO())


class TestBoxedCompilerOfIdentity(CompilerConformance):
    @pytest.fixture
    def compiler(self) -> Compiler:
        def identity(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
            return gm

        return make_boxed_compiler(identity)


@pytest.mark.slow
@pytest.mark.skipif(not inductor_available(), reason=str(inductor_unavailable_reason()))
class TestInductor(CompilerConformance):
    @pytest.fixture
    def compiler(self) -> Compiler:
        return inductor_compiler


# The kit must fail compilers that break the contract.

CASE = {case.name: case for case in CONFORMANCE_CASES}


def _unboxed(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    return gm


def _mutates_inputs(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    def run(args: list[Any]) -> Any:
        out = gm(*args)
        args[0].add_(1)
        return out

    return make_boxed_func(lambda *args: run(list(args)))


def _wrong_values(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    return make_boxed_func(lambda *args: [o + 1 if o is not None else o for o in gm(*args)])


def _drops_an_output(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    return make_boxed_func(lambda *args: gm(*args)[:-1])


def _returns_its_argument_list(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    def run(args: list[Any]) -> Any:
        args[:] = gm(*args)
        return args

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


Check = Callable[[CompilerConformance, Compiler, ConformanceCase], None]


def _outputs(kit: CompilerConformance, compiler: Compiler, case: ConformanceCase) -> None:
    kit.test_reproduces_graph_outputs(compiler, case, "real")


@pytest.mark.parametrize(
    ("broken", "check"),
    [
        (_unboxed, CompilerConformance.test_boxed_calling_convention),
        (_returns_its_argument_list, CompilerConformance.test_boxed_calling_convention),
        (_mutates_inputs, CompilerConformance.test_does_not_mutate_inputs),
        (_wrong_values, _outputs),
        (_drops_an_output, _outputs),
    ],
)
def test_kit_rejects_broken_compilers(broken: Compiler, check: Check) -> None:
    with pytest.raises(AssertionError):
        check(CompilerConformance(), broken, CASE["pointwise"])


def test_kit_requires_a_compiler_fixture(tmp_path: Path) -> None:
    (tmp_path / "test_nothing.py").write_text(
        "from aotkit_backends.testing import CompilerConformance\n\n\n"
        "class TestNothing(CompilerConformance):\n"
        "    pass\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "is_a_compiler"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "must define a `compiler` fixture" in result.stdout

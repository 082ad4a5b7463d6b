"""Pins the public surface of aotkit_backends, so that changing it is deliberate."""

from __future__ import annotations

import inspect

import aotkit_backends
from aotkit_schemas import Compiler


def test_all() -> None:
    assert sorted(aotkit_backends.__all__) == [
        "BoxedCallable",
        "GraphRole",
        "InductorSettingsUndescribable",
        "InductorUnavailableError",
        "TokensThroughHigherOrderOpError",
        "graph_function",
        "inductor_available",
        "inductor_compiler",
        "inductor_decompositions",
        "inductor_joint_graph_passes",
        "inductor_pre_grad_passes",
        "inductor_settings_key",
        "inductor_unavailable_reason",
        "is_boxed",
        "make_boxed_compiler",
        "make_boxed_func",
        "make_inductor_compiler",
        "make_print_compiler",
        "mark_user_visible_outputs",
        "nop",
        "print_compiler",
    ]


def test_compiler_signatures() -> None:
    for compiler in (
        aotkit_backends.nop,
        aotkit_backends.print_compiler,
        aotkit_backends.inductor_compiler,
    ):
        assert list(inspect.signature(compiler).parameters) == ["gm", "example_inputs"]
        assert isinstance(compiler, Compiler)
    assert list(inspect.signature(aotkit_backends.make_boxed_func).parameters) == ["f"]
    assert list(inspect.signature(aotkit_backends.make_boxed_compiler).parameters) == ["compiler"]
    assert list(inspect.signature(aotkit_backends.make_print_compiler).parameters) == ["file"]

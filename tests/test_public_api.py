"""The public surface is deliberate: each package's __all__ and the drop-in signatures.

Changing a name or a signature must change this file too.
"""

from __future__ import annotations

import importlib
import inspect

import aotkit
import pytest
import torch._functorch.aot_autograd as torch_aot

DROP_IN = ["aot_function", "aot_module_simplified", "aot_export_module", "aot_export_joint_simple"]


def _params(fn: object) -> list[tuple[str, object, object]]:
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default if p.default is None or isinstance(p.default, (bool, int)) else "<obj>")
            for p in sig.parameters.values()]


@pytest.mark.parametrize("name", DROP_IN)
def test_drop_in_signature_matches_torch(name: str) -> None:
    ours = getattr(aotkit, name)
    theirs = getattr(torch_aot, name)
    torch_params = _params(theirs)
    our_params = _params(ours)
    # every torch parameter exists in ours, in the same order, kind and (simple) default
    ours_by_name = {p[0]: p for p in our_params}
    for p in torch_params:
        assert p[0] in ours_by_name, f"{name} lacks torch's parameter {p[0]}"
        assert ours_by_name[p[0]] == p, f"{name}: {ours_by_name[p[0]]} != torch's {p}"
    assert [p[0] for p in our_params][: len(torch_params)] == [p[0] for p in torch_params]


def test_aot_module_takes_module_then_aot_function_arguments() -> None:
    params = list(inspect.signature(aotkit.aot_module).parameters.values())
    assert params[0].name == "mod"
    assert params[1].kind is inspect.Parameter.VAR_POSITIONAL
    assert params[2].kind is inspect.Parameter.VAR_KEYWORD


def test_meta_package_exports_the_drop_in_api() -> None:
    required = {
        "aot_function", "aot_module", "aot_module_simplified", "aot_export_module",
        "aot_export_joint_simple", "aot_autograd", "default_partition",
        "min_cut_rematerialization_partition", "nop", "make_boxed_func", "make_boxed_compiler",
        "get_aot_compilation_context", "get_aot_graph_name", "get_graph_being_compiled",
    }
    assert required <= set(aotkit.__all__)
    for name in aotkit.__all__:
        assert hasattr(aotkit, name), name


@pytest.mark.parametrize(
    "package",
    ["aotkit_schemas", "aotkit_functional", "aotkit_analysis", "aotkit_partitioners",
     "aotkit_runtime", "aotkit_backends", "aotkit_frontends", "aotkit"],
)
def test_all_is_sorted_unique_and_resolvable(package: str) -> None:
    mod = importlib.import_module(package)
    names = list(mod.__all__)
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(mod, name), f"{package}.__all__ names missing {name}"
    private = [n for n in dir(mod) if not n.startswith("_") and n not in names
               and not inspect.ismodule(getattr(mod, n))]
    assert not private, f"{package} exposes names outside __all__: {private}"


def test_dynamo_backends_registered_on_import() -> None:
    from torch._dynamo import list_backends

    backends = set(list_backends(exclude_tags=()))
    assert {"aotkit_eager", "aotkit_inductor"} <= backends

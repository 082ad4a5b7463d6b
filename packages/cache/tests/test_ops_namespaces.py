"""The custom-operator key's namespace test: one ``startswith`` per operator, the same
answer as splitting the qualified name. See Note [Custom operators in the on-disk cache key]."""

from __future__ import annotations

from aotkit_cache.key._ops import _TORCH_NAMESPACES, _torch_namespace


def test_torch_namespaces_are_told_by_the_part_before_the_first_separator() -> None:
    names = [
        "aten::add", "prims::sum", "_c10d_functional::all_reduce", "higher_order::cond",
        "mylib::add", "atenx::add", "my_aten::add", "aten_ops::f", "prim::x", "aten",
        "mylib", "mylib::aten::f", "inductor::x", "inductorx::y",
    ]
    for q in names:
        assert _torch_namespace(q) == (q.split("::", 1)[0] in _TORCH_NAMESPACES), q
    assert _torch_namespace("aten::add") and not _torch_namespace("atenx::add")

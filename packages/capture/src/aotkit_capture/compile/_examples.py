"""Example inputs built when first read: a compiler's deferred examples, and the base of
the compiled inputs' fakes that a compile cache restores without building them (See Note
[Restored inputs' fakes built when read] in aotkit_cache)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from aotkit_schemas import example_inputs_unused, reads_graph_only
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode


class DeferredExamples(Sequence[Any]):
    """A compiler's example inputs, made at the first access of any kind. See Note
    [Compilers that ignore their example inputs] in aotkit_schemas."""

    def __init__(self, make: Callable[[], list[Any]], length: int) -> None:
        self._make: Callable[[], list[Any]] | None = make
        self._length = length
        self._items: list[Any] = []

    def _list(self) -> list[Any]:
        if self._make is not None:
            self._items, self._make = self._make(), None
        return self._items

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, i: Any) -> Any:
        return self._list()[i]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._list())

    def __repr__(self) -> str:
        return repr(self._list())


class LazyFakes(DeferredExamples):
    """Compiled inputs' fakes built when first read, whose fake mode and requires_grad
    flags are known without building them (a restored cache entry's: aotkit_cache's
    ``RestoredFakes``). ``fake_mode_made`` says whether reading ``fake_mode`` would make a
    mode that does not exist yet."""

    requires_grad: tuple[bool, ...]

    @property
    def fake_mode(self) -> FakeTensorMode:
        raise NotImplementedError

    @property
    def fake_mode_made(self) -> bool:
        raise NotImplementedError


def fake_mode_of(fake: Sequence[Any]) -> FakeTensorMode:
    """The fake mode a compilation's inputs' fakes belong to (a fresh one for none)."""
    if isinstance(fake, LazyFakes):
        return fake.fake_mode
    return detect_fake_mode(list(fake)) or FakeTensorMode()


def compile_fake_mode(fake: Sequence[Any], compiler: Any) -> FakeTensorMode | None:
    """The fake mode ``compiler`` compiles under: the inputs' fakes' mode, or None for
    restored fakes whose mode was never made when the compiler reads only its graph (See
    Note [A restored entry's fake mode made when first needed] in aotkit_cache)."""
    if (
        isinstance(fake, LazyFakes)
        and not fake.fake_mode_made
        and reads_graph_only(compiler)
        and example_inputs_unused(compiler)
    ):
        return None
    return fake_mode_of(fake)


def requires_grad_flags(fake: Sequence[Any]) -> Sequence[bool]:
    """Per input: a tensor that requires grad."""
    if isinstance(fake, LazyFakes):
        return fake.requires_grad
    return [isinstance(a, torch.Tensor) and a.requires_grad for a in fake]


def examples_for(compiler: Any, fake: Sequence[Any]) -> Sequence[Any]:
    """A compiler's example inputs: ``fake`` itself, unbuilt, for a compiler that never
    reads them, else a list. See Note [Restored inputs' fakes built when read] in
    aotkit_cache."""
    if isinstance(fake, LazyFakes) and example_inputs_unused(compiler):
        return fake
    return list(fake)

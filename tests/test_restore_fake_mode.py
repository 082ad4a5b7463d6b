"""A restored entry's FakeTensorMode records its debugging stack without reading source
lines. See Note [A restored entry's fake mode] in aotkit_cache."""

from __future__ import annotations

import linecache
import traceback

import pytest
import torch
import torch._subclasses.fake_tensor as fake_tensor_module
from aotkit_cache.entry._fake_mode import restore_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode


def _made_here() -> tuple[FakeTensorMode, FakeTensorMode]:
    # both on the same line: the same frames apart from the constructor's own
    return FakeTensorMode(), restore_fake_mode()


def test_same_stack_text_and_frames() -> None:
    plain, restored = _made_here()
    frames_plain = [(f.filename, f.lineno, f.name) for f in plain._stack_trace]
    frames_restored = [(f.filename, f.lineno, f.name) for f in restored._stack_trace]
    # restore_fake_mode adds its own frame under the caller's
    assert frames_restored[-2][2] == "restore_fake_mode"
    assert frames_plain[:-1] == frames_restored[:-2]
    assert frames_plain[-1] == frames_restored[-1]  # FakeTensorMode.__init__
    # the lines are read when the stack is formatted: the same text
    assert plain.stack.splitlines()[:-4] == restored.stack.splitlines()[:-6]
    assert "_made_here" in restored.stack and "FakeTensorMode(), restore_fake_mode()" in restored.stack


def test_lines_not_read_at_construction() -> None:
    path = __file__
    linecache.checkcache()
    linecache.cache.pop(path, None)
    mode = restore_fake_mode()
    entry = linecache.cache.get(path)
    # registered lazily (a loader), not read (a loaded entry holds the lines)
    assert entry is None or len(entry) == 1
    assert any(f.filename == path for f in mode._stack_trace)
    assert "test_lines_not_read_at_construction" in mode.stack
    assert len(linecache.cache[path]) == 4  # read when formatted


def test_module_restored_and_mode_works() -> None:
    restore_fake_mode()
    assert fake_tensor_module.traceback is traceback
    mode = restore_fake_mode()
    assert fake_tensor_module.traceback is traceback
    with mode:
        x = torch.empty(2, 3)
        y = (x @ x.t()).sin()
    assert isinstance(y, fake_tensor_module.FakeTensor) and y.fake_mode is mode
    assert tuple(y.shape) == (2, 2)
    assert mode.shape_env is None and type(mode) is FakeTensorMode


def test_restored_even_when_construction_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[object] = []

    def boom(self: object, *a: object, **k: object) -> None:
        seen.append(fake_tensor_module.traceback.extract_stack())  # through the stand-in
        raise RuntimeError("boom")

    monkeypatch.setattr(FakeTensorMode, "__init__", boom)
    with pytest.raises(RuntimeError, match="boom"):
        restore_fake_mode()
    assert fake_tensor_module.traceback is traceback
    assert len(seen) == 1 and isinstance(seen[0], traceback.StackSummary)

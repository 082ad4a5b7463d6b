"""The compiled inputs' fakes of an entry restored from the on-disk cache, built when first
read.

# Note [Restored inputs' fakes built when read]
# A compilation hands its forward (or inference) compiler the compiled inputs' fake tensors
# as ``example_inputs``, and reads three things off them itself: their fake mode (the
# backward compiles under it), which of them require grad (See Note [Inputs the backward
# never reaches] in aotkit_runtime; an inference graph whose inputs require grad runs under
# no_grad) and, on a warm hit, whether they describe the call's inputs. A restored entry
# knows all three without a fake: the mode is the one its graphs were rebuilt in,
# requires_grad is the metadata's (``input_info``: a trace's fakes require grad exactly
# where it says so), and sizes, strides and dtypes are the checked value recipes' (See Note
# [Lazy node values of restored graphs]). So the restore hands on ``RestoredFakes``, a
# read-only Sequence that builds the fakes at its first access of any kind (separate
# objects from the placeholders' own values, as a trace's are), whose ``fake_mode`` and
# ``requires_grad`` read nothing. A compiler marked with ``mark_example_inputs_unused``
# (nop) gets it as its examples (See Note [Compilers that ignore their example inputs] in
# aotkit_schemas), any other gets ``list(fakes)``, built then. On compare.py's mlp and
# convnet a warm hit no longer builds any fake tensor for nop (0.45-0.65 ms).
# Invariants: an input whose recipe requires grad where the metadata says it does not
# rejects the entry at once (as building it did); the values, once built, are those the
# eager construction made (the same recipes, requires_grad set from the metadata).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from aotkit_analysis import InputLayout
from aotkit_capture import LazyFakes
from aotkit_schemas import CacheFormatError, tensor_static_spec
from torch._subclasses.fake_tensor import FakeTensorMode

from ._fake_mode import DeferredFakeMode, FakeModeLike, resolve_fake_mode
from ._values import LazyValueMeta, StaticTensor


class RestoredFakes(LazyFakes):
    """See Note [Restored inputs' fakes built when read]."""

    def __init__(
        self, metas: list[dict[str, Any]], input_requires_grad: Sequence[bool],
        fake_mode: FakeModeLike,
    ) -> None:
        flags = []
        for m, rg in zip(metas, input_requires_grad, strict=True):
            recipe = m.recipe if isinstance(m, LazyValueMeta) else None
            if isinstance(recipe, StaticTensor):
                is_tensor, recipe_rg = True, recipe.requires_grad
            else:
                v = m["val"]
                is_tensor = isinstance(v, torch.Tensor)
                recipe_rg = is_tensor and v.requires_grad
            if recipe_rg and not rg:
                raise CacheFormatError("a cached input requires grad against the metadata")
            flags.append(is_tensor and rg)
        self._mode = fake_mode
        self.requires_grad: tuple[bool, ...] = tuple(flags)
        self._metas: list[dict[str, Any]] | None = metas
        super().__init__(self._build, len(flags))

    @property
    def fake_mode(self) -> FakeTensorMode:
        """The entry's fake mode (made now if it was not yet: See Note [A restored entry's
        fake mode made when first needed])."""
        return resolve_fake_mode(self._mode)

    @property
    def fake_mode_made(self) -> bool:
        return not isinstance(self._mode, DeferredFakeMode) or self._mode.made

    def _build(self) -> list[Any]:
        metas, self._metas = self._metas, None
        assert metas is not None
        items = []
        for m, rg in zip(metas, self.requires_grad, strict=True):
            f = m.fresh_value() if isinstance(m, LazyValueMeta) else m["val"]
            if rg and not f.requires_grad:
                f.requires_grad_(True)
            items.append(f)
        return items

    def check_inputs(self, flat_args: Sequence[Any], layout: InputLayout) -> None:
        """The cached graph's placeholders describe the compiled inputs (the key already
        covers them; this catches a payload whose checksum was forged). Reads the recipes,
        builds nothing."""
        kept = dict(layout.kept_positions())
        metas = self._metas
        for c, rg in enumerate(self.requires_grad):
            u = kept.get(c)
            if u is None:
                continue
            # the layouts nop and the placeholders' lazy values already read (See Note [Static
            # value specs] in aotkit_schemas): from the recipe while unbuilt
            if metas is None:
                spec = tensor_static_spec(self._items[c])
            else:
                m = metas[c]
                spec = (
                    m.static_value_spec() if isinstance(m, LazyValueMeta)
                    else tensor_static_spec(m["val"])
                )
            if spec is None:
                continue
            a = flat_args[u]
            if not isinstance(a, torch.Tensor):
                raise CacheFormatError(f"cached input {c} is a tensor, the call's is not")
            if spec[:3] != (tuple(a.shape), tuple(a.stride()), a.dtype) or rg != a.requires_grad:
                raise CacheFormatError(f"cached input {c} does not match the call's input {u}")

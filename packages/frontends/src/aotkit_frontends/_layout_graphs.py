"""Graphs aot_module_simplified compiles for the input layouts its first graph does not fit.

# Note [Graphs for other input layouts]
# A call whose input layout the compiled graph does not fit (See Note [Runtime checks of
# the input layout]) used to run the module eagerly, every such call. Now the first such
# call of a layout compiles a graph for it, with static shapes, from the call's own
# (real) inputs, and later calls with the same key run it. The key is exact for what a
# static compile bakes in: grad mode; per input, the position of the first input that is
# the same tensor and of the first that shares its storage (which inputs overlap and
# how), and, for a tensor, its dtype, device, size, stride, storage offset and
# requires_grad; for an int, float or bool, its value. Any other input, more than
# ``MAX_LAYOUT_GRAPHS`` keys, or a compile that raises, runs the module eagerly (eager's
# values), with the reason in the ``recompiles`` log. These graphs never use the on-disk
# cache and carry no dynamo sources: dynamo guards the first graph, not these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from aotkit_capture import compile_flat
from aotkit_schemas import AOTConfig, artifact_enabled, log_artifact

MAX_LAYOUT_GRAPHS = 8

_SCALARS = (int, float, bool)


def _key(flat: Sequence[Any]) -> tuple[Any, ...] | None:
    """The key of a call (None: an input a static graph cannot key)."""
    same: dict[int, int] = {}
    shared: dict[int, int] = {}
    parts: list[Any] = [torch.is_grad_enabled()]
    for i, a in enumerate(flat):
        if type(a) is torch.Tensor:
            if a.is_sparse or a.is_mkldnn:
                return None
            storage = a.untyped_storage()._cdata
            parts.append((
                same.setdefault(id(a), i), shared.setdefault(storage, i), a.dtype, a.device,
                tuple(a.shape), a.stride(), a.storage_offset(), a.requires_grad,
            ))
        elif type(a) in _SCALARS:
            parts.append((type(a), a))
        else:
            return None
    return tuple(parts)


class LayoutGraphs:
    """Per-layout compiled runners for one aot_module_simplified compilation."""

    def __init__(
        self,
        flat_fn: Callable[..., Any],
        cfg: AOTConfig,
        unflatten: Callable[[Any], Any],
        eager: Callable[[list[Any]], Any],
    ) -> None:
        self.flat_fn = flat_fn
        self.cfg = dataclasses.replace(
            cfg, dynamic_shapes=False, aot_autograd_arg_pos_to_source=None
        )
        self.unflatten = unflatten
        self.eager = eager
        self.runners: dict[tuple[Any, ...], Callable[[list[Any]], Any] | None] = {}

    def __call__(self, flat: list[Any], why: Callable[[], str]) -> Any:
        key = _key(flat)
        runner = self.runners.get(key) if key is not None else None
        if runner is not None:
            return self.unflatten(runner(flat))
        if key is None or key in self.runners or len(self.runners) >= MAX_LAYOUT_GRAPHS:
            reason = (
                "an input no static graph can key" if key is None
                else "its compile failed" if key in self.runners
                else f"{MAX_LAYOUT_GRAPHS} layouts already have graphs"
            )
            _log("aot_module_simplified runs the module eagerly for this call (%s): %s",
                 reason, why())
            return self.eager(flat)
        _log("aot_module_simplified compiles a graph for this call's input layout: %s", why())
        try:
            runner, _ = compile_flat(self.flat_fn, flat, self.cfg)
        except Exception as e:  # eager's values rather than an error eager does not raise
            self.runners[key] = None
            _log("aot_module_simplified runs the module eagerly for this call (%s): %s",
                 f"its compile failed: {type(e).__name__}: {e}", why())
            return self.eager(flat)
        self.runners[key] = runner
        return self.unflatten(runner(flat))


def _log(message: str, *args: Any) -> None:
    if artifact_enabled("recompiles"):
        log_artifact("recompiles", message, *args)

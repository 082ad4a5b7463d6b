"""Checks that a graph compiled once is still called the way it was compiled for.

# Note [Runtime checks of aot_module_simplified]
# aot_module_simplified compiles once, for its example inputs, and trusts its caller
# (dynamo) to guard: the returned function is never recompiled. Two assumptions of the
# compiled graph are then checked on every call, with torch's exact messages (AssertionError,
# "At compilation time, graph N was compiled under the assumption that ..."):
#   * duplicated inputs: the compiled graph takes one tensor passed twice once (see Note
#     [Duplicate and aliased inputs]), so a call whose inputs are no longer the same tensor
#     raises "input i would be a duplicate of input j". torch only dedupes (and checks)
#     duplicates that the function mutates and treats unmutated ones as distinct leaves;
#     aotkit dedupes every duplicate, so it checks every one (a silent wrong answer is the
#     alternative). With dynamo sources, a DuplicateInputs guard is also registered so that
#     dynamo recompiles instead. As in torch, j counts the distinct inputs before it.
#   * requires_grad (only under ``torch._functorch.config.debug_assert``, read when
#     compiling, and only for a graph compiled with autograd): an input that did not require
#     grad at compile time must not require it now ("input i would not require grad"); a
#     position that held a non-tensor must not get a tensor.
# The input layout itself (which inputs overlap a written one, and how) is checked too,
# with a fallback instead of an assertion: See Note [Runtime checks of the input layout].
# Inputs are numbered as torch's describe_input does: ``parameter/buffer i`` for the first
# num_params_buffers, then ``input i``; the requires_grad check numbers the compiled
# (deduplicated) inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from aotkit_analysis import InputLayout
from aotkit_schemas import AOTConfig
from torch._guards import DuplicateInputs, Source, TracingContext
from torch._subclasses.fake_tensor import FakeTensorConfig, is_fake


def describe_input(i: int, num_params_buffers: int) -> str:
    """torch's name for flat input ``i`` in guard-bug messages."""
    if i < num_params_buffers:
        return f"parameter/buffer {i}"
    return f"input {i - num_params_buffers}"


def guard_bug_message(aot_id: int, expected: str) -> str:
    """torch's message for a compile-time assumption that no longer holds."""
    return (
        f"At compilation time, graph {aot_id} was compiled under the "
        f"assumption that {expected}, but at runtime this was not the case.  "
        "This indicates a guard bug in AOTAutograd or Dynamo, please file a bug to PyTorch."
    )


Check = Callable[[Sequence[Any]], None]


def duplicate_input_check(layout: InputLayout, cfg: AOTConfig) -> Check | None:
    """A check that the inputs deduplicated at compile time are still the same tensors
    (None when nothing was deduplicated). See Note [Runtime checks of aot_module_simplified]."""
    first = layout.first_occurrence
    unique = [i for i, f in enumerate(first) if f == i]
    deduped_index = {u: k for k, u in enumerate(unique)}
    n = cfg.num_params_buffers
    dupes = [
        (i, f, guard_bug_message(
            cfg.aot_id,
            f"{describe_input(i, n)} would be a duplicate of {describe_input(deduped_index[f], n)}",
        ))
        for i, f in enumerate(first)
        if f != i
    ]
    if not dupes:
        return None

    def check(args: Sequence[Any]) -> None:
        for i, f, message in dupes:
            if args[i] is not args[f]:
                raise AssertionError(message)

    return check


def register_duplicate_guards(layout: InputLayout, sources: Sequence[Source | None] | None) -> None:
    """Ask dynamo to guard that deduplicated inputs stay duplicates (it then recompiles
    rather than reaching the runtime check)."""
    tracing = TracingContext.try_get()
    if tracing is None or not sources:
        return
    for i, f in enumerate(layout.first_occurrence):
        kept, dupe = sources[f], sources[i]
        if f != i and kept is not None and dupe is not None and kept != dupe:
            tracing.guards_context.aotautograd_guards.append(DuplicateInputs(kept, dupe))


def requires_grad_check(
    layout: InputLayout, flat_args: Sequence[Any], cfg: AOTConfig
) -> Check | None:
    """torch's debug_assert check for a graph compiled with autograd: compiled inputs that
    did not require grad (or were not tensors) at compile time still don't. See Note
    [Runtime checks of aot_module_simplified]."""
    n = cfg.num_params_buffers
    # (user index, whether a tensor was expected, message), in compiled-input order
    checks: list[tuple[int, bool, str]] = []
    for c, u in layout.kept_positions():
        a = flat_args[u]
        if not isinstance(a, torch.Tensor):
            checks.append((u, False, f"expected non-Tensor for arg {c}, got Tensor"))
        elif not a.requires_grad:
            expected = f"{describe_input(c, n)} would not require grad"
            checks.append((u, True, guard_bug_message(cfg.aot_id, expected)))
    if not checks:
        return None

    def check(args: Sequence[Any]) -> None:
        for u, tensor, message in checks:
            a = args[u]
            if (a.requires_grad if tensor else isinstance(a, torch.Tensor)):
                raise AssertionError(message)

    return check


def assert_no_fake_params_or_buffers(gm: torch.nn.Module) -> None:
    """Raise torch's AssertionError when ``gm`` holds a fake tensor as a buffer or parameter
    (e.g. a fake tensor the traced function closed over, which tracing made a constant)."""

    def hint(t: Any) -> str:
        if FakeTensorConfig.debug:
            import traceback

            trace = traceback.format_list(t._debug_trace)
            return f"FAKE TENSOR CREATION TRACEBACK: \n {trace}"
        return "Enable TORCH_FAKE_TENSOR_DEBUG=1 to get creation stack traces on fake tensors."

    for name, buffer in gm.named_buffers():
        if is_fake(buffer):
            raise AssertionError(f"Unexpected fake buffer {name} {hint(buffer)}")
    for name, param in gm.named_parameters():
        if is_fake(param):
            raise AssertionError(f"Unexpected fake param {name} {hint(param)}")


def checking_fake_constants(partition_fn: Callable[..., Any]) -> Callable[..., Any]:
    """``partition_fn``, first asserting that the joint graph holds no fake constants (as
    torch does right after tracing the joint graph)."""

    def partition(joint: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
        assert_no_fake_params_or_buffers(joint)
        return partition_fn(joint, *args, **kwargs)

    # the wrapped partitioner's cache key is the wrapper's (Note [Compiler cache keys])
    partition.__wrapped__ = partition_fn  # type: ignore[attr-defined]
    # logs and the partition report name the partitioner, not this wrapper
    partition.__name__ = getattr(partition_fn, "__name__", type(partition_fn).__name__)
    return partition

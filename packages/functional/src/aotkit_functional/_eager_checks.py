"""Eager's in-place errors, raised while a function runs functionalized.

# Note [In-place errors eager raises and functionalization hides]
# Functionalization rewrites every in-place op into an out-of-place op plus a write-back,
# so some programs that eager rejects would trace "successfully" and compute something:
#   * an in-place op on a leaf that requires grad, or on a view of one, with grad mode on
#     (eager: "a leaf Variable that requires grad is being used in an in-place
#     operation"). FunctionalTensor wrappers of inputs are never leaves, so autograd's own
#     check does not fire;
#   * an in-place op that writes through a view in which several elements share one
#     memory location, e.g. ``x.expand(3, 4).add_(1)`` (eager: "more than one element of
#     the written-to tensor refers to a single memory location").
# ``EagerInplaceChecks`` is a dispatch mode that sits above the FunctionalTensorMode and
# raises those errors, with eager's messages, before functionalization sees the op.
# Mutations eager allows (under no_grad, through ``.detach()``/``.data``, on non-leaf
# inputs) pass.
# Eager does allow fills (``fill_``, ``zero_``, ``masked_fill_``) through such a view, but
# functionalization writes an expanded view back by summing over the expanded dimension,
# so the traced program would silently compute something else: those raise an error that
# says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch._higher_order_ops.effects import has_effects
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

# Ops that only change size/stride/offset/storage: no data is written.
_METADATA_ONLY = frozenset(
    {
        "t_", "transpose_", "swapdims_", "swapaxes_", "unsqueeze_", "squeeze_",
        "as_strided_", "resize_", "resize_as_", "set_", "detach_", "_resize_output_",
    }
)
# Fills, which eager runs on overlapping memory (idempotent; masked_fill_ only warns).
_FILLS = frozenset({"fill_", "zero_", "masked_fill_", "index_fill_"})

_LEAF_MESSAGE = "a leaf Variable that requires grad is being used in an in-place operation."
_VIEW_OF_LEAF_MESSAGE = (
    "a view of a leaf Variable that requires grad is being used in an in-place operation."
)
_OVERLAP_MESSAGE = (
    "unsupported operation: more than one element of the written-to tensor refers to a "
    "single memory location. Please clone() the tensor before performing the operation."
)
_FILL_OVERLAP_MESSAGE = (
    "aotkit cannot compile {op} on a tensor in which several elements share one memory "
    "location (an expanded view, e.g. x.expand(3, 4).{op}(...)): eager allows it, but "
    "functionalization would write the view back by summing over the expanded dimension. "
    "Remedy: apply {op} to the tensor that was expanded (before expand), or clone() first."
)


def _written_tensors(
    func: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]
) -> Iterable[torch.Tensor]:
    for pos, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = kwargs.get(arg.name) if arg.kwarg_only or pos >= len(args) else args[pos]
        if isinstance(value, torch.Tensor):
            yield value


# prim: metadata queries (prim::device, prim::dtype, prim::layout)
_NATIVE_NAMESPACES = frozenset({"aten", "prims", "prim"})


def needs_python_functionalization(func: Any) -> bool:
    """Whether torch's Python FunctionalTensorMode treats ``func`` differently from the
    C++ Functionalize key. See Note [Native functionalization]."""
    if not isinstance(func, torch._ops.OpOverload) or func.namespace not in _NATIVE_NAMESPACES:
        return True  # custom ops (auto_functionalize, effects), HOPs, TorchBind
    if has_effects(func):
        return True  # aten._print, aten._linalg_check_errors: threaded with effect tokens
    if torch._library.utils.is_out(func):
        return True  # See Note [out= keeps the out tensor's layout]
    # the Python mode decomposes these with their Python kernel (e.g. native_batch_norm,
    # whose schema hides that it writes the running stats)
    return torch._C.DispatchKey.CompositeImplicitAutograd in func.py_kernels


def python_mode_reason(func: Any) -> str:
    """Why ``func`` keeps a program off the native paths, in one phrase (See Note [Why a
    graph took the path it took] in aotkit_capture)."""
    if isinstance(func, torch._ops.OpOverload) and has_effects(func):
        return f"{func} is effectful (effect tokens need the Python functionalization mode)"
    # See Note [Higher-order operators] in aotkit_tracing
    hop = "the higher-order operator " if isinstance(func, torch._ops.HigherOrderOperator) else ""
    return f"{hop}{func} needs the Python functionalization mode"


def has_internal_overlap(t: torch.Tensor) -> bool:
    """Eager's ``has_internal_overlap(t) == MemOverlap::Yes``: a dimension of size > 1
    with stride 0."""
    return any(st == 0 and sz > 1 for sz, st in zip(t.shape, t.stride(), strict=True))


# Elements beyond which overlaps_itself stops counting offsets and answers True.
_EXACT_OVERLAP_LIMIT = 1 << 20


def overlaps_itself(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` share a memory location, decided exactly for
    concrete sizes and strides (eager's check only sees stride 0). See Note [Writes into
    memory that overlaps itself in a way eager does not detect].

    Pure Python: it runs inside dispatch modes, where a tensor op would be traced."""
    if t.layout != torch.strided or is_traceable_wrapper_subclass(t):
        return False
    if has_internal_overlap(t):
        return True
    sizes, strides = tuple(t.shape), t.stride()
    if not all(type(v) is int for v in (*sizes, *strides)):
        return False  # symbolic: undecidable without adding guards (int() would specialize)
    dims = sorted((st, sz) for sz, st in zip(sizes, strides, strict=True) if sz != 1)
    reach = 0  # the largest offset the smaller-stride dimensions reach
    for st, sz in dims:
        if sz == 0:
            return False
        if abs(st) <= reach:
            break
        reach += abs(st) * (sz - 1)
    else:
        return False  # each stride steps past everything below it: no overlap
    numel = 1
    for _, sz in dims:
        numel *= sz
    if numel > _EXACT_OVERLAP_LIMIT:
        return True
    offsets = {0}
    for st, sz in dims:
        offsets = {o + i * st for o in offsets for i in range(sz)}
    return len(offsets) < numel


# Note [Writes into memory that overlaps itself in a way eager does not detect]
# Eager rejects an in-place op on a tensor with a stride-0 dimension, but its check answers
# "too hard" for other self-overlapping layouts (``base.as_strided((3, 3), (1, 1))``) and
# lets the op run: each of the nine elements is updated in turn, so a location shared by
# three elements is incremented three times by ``add_(1)``. Functionalization computes
# ``x + 1`` once per location and writes it back, so the compiled program would silently
# disagree. ``overlaps_itself`` decides the overlap exactly (stride arithmetic, then a
# count of distinct offsets), and a data write into such a tensor raises a clear error at
# trace time, before any input is touched. Fills are the same in both (idempotent) but are
# refused too, as for stride 0 (the write-back sums).
_SELF_OVERLAP_MESSAGE = (
    "aotkit cannot compile {op} on a tensor whose elements overlap in memory (shape "
    "{shape}, stride {stride}: several elements are one memory location). Eager updates "
    "such a location once per element that shares it, in its kernel's order; a functional "
    "graph computes one value per location, so the result would differ. Remedy: clone() "
    "the tensor before writing into it, or write into the tensor it was taken from. See "
    "Note [Writes into memory that overlaps itself in a way eager does not detect]."
)


# TorchDispatchMode's __init__ and __init_subclass__ carry no annotations in torch.
class EagerInplaceChecks(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """See Note [In-place errors eager raises and functionalization hides].

    ``leaf_inputs`` are the (functional) inputs that stand for autograd leaves requiring
    grad.

    Higher-order operators (``torch.cond``, ``map``, ...) reach ``__torch_dispatch__``
    with this mode popped; they run below it unchecked (their bodies may not mutate their
    operands: torch's own checks raise for that) and mark the program as needing the
    Python mode. See Note [Higher-order operators] in aotkit_tracing.
    """

    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # lets torch.cond & co. trace their branches with dynamo under this mode
        # (See Note [Higher-order operators] in aotkit_tracing)
        return True

    def __init__(self, leaf_inputs: Iterable[torch.Tensor]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._leaf_ids = {id(t) for t in leaf_inputs}
        # See Note [Native functionalization]: False once an op needs the Python mode
        self.native_functionalization_ok = True
        # the first op that needs the Python mode (See Note [Why a graph took the path it
        # took] in aotkit_capture)
        self.python_mode_op: Any = None

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if self.native_functionalization_ok and needs_python_functionalization(func):
            self.native_functionalization_ok = False
            self.python_mode_op = func
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if func._schema.is_mutable:
            name = func._schema.name.split("::")[-1]
            for t in _written_tensors(func, args, kwargs):
                self._check(t, name)
        return func(*args, **kwargs)

    def _check(self, t: torch.Tensor, op: str) -> None:
        if self._leaf_ids and t.requires_grad and torch.is_grad_enabled():
            if id(t) in self._leaf_ids:
                raise RuntimeError(_LEAF_MESSAGE)
            base = t._base
            if base is not None and id(base) in self._leaf_ids:
                raise RuntimeError(_VIEW_OF_LEAF_MESSAGE)
        if op not in _METADATA_ONLY and has_internal_overlap(t):
            if op in _FILLS:
                raise RuntimeError(_FILL_OVERLAP_MESSAGE.format(op=op))
            raise RuntimeError(_OVERLAP_MESSAGE)
        if op not in _METADATA_ONLY and overlaps_itself(t):
            # See Note [Writes into memory that overlaps itself in a way eager does not detect]
            raise RuntimeError(
                _SELF_OVERLAP_MESSAGE.format(op=op, shape=tuple(t.shape), stride=t.stride())
            )

"""Translating tracing failures into errors that name the cause and the remedy."""

from __future__ import annotations

import contextlib
import functools
import re
import sys
from collections.abc import Iterator

from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    UnsupportedOperatorException,
)

DATA_DEPENDENT_MESSAGE = (
    "aotkit cannot compile data-dependent control flow or values: while tracing with "
    "fake tensors the function needed the concrete value of a tensor (operator {op}). "
    "This happens with Python control flow on tensor values (`if x.sum() > 0:`), "
    "`.item()`, `.tolist()`, `bool(t)` or `int(t)`. Remedy: express the branch with "
    "tensor ops (`torch.where(cond, a, b)`, masking) or `torch.cond`, pass the value in "
    "as a Python scalar argument, or move the data-dependent part outside the compiled "
    "function."
)

DYNAMIC_OUTPUT_MESSAGE = (
    "aotkit cannot compile an operator whose output shape depends on tensor values "
    "(operator {op}, e.g. nonzero, unique, boolean-mask indexing). Remedy: use a "
    "fixed-shape formulation (torch.where, masked ops) or run that part eagerly."
)

MISSING_FAKE_KERNEL_MESSAGE = (
    "aotkit traces with fake tensors, and operator {op} has no fake (meta) kernel to say "
    "what it returns without running it. Remedy: register one, e.g. "
    "`torch.library.register_fake(\"{name}\")` on a function returning empty tensors of "
    "the outputs' shapes and dtypes (or `lib.impl(..., \"Meta\")`), or use "
    "`torch.library.custom_op` with `register_fake`."
)


class AOTCompileError(RuntimeError):
    """Raised when a function cannot be traced into a functional graph."""


# Note [Tracing errors keep torch's types]
# Callers (torch's own test helpers among them) catch DataDependentOutputException,
# DynamicOutputShapeException and GuardOnDataDependentSymNode by type, e.g. to skip an op
# whose output shape depends on data. aotkit's clearer errors therefore subclass both
# AOTCompileError and the original exception type, keep its fields (``func``, ``cond``),
# and chain the original as ``__cause__``.


class _TorchTypedCompileError(AOTCompileError):
    """aotkit's message on an error that is also torch's original type, with the original's
    field (``func`` or ``cond``) set. See Note [Tracing errors keep torch's types]."""

    _field = "func"

    def __init__(self, message: str, value: object) -> None:
        RuntimeError.__init__(self, message)
        setattr(self, self._field, value)

    def __str__(self) -> str:
        return str(self.args[0])


class DataDependentError(_TorchTypedCompileError, DataDependentOutputException):
    """A tensor's value was needed while tracing (``.item()``, ``if x.sum() > 0``)."""


class DynamicOutputShapeError(_TorchTypedCompileError, DynamicOutputShapeException):
    """An op's output shape depends on tensor values (``nonzero``, masks)."""


class MissingFakeKernelError(_TorchTypedCompileError, UnsupportedOperatorException):
    """An operator (typically a custom op) has no fake/meta kernel to trace with."""


@functools.cache
def data_dependent_guard_error() -> type[AOTCompileError]:
    """``DataDependentGuardError``: a branch on a data-dependent symbolic value.

    The class subclasses ``GuardOnDataDependentSymNode``, which lives in torch's
    symbolic_shapes module (it imports sympy, seconds at import time): it is made when first
    needed, when that module is loaded anyway. See Note [Import cost] in aotkit_frontends.
    """
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    class DataDependentGuardError(_TorchTypedCompileError, GuardOnDataDependentSymNode):
        """A branch on a data-dependent symbolic value."""

        _field = "cond"

    return DataDependentGuardError


@contextlib.contextmanager
def explain_tracing_errors() -> Iterator[None]:
    """Re-raise fake-tensor data-dependence failures with a clear message.

    See Note [Tracing errors keep torch's types].
    """
    try:
        yield
    except AOTCompileError:
        raise
    except DataDependentOutputException as e:
        raise DataDependentError(DATA_DEPENDENT_MESSAGE.format(op=e.func), e.func) from e
    except DynamicOutputShapeException as e:
        raise DynamicOutputShapeError(DYNAMIC_OUTPUT_MESSAGE.format(op=e.func), e.func) from e
    except UnsupportedOperatorException as e:
        name = getattr(e.func, "_schema", None)
        text = MISSING_FAKE_KERNEL_MESSAGE.format(
            op=e.func, name=name.name if name is not None else e.func
        )
        raise MissingFakeKernelError(text, e.func) from e
    except NotImplementedError as e:
        hop_error = unsupported_hop_error(e)
        if hop_error is None:
            raise
        raise hop_error from e
    except Exception as e:
        # only symbolic shapes raise GuardOnDataDependentSymNode, and their module is loaded
        # by then (See Note [Import cost] in aotkit_frontends)
        shapes = sys.modules.get("torch.fx.experimental.symbolic_shapes")
        if shapes is None or not isinstance(e, shapes.GuardOnDataDependentSymNode):
            raise
        raise data_dependent_guard_error()(
            DATA_DEPENDENT_MESSAGE.format(op="a data-dependent symbolic value") + f" ({e})",
            e.cond,
        ) from e


# Higher-order operators without a rule: See Note [Higher-order operators] in _hops
_NO_RULE = re.compile(
    r"There was no rule registered for HigherOrderOperator (\S+) and mode <([\w.]+)"
)
_NO_KERNEL = re.compile(
    r"could not find kernel for HigherOrderOperator (\S+) at dispatch key (\S+)"
)

UNSUPPORTED_HOP_MESSAGE = (
    "aotkit cannot trace the higher-order operator {hop}: it has no rule for {where}, "
    "which aotkit's tracing needs (torch's functionalization, fake tensors and make_fx "
    "each need one; See Note [Higher-order operators]). Remedy: register the missing "
    "rule on the operator ({how}), or call {hop} outside the compiled function."
)


class UnsupportedHigherOrderOperatorError(AOTCompileError, NotImplementedError):
    """A higher-order operator lacks a rule aotkit's tracing needs. ``hop`` names it."""

    def __init__(self, message: str, hop: str) -> None:
        RuntimeError.__init__(self, message)
        self.hop = hop


def unsupported_hop_error(e: BaseException) -> UnsupportedHigherOrderOperatorError | None:
    """torch's dispatcher message for a HOP without a rule, as an error naming the HOP and
    the remedy (None when ``e`` is something else). See Note [Higher-order operators]."""
    if not isinstance(e, NotImplementedError):
        return None
    text = str(e)
    match = _NO_RULE.search(text)
    if match is not None:
        hop, mode = match.group(1), match.group(2).rsplit(".", 1)[-1]
        how = f"``{hop}.py_impl({mode})``, or ``py_functionalize_impl`` for functionalization"
        where = f"the dispatch mode {mode}"
    else:
        match = _NO_KERNEL.search(text)
        if match is None:
            return None
        hop, key = match.group(1), match.group(2)
        how = f"``{hop}.py_impl({key})``"
        where = f"the dispatch key {key}"
    return UnsupportedHigherOrderOperatorError(
        UNSUPPORTED_HOP_MESSAGE.format(hop=hop, where=where, how=how), hop
    )

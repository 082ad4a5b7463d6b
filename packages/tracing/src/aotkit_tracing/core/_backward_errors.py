"""Errors a user's ``autograd.Function.backward`` raises while the joint is traced.

# Note [Errors raised by a custom backward]
# Eager runs an ``autograd.Function``'s ``backward`` only when a backward pass reaches its
# node, so a ``backward`` that raises (``raise NotImplementedError("no double backward")``,
# a check on the saved values' shapes) makes only the ``.backward()`` calls that reach it
# fail. The joint trace calls it for every output at compile time; such an error is
# deferred like autograd's stale-saved-value error (See Note [Backward paths through stale
# saved values]): the outputs whose backward raises are left out of the joint and the
# compiled backward raises the same class and message when one of them gets a gradient
# (Note [Deferred backward errors] in aotkit_runtime).
#
# Only errors the user's code raised itself are deferred: the traceback passes through
# autograd's call of a custom backward (``BackwardCFunction.apply``), and its innermost
# frame is a ``raise`` statement outside torch and aotkit. An error torch raises while
# tracing the backward (a data-dependent branch on a fake tensor, an op the fake mode
# cannot run) would not be raised by eager at all: it is still raised at compile time.
"""

from __future__ import annotations

import dis
import os
from types import TracebackType

import torch
import torch.autograd.function
from aotkit_runtime import exception_path

_RAISE = dis.opmap["RAISE_VARARGS"]
_APPLY_FILE = os.path.normcase(os.path.abspath(torch.autograd.function.__file__))
_TORCH_DIR = os.path.dirname(os.path.normcase(os.path.abspath(torch.__file__))) + os.sep
_AOTKIT_DIR = os.path.dirname(os.path.dirname(os.path.normcase(os.path.abspath(__file__))))


def _is_library(filename: str) -> bool:
    path = os.path.normcase(os.path.abspath(filename))
    if path.startswith(_TORCH_DIR):
        return True
    parent = os.path.dirname(os.path.dirname(path))
    return parent == _AOTKIT_DIR and os.path.basename(os.path.dirname(path)).startswith("aotkit")


def raised_by_custom_backward(e: BaseException) -> bool:
    """Whether the user's custom backward raised ``e`` itself. See Note [Errors raised by a
    custom backward]."""
    tb: TracebackType | None = e.__traceback__
    through_apply = False
    last: TracebackType | None = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "apply" and os.path.normcase(code.co_filename) == _APPLY_FILE:
            through_apply = True
        last = tb
        tb = tb.tb_next
    if not through_apply or last is None:
        return False
    code = last.tb_frame.f_code
    if _is_library(code.co_filename):
        return False
    lasti = last.tb_lasti
    return 0 <= lasti < len(code.co_code) and code.co_code[lasti] == _RAISE


def error_record(e: BaseException) -> tuple[str, str]:
    """The class and message the compiled backward raises again. See Note [Deferred
    backward errors] in aotkit_runtime."""
    return exception_path(type(e)), str(e)

"""BatchNorm with ``momentum=None`` (a cumulative moving average), traced with tensors.

# Note [BatchNorm's cumulative moving average]
# ``nn.BatchNorm*d(momentum=None)`` in training bumps ``num_batches_tracked`` and then
# reads it as a Python number: ``exponential_average_factor = 1.0 / float(
# self.num_batches_tracked)``, passed to ``F.batch_norm`` as its momentum. On fake tensors
# that ``float()`` is data-dependent, so the trace raised where eager works, and baking in
# the value of the first call would be silently wrong on the next. ``cumulative_batch_norm``
# runs the traced function under a torch-function mode that recognizes exactly this
# pattern and carries the factor as a tensor instead:
#   * ``float(t)`` called from ``torch.nn.modules.batchnorm._BatchNorm.forward`` itself
#     (by code object, so a subclass with its own forward is not touched), in training
#     with ``momentum=None``, on that module's ``num_batches_tracked`` returns NaN (Python
#     turns whatever ``__float__`` returns into a plain float, so no tensor can ride on
#     it). That forward's only use of it is ``1.0 / value`` passed to ``F.batch_norm``;
#   * ``F.batch_norm`` called from that same forward with a NaN momentum takes the
#     momentum as ``1 / num_batches_tracked`` read from the module, as a tensor: one
#     ``batch_norm`` into scratch buffers at momentum 1 gives the normalized output and
#     leaves exactly the batch mean and the unbiased batch variance there, then the
#     running stats are updated as the CPU kernel does, ``m * stat + (1 - m) * running``
#     in float64, rounded to the buffer's dtype.
# The graph then reads ``num_batches_tracked`` like any other buffer: every step runs the
# same graph, with running stats and ``num_batches_tracked`` as in eager.
# The mode is entered only around such a forward, not around the whole trace: a
# torch-function mode makes every torch call (and every Tensor method called by torch's
# own Python tracing code) go through Python, about 5% of a transformer's compile. While
# an aotkit trace runs, ``_BatchNorm.forward`` is swapped for a function that enters the
# mode when the module uses a cumulative average in training and the calling thread is
# tracing (a thread-local flag; other threads, and calls outside a trace, run the
# original forward unchanged). The swap is reference-counted under a lock, so nested and
# concurrent traces share one.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_BATCH_NORM_FORWARD = torch.nn.modules.batchnorm._BatchNorm.forward.__code__


def _calling_batch_norm() -> Any:
    """The BatchNorm module whose own ``forward`` (by code object) is the caller, if any,
    when it uses a cumulative moving average in training."""
    frame = sys._getframe(2)
    for _ in range(5):
        if frame is None:
            return None
        if frame.f_code is _BATCH_NORM_FORWARD:
            module = frame.f_locals.get("self")
            cumulative = (
                module is not None
                and module.momentum is None
                and module.training
                and module.track_running_stats
                and module.num_batches_tracked is not None
            )
            return module if cumulative else None
        frame = frame.f_back  # type: ignore[assignment]
    return None


class _CumulativeBatchNorm(TorchFunctionMode):  # type: ignore[misc]
    def __torch_function__(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.__float__ and len(args) == 1:
            module = _calling_batch_norm()
            if module is not None and module.num_batches_tracked is args[0]:
                return _UNUSED_FACTOR
        elif func is F.batch_norm:
            module = _calling_batch_norm()
            if module is not None:
                bound = _F_BATCH_NORM.bind(*args, **kwargs)
                bound.apply_defaults()
                a = bound.arguments
                if a["momentum"] != a["momentum"]:  # the factor made from _UNUSED_FACTOR
                    a["momentum"] = module.num_batches_tracked
                    return _batch_norm_with_tensor_momentum(**a)
        return func(*args, **kwargs)


# what ``float(num_batches_tracked)`` gives in BatchNorm.forward during the trace; its
# only use there, ``1.0 / value``, reaches F.batch_norm as NaN, which the mode replaces
_UNUSED_FACTOR = float("nan")
_F_BATCH_NORM = inspect.signature(F.batch_norm)


def _batch_norm_with_tensor_momentum(
    input: torch.Tensor,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    training: bool,
    momentum: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """F.batch_norm with momentum ``1 / num_batches_tracked`` (the tensor ``momentum``)."""
    if not training or running_mean is None or running_var is None:
        raise RuntimeError(
            "aotkit: BatchNorm with momentum=None in training called F.batch_norm without "
            "running stats; See Note [BatchNorm's cumulative moving average] in aotkit_capture."
        )
    batch_mean = torch.zeros_like(running_mean)
    batch_var = torch.zeros_like(running_var)
    out = F.batch_norm(input, batch_mean, batch_var, weight, bias, True, 1.0, eps)
    with torch.no_grad():
        m = 1.0 / momentum.to(torch.float64)
        for running, stat in ((running_mean, batch_mean), (running_var, batch_var)):
            new = m * stat.to(torch.float64) + (1 - m) * running.to(torch.float64)
            running.copy_(new.to(running.dtype))
    return out


_BATCH_NORM = torch.nn.modules.batchnorm._BatchNorm
_ORIGINAL_FORWARD = _BATCH_NORM.forward
_tracing = threading.local()
_swap_lock = threading.Lock()
_swap_users = 0


def _forward(self: Any, input: torch.Tensor) -> torch.Tensor:
    """``_BatchNorm.forward`` while an aotkit trace runs: the original, under the mode
    when this thread traces a cumulative average in training."""
    if (
        getattr(_tracing, "depth", 0)
        and self.training
        and self.momentum is None
        and self.track_running_stats
        and self.num_batches_tracked is not None
    ):
        with _CumulativeBatchNorm():
            return _ORIGINAL_FORWARD(self, input)
    return _ORIGINAL_FORWARD(self, input)


@contextlib.contextmanager
def _swapped_forward() -> Iterator[None]:
    global _swap_users
    with _swap_lock:
        if _swap_users == 0:
            _BATCH_NORM.forward = _forward  # type: ignore[method-assign]
        _swap_users += 1
    _tracing.depth = getattr(_tracing, "depth", 0) + 1
    try:
        yield
    finally:
        _tracing.depth -= 1
        with _swap_lock:
            _swap_users -= 1
            if _swap_users == 0:
                _BATCH_NORM.forward = _ORIGINAL_FORWARD  # type: ignore[method-assign]


def cumulative_batch_norm(flat_fn: Callable[..., Any]) -> Callable[..., Any]:
    """``flat_fn`` traced with BatchNorm's cumulative moving average as tensor ops (See
    Note [BatchNorm's cumulative moving average])."""

    @functools.wraps(flat_fn)
    def traced(*args: Any) -> Any:
        with _swapped_forward():
            return flat_fn(*args)

    return traced

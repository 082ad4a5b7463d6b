"""Ambient (thread-local and global) state that changes what a trace produces.

# Note [Ambient state in the compile key]
# A graph records what the function did under the state in force while it was traced: a
# matmul traced under ``torch.autocast("cpu", dtype=torch.bfloat16)`` is a bf16 matmul in
# the graph, whatever the state when the graph runs later. So every piece of ambient state
# that changes the trace is part of the compile key (Note [Compile cache keys]), read on
# every call by ambient_key():
#   * grad mode (decides inference vs training) and inference mode;
#   * autocast: whether any device type has it on and, if so, per device type its
#     enabled flag and dtype, plus the autocast cache flag;
#   * torch.are_deterministic_algorithms_enabled() and its warn_only flag (decompositions
#     and some kernels choose other ops under it);
#   * the default dtype (factory calls such as ``torch.zeros(3)`` and Python scalars);
#   * whether __torch_function__ is enabled (torch._C.DisableTorchFunction);
#   * aotkit's functionalized-RNG switch (it changes which random ops the graph holds);
#   * with grad mode on, functorch's ``backward_pass_autocast`` setting (the autocast
#     state the backward is traced under: See Note [Autocast in the backward trace]);
#   * the innermost saved-tensors hooks when they are GraphModules, by identity, with
#     functorch's ``saved_tensors_hooks_filtering_mode``: the graphs inline them (See Note
#     [Inlined saved-tensors hooks]). Other hooks run at call time and are not part of it.
# This is the part of dynamo's GlobalStateGuard that changes an ATen trace. The rest of
# that guard (TF32 / reduced-precision-reduction flags, matmul precision, thread count)
# only changes kernels a backend picks at run time, not the traced graph. cudnn/mkldnn
# flags do not change the trace either: convolutions are traced as aten.convolution
# whatever the backend choice.
# Per-call cost: a handful of C calls, about 0.3 us in all (the functorch setting is read
# from its context variable, not through the config module: See _autocast._setting_reader);
# the autocast details are read only
# when some autocast is on (one C call tells). aot_module_simplified keeps no cache: its
# caller (dynamo) guards this state with its GlobalStateGuard.
"""

from __future__ import annotations

from typing import Any

import torch
from aotkit_schemas import functionalize_rng_enabled
from aotkit_tracing import backward_autocast_key

from aotkit_capture._saved_tensor_hooks import saved_tensors_hooks_key

_C: Any = torch._C
_AUTOCAST_DEVICES = tuple(
    d
    for d in ("cpu", "cuda", "xpu", "mps", "hpu", "xla", "ipu", "mtia", "maia", "privateuseone")
    if getattr(_C, "_is_autocast_available", lambda _d: True)(d)
)


def _autocast_state() -> tuple[Any, ...]:
    return (
        _C.is_autocast_cache_enabled(),
        *((d, _C.is_autocast_enabled(d), _C.get_autocast_dtype(d)) for d in _AUTOCAST_DEVICES),
    )


# what each entry of ambient_key() is, in words (the recompile log: See Note [Recompile
# reasons]); keep in step with ambient_key()
AMBIENT_FIELDS = (
    "grad mode",
    "inference mode",
    "autocast",
    "deterministic algorithms",
    "deterministic algorithms' warn_only",
    "default dtype",
    "__torch_function__",
    "functionalized RNG",
    "backward_pass_autocast",
    "inlined saved tensors hooks",
)


def ambient_key() -> tuple[Any, ...]:
    """The ambient state of Note [Ambient state in the compile key], as a hashable tuple."""
    return (
        _C.is_grad_enabled(),
        _C.is_inference_mode_enabled(),
        _autocast_state() if _C._is_any_autocast_enabled() else None,
        _C._get_deterministic_algorithms(),
        _C._get_deterministic_algorithms_warn_only(),
        torch.get_default_dtype(),
        _C._is_torch_function_enabled(),
        functionalize_rng_enabled(),
        backward_autocast_key(),
        saved_tensors_hooks_key(),
    )

"""AOTConfig: the user's choices for one aot_function / aot_module call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._protocols import DecompositionTable


@dataclass(frozen=True)
class AOTConfig:
    """Configuration of one AOT compilation; mirrors torch's AOTConfig field for field."""

    fw_compiler: Callable[..., Any]
    bw_compiler: Callable[..., Any]
    partition_fn: Callable[..., Any]
    decompositions: DecompositionTable
    # the first num_params_buffers flat inputs are parameters and buffers
    num_params_buffers: int
    aot_id: int
    keep_inference_input_mutations: bool
    is_export: bool = False
    no_tangents: bool = False
    dynamic_shapes: bool = False
    aot_autograd_arg_pos_to_source: Sequence[Any] | None = None
    static_input_indices: Sequence[int] | None = None
    inference_compiler: Callable[..., Any] | None = None
    enable_log: bool = True
    pre_dispatch: bool = False
    # trace with in-place ops left in the graphs (See Note [Tracing without
    # functionalization] in aotkit_capture)
    disable_functionalization: bool = False
    cache_key: str | None = None
    # See Note [Joint graph passes]: ``pass(joint, joint_inputs) -> joint``, run before
    # partitioning (torch's functorch config ``joint_custom_pass`` is honoured too)
    joint_pass: Callable[..., Any] | None = None
    # See Note [Graph descriptors]: one AOTInput per flat input (None: PlainAOTInput(i))
    input_descs: Sequence[Any] | None = None
    # free-form notes a frontend wants to carry (e.g. dynamo metadata)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_params_buffers < 0:
            raise ValueError("num_params_buffers must be >= 0")


# Note [Joint graph passes]
# A joint pass is ``pass(joint_gm, joint_inputs) -> joint_gm``, torch's functorch config
# ``joint_custom_pass``: it sees the joint graph (with its descriptors, See Note [Graph
# descriptors]) after the trace and before the partitioner, and what it returns is what
# is partitioned and compiled. ``AOTConfig.joint_pass`` comes first, then torch's config;
# both run when both are set. A pass that returns anything but a GraphModule raises
# JointPassError. The on-disk cache keys each pass by its cache key
# (``aotkit_schemas.mark_cache_key``); a pass without one turns the disk cache off for
# that compilation (logged), so a changed pass is never served a stale entry.


class JointPassError(TypeError):
    """A joint graph pass returned something other than a GraphModule."""


def active_joint_passes(cfg: AOTConfig) -> list[Callable[..., Any]]:
    """The joint passes of ``cfg``: its own, then torch's ``joint_custom_pass``."""
    import torch._functorch.config as functorch_config

    passes = [cfg.joint_pass] if cfg.joint_pass is not None else []
    custom = getattr(functorch_config, "joint_custom_pass", None)
    if callable(custom):
        passes.append(custom)
    return passes

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
    # free-form notes a frontend wants to carry (e.g. dynamo metadata)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_params_buffers < 0:
            raise ValueError("num_params_buffers must be >= 0")

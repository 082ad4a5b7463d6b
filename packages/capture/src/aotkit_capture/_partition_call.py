"""Calling the partition function with what torch's AOTAutograd hands it."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from aotkit_schemas import AOTConfig, ViewAndMutationMeta

# Note [Static-lifetime inputs reach the partitioner]
# torch's AOTAutograd calls ``partition_fn(joint, joint_inputs, num_fwd_outputs=...,
# static_lifetime_input_indices=...)``: the positions, among the joint's primals, of the
# inputs that outlive the call (under torch.compile, dynamo marks the parameters and
# buffers static). A partitioner may save such an input for free: torch's min-cut then
# saves a Linear's weight and recomputes its transposes in the backward rather than saving
# ``t(t(weight))``. aotkit passes the same positions (the caller's static inputs, shifted
# past the effect tokens that lead the primals, as torch shifts them). With a tensor
# subclass layer the primals are the subclasses' inner tensors, whose positions differ from
# the caller's; there aotkit passes none (saving a parameter then costs its bytes).


def partition_joint(
    cfg: AOTConfig,
    joint: torch.fx.GraphModule,
    joint_inputs: Any,
    num_fwd_outputs: int,
    meta: ViewAndMutationMeta,
    subclasses: object | None,
) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """``cfg.partition_fn`` on the joint, called as torch calls it (``subclasses``: the
    tensor subclass layer, if any). See Note [Static-lifetime inputs reach the partitioner]."""
    n_tok = len(meta.tokens)
    static = None if subclasses is not None else [i + n_tok for i in meta.static_input_indices]
    fw, bw = cfg.partition_fn(
        joint,
        joint_inputs,
        num_fwd_outputs=num_fwd_outputs,
        static_lifetime_input_indices=static,
    )
    return fw, bw


def partition_fn_name(cfg: AOTConfig) -> str:
    """The partition function's name, for the logs."""
    fn = cfg.partition_fn
    return str(getattr(fn, "__name__", None) or type(fn).__name__)

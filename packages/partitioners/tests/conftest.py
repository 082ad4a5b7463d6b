from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._functorch.aot_autograd import aot_function
from torch._functorch.partitioners import default_partition as torch_default_partition

AotJoint = tuple[torch.fx.GraphModule, Any, int]


def _capture(fn: Callable[..., Any], *args: torch.Tensor) -> AotJoint:
    """The joint graph torch's aot_function builds for ``fn`` (the oracle's view)."""
    got: dict[str, Any] = {}

    def partition(gm: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        got["joint"] = (copy.deepcopy(gm), joint_inputs, kwargs["num_fwd_outputs"])
        return torch_default_partition(gm, joint_inputs, **kwargs)

    compiled = aot_function(fn, fw_compiler=lambda gm, _: gm, partition_fn=partition)
    compiled(*args)
    joint: AotJoint = got["joint"]
    return joint


@pytest.fixture
def capture_aot_joint() -> Callable[..., AotJoint]:
    return _capture

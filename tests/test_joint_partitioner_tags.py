"""The joint graph's ``partitioner_tag`` node meta, compared with torch's joint graph.

See Note [Forward and backward tags]: torch tags the primal placeholders ``is_forward``
and the tangent placeholders ``is_backward``, as it does the forward's and backward's
nodes. Each program is compiled by torch's and aotkit's aot_function with a partition_fn
that records the joint graph it receives, on each of aotkit's joint paths.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aotkit
import pytest
import torch
from functorch.compile import aot_function as torch_aot_function
from functorch.compile import nop as torch_nop
from torch._functorch.partitioners import default_partition as torch_default_partition

Tags = dict[str, tuple[str, Any]]
# the joint's node names can differ from torch's on a two-pass path (``mul_1`` for
# ``mul``); the partitioned graphs are renamed to torch's. Nodes are matched by position.


def _recorder(store: list[Tags], partition: Callable[..., Any]) -> Callable[..., Any]:
    def partition_fn(joint: torch.fx.GraphModule, inputs: Any, **kwargs: Any) -> Any:
        store.append({
            n.name if n.op == "placeholder" else f"{i}:{n.op}:{n.target}": (
                n.op, n.meta.get("partitioner_tag")
            )
            for i, n in enumerate(joint.graph.nodes)
        })
        return partition(joint, inputs, **kwargs)

    return partition_fn


def _two_outputs(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (x.sin() * y).sum(), x.cos()


def _mutates_input(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    y.mul_(2)
    return x * y


def _returns_input(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x, x * y  # a forward whose first output is its input


PROGRAMS = {"two_outputs": _two_outputs, "mutates_input": _mutates_input,
            "returns_input": _returns_input}
# aotkit's joint paths (See Note [Why a graph took the path it took]): the single pass,
# the two-pass native functionalization (dynamic shapes take it), and no functionalization
PATHS = {
    "single_pass": {},
    "dynamic": {"dynamic": True},
    "no_functionalization": {"disable_functionalization": True},
}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("program", list(PROGRAMS))
def test_joint_placeholders_are_tagged_as_torchs(program: str, path: str) -> None:
    fn = PROGRAMS[program]
    if path == "no_functionalization" and program == "mutates_input":
        pytest.skip("torch rejects an input mutation without functionalization")
    kwargs = PATHS[path]
    theirs: list[Tags] = []
    ours: list[Tags] = []

    def inputs() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(3, requires_grad=True), torch.randn(3)

    torch_aot_function(
        fn, torch_nop, partition_fn=_recorder(theirs, torch_default_partition), **kwargs
    )(*inputs())
    compiled = aotkit.aot_function(
        fn, aotkit.nop, partition_fn=_recorder(ours, aotkit.default_partition), **kwargs
    )
    compiled(*inputs())
    assert len(theirs) == len(ours) == 1
    placeholders = {k: v for k, v in theirs[0].items() if v[0] == "placeholder"}
    assert placeholders and any(k.startswith("tangents") for k in placeholders)
    assert {k: v for k, v in ours[0].items() if v[0] == "placeholder"} == placeholders
    if path != "dynamic":
        # and every other node carries torch's tag (same op at the same position). Under
        # dynamic shapes the joint's order of size reads differs from torch's (sym_size
        # before or after the backward's first op): the partitioned graphs are compared
        # in test_default_partition_fidelity.py; only the placeholders are compared here.
        assert ours[0] == theirs[0]

"""What a partition costs: bytes saved, nodes recomputed, graph sizes."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx
from aotkit_schemas import PartitionResult, graph_outputs

from ._cost import node_bytes, node_flops
from ._joint import analyze_joint

_COMPUTE_OPS = ("call_function", "call_method", "call_module")


@dataclass(frozen=True)
class PartitionReport:
    """A summary of one forward/backward split, for logs, tests and benchmarks.

    Sizes use ``meta['val']`` with symbolic sizes replaced by their hints.
    """

    num_fwd_outputs: int
    # (name, bytes) per saved tensor, in forward-output order
    saved_tensors: tuple[tuple[str, int], ...]
    saved_symint_names: tuple[str, ...]
    # forward nodes the backward computes again, in backward order
    recomputed_node_names: tuple[str, ...]
    # length = len(recomputed_node_names)
    recomputed_flops: tuple[int, ...]
    # call_function/call_method/call_module nodes of each graph
    num_fw_nodes: int
    num_bw_nodes: int
    # the same count for the joint graph, when it was given
    num_joint_nodes: int | None = None

    def __post_init__(self) -> None:
        if len(self.recomputed_flops) != len(self.recomputed_node_names):
            raise ValueError("recomputed_flops must have one entry per recomputed node")

    @property
    def saved_bytes(self) -> int:
        return sum(b for _, b in self.saved_tensors)

    @property
    def num_saved_tensors(self) -> int:
        return len(self.saved_tensors)

    @property
    def recompute_flops(self) -> int:
        return sum(self.recomputed_flops)

    def format(self) -> str:
        """A few human-readable lines."""
        joint = f" (joint {self.num_joint_nodes})" if self.num_joint_nodes is not None else ""
        return (
            f"saved {self.num_saved_tensors} tensors ({self.saved_bytes / 2**20:.2f} MiB) "
            f"+ {len(self.saved_symint_names)} symints; "
            f"recomputed {len(self.recomputed_node_names)} nodes "
            f"({self.recompute_flops:.3g} FLOPs); "
            f"forward {self.num_fw_nodes} / backward {self.num_bw_nodes} nodes{joint}"
        )

    def partition_result(
        self, fw_module: torch.fx.GraphModule, bw_module: torch.fx.GraphModule
    ) -> PartitionResult:
        """The runtime's view of the same split, including the recomputed nodes."""
        return PartitionResult.from_modules(
            fw_module, bw_module, self.num_fwd_outputs, self.recomputed_node_names
        )


def _count(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op in _COMPUTE_OPS)


def partition_report(
    fw_module: torch.fx.GraphModule,
    bw_module: torch.fx.GraphModule,
    num_fwd_outputs: int,
    joint: torch.fx.GraphModule | None = None,
) -> PartitionReport:
    """Describe a forward/backward pair that follows Note [Joint graph calling convention].

    A backward node is *recomputed* when the forward graph computes a node of the same name
    (names are the joint graph's). With ``joint``, only nodes that are forward work in the
    joint graph (ancestors of its forward returns) count, and its size is reported too.
    """
    result = PartitionResult.from_modules(fw_module, bw_module, num_fwd_outputs)
    fw_nodes = {n.name: n for n in fw_module.graph.nodes}
    saved = graph_outputs(fw_module)[num_fwd_outputs:]
    tensors = tuple((v.name, node_bytes(v)) for v in saved[: result.num_saved_tensors])
    forward_work: set[str] | None = None
    num_joint = None
    if joint is not None:
        info = analyze_joint(joint, num_fwd_outputs)
        forward_work = {n.name for n in info.fw_required}
        num_joint = _count(joint)
    recomputed = [
        n
        for n in bw_module.graph.nodes
        if n.op in _COMPUTE_OPS
        and n.name in fw_nodes
        and fw_nodes[n.name].op in _COMPUTE_OPS
        and (forward_work is None or n.name in forward_work)
    ]
    return PartitionReport(
        num_fwd_outputs=num_fwd_outputs,
        saved_tensors=tensors,
        saved_symint_names=result.saved_symint_names,
        recomputed_node_names=tuple(n.name for n in recomputed),
        recomputed_flops=tuple(node_flops(n) for n in recomputed),
        num_fw_nodes=_count(fw_module),
        num_bw_nodes=_count(bw_module),
        num_joint_nodes=num_joint,
    )

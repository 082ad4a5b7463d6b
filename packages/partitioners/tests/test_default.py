from __future__ import annotations

import torch
import torch.nn.functional as F
from aotkit_partitioners import default_partition
from aotkit_partitioners._tracing import make_joint, run_joint, run_partition
from aotkit_schemas import PartitionResult, graph_outputs


def _mlp(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, w, b)).sum(1)


def test_names_and_convention() -> None:
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    b = torch.randn(8)
    j = make_joint(_mlp, (x, w, b))
    fw, bw = default_partition(j.gm, j.inputs, num_fwd_outputs=1)
    res = PartitionResult.from_modules(fw, bw, 1)
    fw_inputs = [p.name for p in fw.graph.find_nodes(op="placeholder")]
    assert fw_inputs == ["primals_1", "primals_2", "primals_3"]
    bw_inputs = [p.name for p in bw.graph.find_nodes(op="placeholder")]
    assert bw_inputs == [*res.saved_symint_names, *res.saved_tensor_names, "tangents_1"]
    assert graph_outputs(bw)[-1] is None
    for node in fw.graph.nodes:
        if node.op == "call_function":
            assert "val" in node.meta
    got = run_partition(fw, bw, 1, j.inputs, 3)
    want = run_joint(j)
    assert got[-1] is None and want[-1] is None
    torch.testing.assert_close(got[:-1], want[:-1])


def test_symint_saved_instead_of_tensor() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.sum() * y

    x, y = torch.randn(5, 3, requires_grad=True), torch.randn(2, requires_grad=True)
    j = make_joint(f, (x, y), tracing_mode="symbolic")
    fw, bw = default_partition(j.gm, j.inputs, num_fwd_outputs=1)
    res = PartitionResult.from_modules(fw, bw, 1)
    assert "primals_1" not in res.saved_tensor_names
    assert res.saved_symint_names
    torch.testing.assert_close(run_partition(fw, bw, 1, j.inputs, 2), run_joint(j))

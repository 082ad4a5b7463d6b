"""Saved sizes and forward returns under dynamic shapes, against torch's partitioners.

torch's ``aot_function(dynamic=True)`` builds the joint graphs here (the oracle's view);
both partitioners split the same graph. See Note [Saving sizes] and Note [Min-cut flow
graph].
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, cast

import pytest
import torch
import torch.nn.functional as F
from aotkit_partitioners import (
    default_partition,
    min_cut_rematerialization_partition,
    partition_report,
)
from aotkit_partitioners._tracing import TracedJoint, run_partition
from aotkit_schemas import PartitionResult, graph_outputs, is_sym_node
from torch._functorch.aot_autograd import aot_function
from torch._functorch.compilers import default_decompositions
from torch._functorch.partitioners import default_partition as torch_default
from torch._functorch.partitioners import (
    min_cut_rematerialization_partition as torch_min_cut,
)
from torch.fx.experimental.proxy_tensor import make_fx

Joint = tuple[torch.fx.GraphModule, Any, int]


def _capture_dynamic(fn: Callable[..., Any], *args: torch.Tensor) -> Joint:
    got: dict[str, Joint] = {}

    def partition(gm: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        got["joint"] = (copy.deepcopy(gm), joint_inputs, kwargs["num_fwd_outputs"])
        return torch_default(gm, joint_inputs, **kwargs)

    compiled = aot_function(
        fn,
        fw_compiler=lambda gm, _: gm,
        bw_compiler=lambda gm, _: gm,
        partition_fn=partition,
        # torch's tests use these; the module rebinds the name from a set to a dict
        decompositions=cast("dict[Any, Any]", default_decompositions),
        dynamic=True,
    )
    compiled(*[a.detach().requires_grad_() for a in args])
    return got["joint"]


def _signature(
    fw: torch.fx.GraphModule, bw: torch.fx.GraphModule
) -> tuple[list[str], list[str], str]:
    """Forward return names, backward input names, and which forward returns are sizes."""
    outs = graph_outputs(fw)
    kinds = "".join("S" if isinstance(o, torch.fx.Node) and is_sym_node(o) else "T" for o in outs)
    return (
        [str(o) for o in outs],
        [p.name for p in bw.graph.find_nodes(op="placeholder")],
        kinds,
    )


def _split(partition: Callable[..., Any], joint: Joint) -> tuple[Any, Any]:
    gm, joint_inputs, n = joint
    return partition(copy.deepcopy(gm), joint_inputs, num_fwd_outputs=n)  # type: ignore[no-any-return]


# torch's TestPartitioning::test_*_partitioner_output_tensor_shape_tensor
def _shape_outputs(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> Any:
    sb = b.size()
    x = sb[0] + c.size()[0]
    cat = torch.cat([a.expand((x, a.size(0))), b, c])
    mm = torch.mm(cat, d)
    mm2 = torch.mm(mm, a.view(mm.size(1), a.size(0)))
    return cat, sb, c, mm2


def _shape_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(10), torch.randn(3, 10), torch.randn(2, 10), torch.randn(10, 1))


def _cat_mm(b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> Any:
    return torch.mm(torch.cat([b, c]), d), b.size()


def _returned_size(x: torch.Tensor) -> Any:
    return x.sin().sum() * x.shape[0], x.shape[1]


def _flatten_mm(x: torch.Tensor, y: torch.Tensor) -> Any:
    z = x.view(-1, x.shape[-1]) @ y
    return z.relu().reshape(x.shape[0], -1), x.shape


def _factory(x: torch.Tensor) -> Any:
    return x.sum() * x.new_ones(x.shape[0] * 2)


def _norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Any:
    return F.layer_norm(x, x.shape[-1:], w, b).softmax(-1) @ w.unsqueeze(-1)


def _gelu_mm(x: torch.Tensor, w: torch.Tensor) -> Any:
    return F.gelu(x @ w).sin().sum(1), x.shape[0]


def _views(x: torch.Tensor) -> Any:
    return x.view(x.shape[0], -1).cos().t().contiguous()


def _split_halves(x: torch.Tensor, y: torch.Tensor) -> Any:
    a, b = torch.split(x, x.shape[0] // 2)
    return (a * y).tanh() + b, a.shape


def _cat_self(x: torch.Tensor) -> Any:
    return torch.cat([x, x * 2], 1).relu().mean(0), x.size()


CASES: dict[str, tuple[Callable[..., Any], Callable[[], tuple[torch.Tensor, ...]]]] = {
    "shape_outputs": (_shape_outputs, _shape_inputs),
    "cat_mm": (_cat_mm, lambda: (torch.randn(3, 10), torch.randn(2, 10), torch.randn(10, 4))),
    "returned_size": (_returned_size, lambda: (torch.randn(4, 5),)),
    "flatten_mm": (_flatten_mm, lambda: (torch.randn(2, 3, 4), torch.randn(4, 6))),
    "factory": (_factory, lambda: (torch.randn(4, 5),)),
    "norm": (_norm, lambda: (torch.randn(4, 8), torch.randn(8), torch.randn(8))),
    "gelu_mm": (_gelu_mm, lambda: (torch.randn(4, 8), torch.randn(8, 8))),
    "views": (_views, lambda: (torch.randn(3, 4, 5),)),
    "split_halves": (_split_halves, lambda: (torch.randn(6, 3), torch.randn(3, 3))),
    "cat_self": (_cat_self, lambda: (torch.randn(4, 3),)),
}


@pytest.fixture(scope="module")
def joints() -> dict[str, Joint]:
    torch.manual_seed(0)
    return {name: _capture_dynamic(fn, *make()) for name, (fn, make) in CASES.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_default_matches_torch(joints: dict[str, Joint], case: str) -> None:
    """Same forward returns and backward inputs, by name and in order, as torch's."""
    joint = joints[case]
    assert _signature(*_split(default_partition, joint)) == _signature(
        *_split(torch_default, joint)
    )


def test_default_shape_tensor_counts(joints: dict[str, Joint]) -> None:
    # torch's test: 5 user returns (b.size() is two sizes), 4 tensors and 4 sizes saved;
    # the backward does its own slice-bound arithmetic on those sizes.
    fw, bw = _split(default_partition, joints["shape_outputs"])
    outs, bw_inputs, kinds = _signature(fw, bw)
    assert kinds == "TSSTT" + "T" * 4 + "S" * 4
    assert len(bw_inputs) == 10
    assert not any(n.target is torch.ops.aten.t.default for n in fw.graph.nodes)


def _flat(out: Any) -> list[Any]:
    items = out if isinstance(out, (tuple, list)) else (out,)
    return [v for o in items for v in (o if isinstance(o, (tuple, list)) else (o,))]


def _eager(
    fn: Callable[..., Any], primals: list[torch.Tensor], tangents: list[torch.Tensor]
) -> list[Any]:
    """fn's returns (sizes as ints) and its input gradients, by eager autograd."""
    primals = [p.detach().requires_grad_() for p in primals]
    with torch.enable_grad():
        outs = _flat(fn(*primals))
        diff = [o for o in outs if isinstance(o, torch.Tensor)]
        grads = torch.autograd.grad(diff, primals, tangents, allow_unused=True)
    return [o.detach() if isinstance(o, torch.Tensor) else o for o in outs] + list(grads)


def _untagged_joint(fn: Callable[..., Any], primals: list[torch.Tensor]) -> TracedJoint:
    """``joint(primals, tangents)`` traced by make_fx, without partitioner tags; unlike
    ``make_joint`` it lets ``fn`` return sizes (they get no tangent)."""
    primals = [p.detach().requires_grad_() for p in primals]
    with torch.enable_grad():
        example = [o for o in _flat(fn(*primals)) if isinstance(o, torch.Tensor)]
    tangents = [torch.randn_like(o) for o in example]

    def joint(primals: list[torch.Tensor], tangents: list[torch.Tensor]) -> tuple[Any, ...]:
        outs = _flat(fn(*primals))
        diff = [o for o in outs if isinstance(o, torch.Tensor)]
        return (*outs, *torch.autograd.grad(diff, primals, tangents, allow_unused=True))

    gm = make_fx(joint, tracing_mode="symbolic")(primals, tangents)
    n = len(_flat(fn(*primals)))
    return TracedJoint(gm, (*primals, *tangents), n, (True,) * len(primals))


def _check_runs(
    fw: torch.fx.GraphModule, bw: torch.fx.GraphModule, traced: TracedJoint, fn: Callable[..., Any]
) -> None:
    """The pair reproduces eager autograd at the traced sizes and at other sizes."""
    n, k = traced.num_fwd_outputs, len(traced.requires_grad)
    other = [torch.randn(7), torch.randn(4, 7), torch.randn(5, 7), torch.randn(7, 1)]
    for primals in (list(traced.primals), other):
        outs = [o for o in _flat(fn(*primals)) if isinstance(o, torch.Tensor)]
        tangents = [torch.randn_like(o) for o in outs]
        got = run_partition(fw, bw, n, [*primals, *tangents], k)
        torch.testing.assert_close(got, _eager(fn, primals, tangents))


def test_default_untagged_joint() -> None:
    """A joint without partitioner tags, whose returned size the tracer emits only once the
    backward has started."""
    traced = _untagged_joint(_shape_outputs, list(_shape_inputs()))
    n = traced.num_fwd_outputs
    nodes = list(traced.gm.graph.nodes)
    returned_size = graph_outputs(traced.gm)[2]
    first_backward = next(
        i
        for i, node in enumerate(nodes)
        if any(a.name.startswith("tangents") for a in node.args if isinstance(a, torch.fx.Node))
    )
    assert is_sym_node(returned_size) and nodes.index(returned_size) > first_backward
    fw, bw = default_partition(traced.gm, traced.inputs, num_fwd_outputs=n)
    # the late returned size does not pull the backward's t() and size arithmetic forward
    assert not any(node.target is torch.ops.aten.t.default for node in fw.graph.nodes)
    assert _signature(fw, bw)[2] == "TSSTT" + "T" * 4 + "S" * 4
    res = PartitionResult.from_modules(fw, bw, n)
    assert res.saved_tensor_names == ("primals_4", "cat", "mm", "view")
    _check_runs(fw, bw, traced, _shape_outputs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_min_cut_never_more_bytes_and_same_convention(joints: dict[str, Joint], case: str) -> None:
    joint = joints[case]
    n = joint[2]
    ours, theirs = _split(min_cut_rematerialization_partition, joint), _split(torch_min_cut, joint)
    ours_bytes = partition_report(*ours, n).saved_bytes
    theirs_bytes = partition_report(*theirs, n).saved_bytes
    assert ours_bytes <= theirs_bytes
    if ours_bytes == theirs_bytes:
        # the same number of saved tensors and sizes, in the same places
        assert _signature(*ours)[2] == _signature(*theirs)[2]
    if case not in ("shape_outputs", "returned_size"):
        assert _signature(*ours) == _signature(*theirs)


def test_min_cut_sizes_handed_over(joints: dict[str, Joint]) -> None:
    # x.sin().sum() * x.shape[0], x.shape[1]: the backward needs both sizes and cos(x).
    # Like torch we hand over the sizes the forward read (rather than asking a saved tensor
    # again) and save as many bytes; torch saves x and recomputes cos(x), we save cos(x),
    # the value nearest its backward reader.
    joint = joints["returned_size"]
    ours, theirs = _split(min_cut_rematerialization_partition, joint), _split(torch_min_cut, joint)
    assert _signature(*ours)[2] == _signature(*theirs)[2] == "TSTSS"
    n = joint[2]
    assert partition_report(*ours, n).saved_bytes == partition_report(*theirs, n).saved_bytes


def test_min_cut_sizes_do_not_buy_recomputation(joints: dict[str, Joint]) -> None:
    # cat([b, c]) read by a backward mm: saving t(cat) or b and c costs the same bytes; the
    # backward slices the gradient by b's and c's sizes. A size is not a byte: the cat is not
    # recomputed in the backward just to spare two sizes.
    fw, bw = _split(min_cut_rematerialization_partition, joints["cat_mm"])
    res = PartitionResult.from_modules(fw, bw, joints["cat_mm"][2])
    assert res.saved_tensor_names == ("t", "t_1")
    assert len(res.saved_symint_names) == 2
    assert not any(n.target is torch.ops.aten.cat.default for n in bw.graph.nodes)


def test_min_cut_shape_tensor_matches_torch(joints: dict[str, Joint]) -> None:
    # cat([expand(a), b, c]) is read by a backward mm (through t): recomputing it in the
    # backward would materialize it there anyway, so, as torch's min-cut (its default
    # ban_recompute_materialized_backward), the cat is not recomputed and t(cat) is saved,
    # not a, b and c (See Note [Values the backward must materialize]). This is torch's
    # TestPartitioning::test_min_cut_partitioner_output_tensor_shape_tensor: 4 tensors and
    # 3 sizes saved, the same ones.
    joint = joints["shape_outputs"]
    n = joint[2]
    ours, theirs = _split(min_cut_rematerialization_partition, joint), _split(torch_min_cut, joint)
    assert partition_report(*ours, n).saved_bytes == partition_report(*theirs, n).saved_bytes
    res = PartitionResult.from_modules(*ours, n)
    ref = PartitionResult.from_modules(*theirs, n)
    assert res.saved_tensor_names == ref.saved_tensor_names == ("t", "t_1", "t_2", "t_3")
    assert res.saved_symint_names == ref.saved_symint_names
    assert not any(node.target is torch.ops.aten.cat.default for node in ours[1].graph.nodes)
    traced = _untagged_joint(_shape_outputs, list(_shape_inputs()))
    fw, bw = min_cut_rematerialization_partition(
        traced.gm, traced.inputs, num_fwd_outputs=traced.num_fwd_outputs
    )
    _check_runs(fw, bw, traced, _shape_outputs)

from __future__ import annotations

import copy
import operator
from typing import Any

import pytest
import torch
import torch._functorch.config as functorch_config
import torch.nn.functional as F
from aotkit_partitioners import (
    cse,
    default_partition,
    min_cut_rematerialization_partition,
    partition_report,
)
from aotkit_partitioners._corpus import traced_case
from aotkit_partitioners._far_apart import FAR_APART
from aotkit_partitioners._mincut import build_problem, prepare_joint
from aotkit_partitioners._tracing import make_joint, run_joint, run_partition
from torch._functorch.partitioners import (
    min_cut_rematerialization_partition as torch_min_cut,
)

aten = torch.ops.aten


def _saved_bytes(joint: torch.fx.GraphModule, n: int, *, ours: bool) -> int:
    gm = joint if ours else copy.deepcopy(joint)
    part = min_cut_rematerialization_partition if ours else torch_min_cut
    fw, bw = part(gm, None, num_fwd_outputs=n)
    return partition_report(fw, bw, n).saved_bytes


@pytest.mark.parametrize("case", ["mlp", "pointwise_chain", "norms", "conv_bn", "two_outputs"])
def test_never_saves_more_than_torch(case: str) -> None:
    traced = traced_case(case)
    ours = _saved_bytes(traced.gm, traced.num_fwd_outputs, ours=True)
    theirs = _saved_bytes(traced.gm, traced.num_fwd_outputs, ours=False)
    assert ours <= theirs


def _chain(x: torch.Tensor) -> torch.Tensor:
    for _ in range(24):
        x = F.gelu(x) * x.sigmoid() + x.cos()
    return x


def test_recomputes_pointwise_chain_from_input(capture_aot_joint: Any) -> None:
    joint, joint_inputs, n = capture_aot_joint(_chain, torch.randn(16, 16, requires_grad=True))
    fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, num_fwd_outputs=n)
    report = partition_report(fw, bw, n, joint=joint)
    assert [name for name, _ in report.saved_tensors] == ["primals_1"]
    assert report.recomputed_node_names
    # torch's "long fusible chain" heuristic bans recomputing deep chains and saves more
    assert report.saved_bytes < _saved_bytes(joint, n, ours=False)


def _targets(gm: torch.fx.GraphModule) -> list[object]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_never_recomputes_matmul_random_or_reduction() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = F.dropout((x @ w).relu(), 0.3, training=True)
        s = h.sum(1, keepdim=True)  # 8x smaller than h
        return (s.exp() * x).cos()

    x, w = torch.randn(8, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    traced = make_joint(f, (x, w))
    fw, bw = min_cut_rematerialization_partition(traced.gm, traced.inputs, num_fwd_outputs=1)
    report = partition_report(fw, bw, 1, joint=traced.gm)
    fw_by_name = {n.name: n for n in fw.graph.nodes}
    for name in report.recomputed_node_names:
        node = fw_by_name[name]
        assert node.target not in (aten.mm.default, aten.sum.dim_IntList)
        assert torch.Tag.nondeterministic_seeded not in getattr(node.target, "tags", ())
    torch.manual_seed(0)
    want = run_joint(traced)
    torch.manual_seed(0)
    got = run_partition(fw, bw, 1, traced.inputs, 2)
    torch.testing.assert_close(got, want)


def test_symint_saved_not_tensor() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.sum() * y

    x, y = torch.randn(5, 3, requires_grad=True), torch.randn(2, requires_grad=True)
    traced = make_joint(f, (x, y), tracing_mode="symbolic")
    fw, bw = min_cut_rematerialization_partition(traced.gm, traced.inputs, num_fwd_outputs=1)
    report = partition_report(fw, bw, 1)
    assert "primals_1" not in dict(report.saved_tensors)
    assert report.saved_symint_names


def test_cse_merges_duplicates_and_is_pure() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin() + x.sin() * torch.rand_like(x) + torch.rand_like(x)

    traced = make_joint(f, (torch.randn(4, requires_grad=True),))
    code = traced.gm.code
    out = cse(traced.gm)
    assert traced.gm.code == code

    def count(gm: torch.fx.GraphModule, op: object) -> int:
        return sum(1 for t in _targets(gm) if t == op)

    assert count(traced.gm, aten.sin.default) == 2 and count(out, aten.sin.default) == 1
    assert count(out, aten.rand_like.default) == count(traced.gm, aten.rand_like.default) == 2
    names = {n.name for n in out.graph.nodes}
    assert names <= {n.name for n in traced.gm.graph.nodes}


def test_cse_merges_within_mutation_regions_only() -> None:
    # See Note [CSE across mutations]: a graph that copies into an input (batch norm's
    # running statistics) is still CSE'd, but never across the copy
    graph = torch.fx.Graph()
    buf, x = graph.placeholder("buf"), graph.placeholder("x")
    before = graph.call_function(aten.add.Tensor, (buf, 1))
    c1 = graph.call_function(aten.mul.Tensor, (x, 2))
    c2 = graph.call_function(aten.mul.Tensor, (x, 2))
    graph.call_function(aten.copy_.default, (buf, c1))
    after = graph.call_function(aten.add.Tensor, (buf, 1))
    f1 = graph.call_function(aten.full.default, ([], 0.0), {"dtype": torch.float32})
    f2 = graph.call_function(aten.full.default, ([], 0.0), {"dtype": torch.float32})
    add = aten.add.Tensor
    outs = [(before, c2), (after, f1), (after, f2)]
    graph.output(tuple(graph.call_function(add, pair) for pair in outs))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    out = cse(gm)
    counts: dict[object, int] = {}
    for t in _targets(out):
        counts[t] = counts.get(t, 0) + 1
    assert counts[aten.mul.Tensor] == 1  # merged: same region
    assert counts[aten.full.default] == 1  # merged: same region, after the copy
    # reads of buf before and after its copy_ (2), the outputs (3: never merged)
    assert counts[aten.add.Tensor] == 5
    assert counts[aten.copy_.default] == 1
    b, xv = torch.zeros(3), torch.arange(3.0)
    want = gm(b.clone(), xv)
    got = out(b.clone(), xv)
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w)


def test_cse_keeps_identical_outputs_apart() -> None:
    # See Note [CSE keeps outputs apart]: eager returns two tensors, not one twice
    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.sin(), x.sin(), torch.zeros(3) + 0, torch.zeros(3) + 0, x.cos() * 2

    traced = make_joint(f, (torch.randn(3, requires_grad=True),), tracing_mode="real")
    out = cse(traced.gm)
    fwd = torch.utils._pytree.tree_leaves(out.graph.find_nodes(op="output")[0].args[0])[:5]
    assert len(set(fwd)) == 5, fwd
    want, got = run_joint(traced), out(*traced.inputs)  # cse's copy takes flat arguments
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w)


def test_flow_problem_bans() -> None:
    info = prepare_joint(traced_case("conv_bn").gm, 1)
    problem = build_problem(info)
    reasons = {n.target: r for n, r in problem.banned.items() if n.op == "call_function"}
    assert reasons[aten.convolution.default] == "compute intensive"
    assert all(r is not None for n, r in problem.banned.items() if n.op == "placeholder")
    assert not any(n.target is operator.getitem for n in problem.banned)


def test_input_mutated_by_epilogue_is_never_saved() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x.sin() * w).sum()

    traced = make_joint(f, (torch.randn(6, requires_grad=True), torch.randn(6, requires_grad=True)))
    fw, bw = min_cut_rematerialization_partition(traced.gm, traced.inputs, num_fwd_outputs=1)
    assert "primals_1" in dict(partition_report(fw, bw, 1).saved_tensors)
    marked = copy.deepcopy(traced.gm)
    marked.graph.find_nodes(op="placeholder")[0].meta["aot_runtime_epilogue_input_mutation"] = True
    fw, bw = min_cut_rematerialization_partition(marked, traced.inputs, num_fwd_outputs=1)
    assert "primals_1" not in dict(partition_report(fw, bw, 1).saved_tensors)
    torch.testing.assert_close(run_partition(fw, bw, 1, traced.inputs, 2), run_joint(traced))


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_module_constants_read_by_backward(mode: str) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * torch.tensor([1.0, 2.0, 3.0])).sin().sum()

    traced = make_joint(f, (torch.randn(3, requires_grad=True),), tracing_mode=mode)  # type: ignore[arg-type]
    for part in (min_cut_rematerialization_partition, default_partition):
        fw, bw = part(traced.gm, traced.inputs, num_fwd_outputs=1)
        torch.testing.assert_close(run_partition(fw, bw, 1, traced.inputs, 1), run_joint(traced))


def test_attention_with_dropout_is_banned_as_compute_intensive() -> None:
    # a random op (by its nondeterministic_seeded tag, whatever its dropout_p) that is
    # compute-heavy is not replayed from a saved RNG state (See Note
    # [Recomputation policy]); cheap random ops (dropout) stay replayable
    from aotkit_partitioners._ops import ban_reason
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(q: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        attn = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q, 0.0)[0]
        return attn, torch.ops.aten.native_dropout(x, 0.5, True)[0]

    gm = make_fx(f)(torch.randn(1, 2, 8, 4), torch.randn(8))
    by_name = {str(n.target): n for n in gm.graph.nodes if n.op == "call_function"}
    sdpa = by_name["aten._scaled_dot_product_flash_attention_for_cpu.default"]
    dropout = by_name["aten.native_dropout.default"]
    assert ban_reason(sdpa, False, functional_rng=True) == "compute intensive"
    assert ban_reason(dropout, False, functional_rng=True) is None


def _gelu_mlp(
    x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor
) -> torch.Tensor:
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2)


def _decomposed_joint(fn: Any, *args: torch.Tensor) -> tuple[torch.fx.GraphModule, Any, int]:
    """torch's joint graph of ``fn`` with ``gelu_backward`` decomposed, as Inductor's table does."""
    from torch._decomp import get_decompositions
    from torch._functorch.aot_autograd import aot_function
    from torch._functorch.partitioners import default_partition as torch_default

    got: dict[str, Any] = {}

    def partition(gm: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        got["joint"] = (copy.deepcopy(gm), joint_inputs, kwargs["num_fwd_outputs"])
        return torch_default(gm, joint_inputs, **kwargs)

    compiled = aot_function(
        fn,
        fw_compiler=lambda gm, _: gm,
        partition_fn=partition,
        decompositions=get_decompositions([aten.gelu_backward]),  # type: ignore[arg-type]
    )
    compiled(*args)
    joint: tuple[torch.fx.GraphModule, Any, int] = got["joint"]
    return joint


def _op_counts(gm: torch.fx.GraphModule) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in _targets(gm):
        counts[str(t)] = counts.get(str(t), 0) + 1
    return counts


def test_backward_only_values_are_recomputed_from_the_forward_value_as_torch() -> None:
    # See Note [Distance to the backward]: the decomposed GELU derivative (erf, exp, muls)
    # reads only the linear's output; saving that output or the derivative costs the same
    # bytes, and torch saves the output and computes the derivative in the backward
    # (Inductor then compiles a smaller forward). Both graphs match torch's op for op.
    args = [torch.randn(8, 16), torch.randn(32, 16), torch.randn(32), torch.randn(4, 32)]
    for a in args[1:]:
        a.requires_grad_(True)
    joint, joint_inputs, n = _decomposed_joint(_gelu_mlp, *args)
    fw, bw = min_cut_rematerialization_partition(
        copy.deepcopy(joint), joint_inputs, num_fwd_outputs=n
    )
    tfw, tbw = torch_min_cut(copy.deepcopy(joint), joint_inputs, num_fwd_outputs=n)
    assert aten.exp.default not in _targets(fw)
    assert _op_counts(fw) == _op_counts(tfw)
    assert _op_counts(bw) == _op_counts(tbw)
    assert partition_report(fw, bw, n).saved_bytes == partition_report(tfw, tbw, n).saved_bytes


def _read_far_apart(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    a = x.sin()  # read by ``cos`` (before the matmul) and by the ``add`` after it
    c = a + torch.mm(a.cos(), w)
    return c * c


@pytest.mark.parametrize("far", [False, True])
def test_does_not_recompute_readers_after_a_kernel_boundary(
    capture_aot_joint: Any, far: bool
) -> None:
    # See Note [Values read far apart]: ``add`` reads ``sin`` after the ``mm`` boundary. By
    # bytes alone the cut saves the matmul's output (written by the forward anyway) and
    # recomputes ``add = sin(x) + mm`` in the backward; with the rule ``add`` is saved.
    joint, joint_inputs, n = capture_aot_joint(
        _read_far_apart,
        torch.randn(4, 8, requires_grad=True),
        torch.randn(8, 8, requires_grad=True),
    )
    info = prepare_joint(joint, n)
    problem = build_problem(info, ban_far_apart=far)
    far_banned = {k.name for k, v in problem.banned.items() if v == FAR_APART}
    assert far_banned == ({"add"} if far else set())
    fw, bw = min_cut_rematerialization_partition(
        joint, joint_inputs, num_fwd_outputs=n, ban_recompute_used_far_apart=far
    )
    report = partition_report(fw, bw, n, joint=joint)
    want = ["primals_1", "add" if far else "mm", "t", "t_1"]
    assert [name for name, _ in report.saved_tensors] == want
    assert report.saved_bytes == 640
    assert ("add" in report.recomputed_node_names) is not far
    # torch's min-cut makes the same choice with its rule on and off
    with functorch_config.patch(ban_recompute_used_far_apart=far):
        tfw, tbw = torch_min_cut(copy.deepcopy(joint), joint_inputs, num_fwd_outputs=n)
    theirs = partition_report(tfw, tbw, n, joint=joint)
    assert [name for name, _ in theirs.saved_tensors] == want
    # the pair still computes the joint's outputs and gradients
    args = [torch.randn(4, 8), torch.randn(8, 8), torch.randn(4, 8)]
    want_out = torch.utils._pytree.tree_leaves(joint(args[:2], args[2:]))
    torch.testing.assert_close(run_partition(fw, bw, n, args, 2), want_out)


def test_far_apart_rule_on_a_residual_stream(capture_aot_joint: Any) -> None:
    # three residual blocks with a hand-written LayerNorm: the rule bans the residual sums
    # read after the next block's matmul (the last one is a forward output, never cut)
    def ln(x: torch.Tensor) -> torch.Tensor:
        d = x - x.mean(-1, keepdim=True)
        return d * torch.rsqrt((d * d).mean(-1, keepdim=True) + 1e-5)

    def f(x: torch.Tensor, *ws: torch.Tensor) -> torch.Tensor:
        x = x.sin()
        for w in ws:
            x = x + torch.mm(ln(x), w)
        return x

    ws = [torch.randn(8, 8, requires_grad=True) for _ in range(3)]
    joint, joint_inputs, n = capture_aot_joint(f, torch.randn(4, 8, requires_grad=True), *ws)
    info = prepare_joint(joint, n)
    banned = build_problem(info, ban_far_apart=True).banned
    assert sorted(k.name for k, v in banned.items() if v == FAR_APART) == ["add_1", "add_3"]
    saved = {}
    for far in (False, True):
        fw, bw = min_cut_rematerialization_partition(
            joint, joint_inputs, num_fwd_outputs=n, ban_recompute_used_far_apart=far
        )
        saved[far] = [name for name, _ in partition_report(fw, bw, n).saved_tensors]
    # without the rule the matmul outputs are saved and the residual sums recomputed; with
    # it each LayerNorm's centred input is saved instead (as torch does)
    assert saved[False] == [
        "primals_1", "mean", "rsqrt", "mm", "mean_2", "rsqrt_1", "mm_1", "mean_4", "rsqrt_2",
        "t", "t_1", "t_2", "t_3", "t_4", "t_5",
    ]  # fmt: skip
    assert saved[True] == [
        "primals_1", "mean", "rsqrt", "sub_1", "rsqrt_1", "sub_2", "rsqrt_2",
        "t", "t_1", "t_2", "t_3", "t_4", "t_5",
    ]  # fmt: skip

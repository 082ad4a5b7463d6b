"""A conformance kit for partitioners (needs pytest: the ``testing`` extra).

Subclass ``PartitionerConformance`` in a test module, supply a ``partitioner`` fixture, and
every check runs against your partitioner on the joint graphs of ``aotkit_partitioners``'s
corpus::

    import pytest
    from .testing import PartitionerConformance

    class TestMyPartitioner(PartitionerConformance):
        @pytest.fixture
        def partitioner(self):
            return my_partition

A partitioner follows Note [Joint graph calling convention] (``aotkit_schemas``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch.fx
from aotkit_schemas import Partitioner, PartitionResult, graph_outputs

from ._corpus import CASES, JointCase, traced_case
from ._joint import analyze_joint, has_side_effect, is_tangent
from ._tracing import TracedJoint, make_joint, run_joint, run_partition

__all__ = [
    "CASES",
    "JointCase",
    "PartitionerConformance",
    "TracedJoint",
    "make_joint",
    "run_joint",
    "run_partition",
]

_SEED = 1234
_RTOL = 1e-4
_ATOL = 1e-5


def _real_inputs(case: JointCase, traced: TracedJoint, *, resized: bool) -> list[Any]:
    """Fresh real primals and tangents for a case (detached, so no autograd graph)."""
    factory = case.resized_inputs if resized and case.resized_inputs else case.inputs
    primals = [p.detach() if isinstance(p, torch.Tensor) else p for p in factory(1)]
    outs = case.fn(*primals)
    outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
    g = torch.Generator().manual_seed(7)
    tangents = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outs]
    assert len(tangents) == len(traced.tangents)
    return [*primals, *tangents]


def _snapshot(gm: torch.fx.GraphModule) -> list[tuple[Any, ...]]:
    return [
        (
            n.name,
            n.op,
            str(n.target),
            str(n.args),
            str(n.kwargs),
            tuple(sorted((k, id(v)) for k, v in n.meta.items())),
            tuple(u.name for u in n.users),
        )
        for n in gm.graph.nodes
    ]


def _assert_same(got: Sequence[Any], want: Sequence[Any]) -> None:
    assert len(got) == len(want), f"{len(got)} values, the joint graph returns {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if w is None or g is None:
            assert g is None and w is None, f"output {i}: {g!r} where the joint returns {w!r}"
            continue
        torch.testing.assert_close(
            g,
            w,
            rtol=_RTOL,
            atol=_ATOL,
            msg=lambda m, i=i: f"output {i}: {m}",  # type: ignore[misc]
        )


def _split(
    partitioner: Partitioner, traced: TracedJoint
) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    return partitioner(traced.gm, traced.inputs, num_fwd_outputs=traced.num_fwd_outputs)


class PartitionerConformance:
    """Checks every partitioner must pass. Subclasses provide a ``partitioner`` fixture."""

    @pytest.fixture
    def partitioner(self) -> Partitioner:
        raise NotImplementedError("subclasses provide a `partitioner` fixture")

    @pytest.mark.parametrize("case", list(CASES))
    def test_reproduces_joint_outputs_and_gradients(
        self, partitioner: Partitioner, case: str
    ) -> None:
        traced = traced_case(case)
        fw, bw = _split(partitioner, traced)
        inputs = _real_inputs(CASES[case], traced, resized=False)
        torch.manual_seed(_SEED)
        want = run_joint(traced, inputs)
        torch.manual_seed(_SEED)
        got = run_partition(fw, bw, traced.num_fwd_outputs, inputs, len(traced.requires_grad))
        _assert_same(got, want)

    @pytest.mark.parametrize("case", list(CASES))
    def test_calling_convention(self, partitioner: Partitioner, case: str) -> None:
        traced = traced_case(case)
        n = traced.num_fwd_outputs
        fw, bw = _split(partitioner, traced)
        joint_inputs = traced.gm.graph.find_nodes(op="placeholder")
        primal_names = [p.name for p in joint_inputs if not is_tangent(p)]
        tangent_names = [p.name for p in joint_inputs if is_tangent(p)]
        result = PartitionResult.from_modules(fw, bw, n)
        assert [p.name for p in fw.graph.find_nodes(op="placeholder")] == primal_names
        assert [p.name for p in bw.graph.find_nodes(op="placeholder")] == [
            *result.saved_symint_names,
            *result.saved_tensor_names,
            *tangent_names,
        ]
        joint_grads = graph_outputs(traced.gm)[n:]
        bw_grads = graph_outputs(bw)
        assert len(bw_grads) == len(joint_grads)
        assert [g is None for g in bw_grads] == [g is None for g in joint_grads]
        joint_nodes = {node.name: node for node in traced.gm.graph.nodes}
        for gm in (fw, bw):
            for node in gm.graph.nodes:
                source = joint_nodes.get(node.name)
                if node.op != "output" and source is not None and "val" in source.meta:
                    assert "val" in node.meta, f"{node.name} lost meta['val']"

    @pytest.mark.parametrize("case", list(CASES))
    def test_saved_values_are_forward_outputs(self, partitioner: Partitioner, case: str) -> None:
        traced = traced_case(case)
        n = traced.num_fwd_outputs
        fw, bw = _split(partitioner, traced)
        fw_nodes = {node.name: node for node in fw.graph.nodes}
        saved = graph_outputs(fw)[n:]
        for value in saved:
            assert isinstance(value, torch.fx.Node), f"saved value {value!r} is not a node"
            assert fw_nodes.get(value.name) is value, f"{value.name} is not a forward node"
        bw_saved = [p for p in bw.graph.find_nodes(op="placeholder") if not is_tangent(p)]
        assert [p.name for p in bw_saved] == [
            *[v.name for v in saved if not isinstance(v.meta.get("val"), torch.Tensor)],
            *[v.name for v in saved if isinstance(v.meta.get("val"), torch.Tensor)],
        ]

    @pytest.mark.parametrize("case", list(CASES))
    def test_joint_graph_not_modified(self, partitioner: Partitioner, case: str) -> None:
        case_def = CASES[case]
        traced = make_joint(case_def.fn, case_def.inputs(0), tracing_mode=case_def.tracing_mode)
        before, code = _snapshot(traced.gm), traced.gm.code
        _split(partitioner, traced)
        assert traced.gm.code == code
        assert _snapshot(traced.gm) == before

    @pytest.mark.parametrize("case", list(CASES))
    def test_graphs_hold_no_dead_code(self, partitioner: Partitioner, case: str) -> None:
        fw, bw = _split(partitioner, traced_case(case))
        for gm in (fw, bw):
            gm.graph.lint()
            for node in gm.graph.nodes:
                if node.op in ("call_function", "call_method", "call_module"):
                    assert node.users or has_side_effect(node), f"dead node {node.name}"

    def test_symbolic_joint(self, partitioner: Partitioner) -> None:
        case = CASES["symbolic"]
        traced = traced_case("symbolic")
        fw, bw = _split(partitioner, traced)
        result = PartitionResult.from_modules(fw, bw, traced.num_fwd_outputs)
        info = analyze_joint(traced.gm, traced.num_fwd_outputs)
        assert len(info.primals) == len(traced.requires_grad)
        for resized in (False, True):
            inputs = _real_inputs(case, traced, resized=resized)
            fw_out = fw(*inputs[: len(traced.requires_grad)])
            n_sym = result.num_saved_symints
            for value in fw_out[len(fw_out) - n_sym :]:
                assert isinstance(value, int), f"saved symint is {type(value).__name__}"
            want = run_joint(traced, inputs)
            got = run_partition(fw, bw, traced.num_fwd_outputs, inputs, len(traced.requires_grad))
            _assert_same(got, want)

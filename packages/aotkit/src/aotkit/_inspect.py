"""What aotkit makes of a function or module: one capture, every partitioner's split of
the same joint graph, and their summaries (printed by ``aotkit.inspect``).

# Note [Inspecting a compilation]
# ``capture`` compiles the user's function or module once with ``nop`` compilers and a
# recording partitioner that keeps a copy of the joint graph it was handed (with the joint
# inputs and the number of forward outputs). Every partitioner is then run on its own copy
# of that joint graph, so that partitioners are compared on exactly the same graph, and each
# split is summarised with ``aotkit_partitioners.partition_report`` (the report the
# ``partition`` logger prints). A function whose inputs need no gradient is traced for
# inference only: there is no joint graph and no partition to show.
#
# The recorder runs inside the compilation, where the trace's fake mode is active. A joint
# graph may hold real tensor constants (transformers' GPT-2 records empty tensors built in
# its forward as ``_tensor_constant`` attributes); deep-copying one of them under the fake
# mode makes a fake tensor and then fails to give it the real tensor's storage. Every copy
# of the joint graph (``copy_graph_module``) is therefore made with the fake mode unset:
# the real constants are copied as real tensors, and the fake values in the nodes' meta as
# fake tensors of their own mode.
#
# A module's forward nodes carry ``nn_module_stack`` as under dynamo: while it is traced,
# global forward hooks put the running submodule's path into fx's current node meta, which
# make_fx copies onto each node it records (``fx.traceback.preserve_node_meta``). Backward
# nodes are recorded by autograd, outside any module: ``module_of`` gives each the module
# of its first input that has one (a gradient formula reads the saved values of the
# forward op it differentiates), which is what the partition picture aggregates by.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
import torch.nn as nn
from aotkit_backends import nop
from aotkit_frontends import aot_function, aot_module
from aotkit_partitioners import (
    PartitionReport,
    default_partition,
    get_partitioner,
    partition_report,
)
from aotkit_schemas import (
    AOTInput,
    MutationType,
    OutputType,
    ViewAndMutationMeta,
    grouped_input_lines,
    input_name,
)


@dataclass
class PartitionOutcome:
    """One partitioner's split of the joint graph (or why it failed)."""

    name: str
    report: PartitionReport | None = None
    fw_module: torch.fx.GraphModule | None = None
    bw_module: torch.fx.GraphModule | None = None
    error: str | None = None


@dataclass
class Capture:
    """The graphs of one compilation. See Note [Inspecting a compilation]."""

    meta: ViewAndMutationMeta
    joint: torch.fx.GraphModule | None
    joint_inputs: Sequence[Any]
    num_fwd_outputs: int
    inference: torch.fx.GraphModule | None
    # names of the parameters and buffers, in primals order (modules only)
    state_names: tuple[str, ...] = ()
    outcomes: dict[str, PartitionOutcome] = field(default_factory=dict)

    @property
    def input_descs(self) -> list[AOTInput | None]:
        """The descriptor of each compiled input (See Note [Inputs named by their
        descriptors] in aotkit_schemas): the joint's or the inference graph's."""
        gm = self.joint if self.joint is not None else self.inference
        if gm is None:
            return [None] * len(self.meta.input_info)
        phs = [n for n in gm.graph.nodes if n.op == "placeholder"][len(self.meta.tokens):]
        return [n.meta.get("desc") for n in phs[: len(self.meta.input_info)]]

    def partition(self, name: str, partitioner: Callable[..., Any] | None = None) -> PartitionOutcome:
        """Split a copy of the joint graph with ``partitioner`` (default: the one registered
        under ``name``) and remember the outcome under ``name``."""
        if self.joint is None:
            raise ValueError("nothing to partition: the function was traced for inference only")
        fn = partitioner if partitioner is not None else get_partitioner(name)
        outcome = PartitionOutcome(name)
        try:
            fw, bw = fn(
                copy_graph_module(self.joint), self.joint_inputs, num_fwd_outputs=self.num_fwd_outputs
            )
            outcome.fw_module, outcome.bw_module = fw, bw
            outcome.report = partition_report(fw, bw, self.num_fwd_outputs, self.joint)
        except Exception as e:  # a third-party partitioner may fail on this graph
            outcome.error = f"{type(e).__name__}: {e}"
        self.outcomes[name] = outcome
        return outcome


def copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A deep copy of ``gm``, made outside any active fake mode. See Note [Inspecting a
    compilation]."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return copy.deepcopy(gm)


@contextlib.contextmanager
def _record_module_stack(root: nn.Module) -> Iterator[None]:
    """Put each running submodule of ``root`` on fx's current ``nn_module_stack``. See
    Note [Inspecting a compilation]."""
    paths = {id(m): (name, type(m).__qualname__) for name, m in root.named_modules()}
    stack: list[tuple[str, str]] = []

    def publish() -> None:
        fx_traceback.current_meta["nn_module_stack"] = {
            path or "L__self__": (path, typ) for path, typ in stack
        }

    def pre(module: nn.Module, args: Any) -> None:
        entry = paths.get(id(module))
        if entry is not None:
            stack.append(entry)
            publish()

    def post(module: nn.Module, args: Any, output: Any) -> None:
        if id(module) in paths and stack:
            stack.pop()
            publish()

    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
    try:
        with fx_traceback.preserve_node_meta():
            yield
    finally:
        for h in handles:
            h.remove()


def module_of(joint: torch.fx.GraphModule, state_names: Sequence[str] = ()) -> dict[str, str]:
    """The innermost module path of each node of the joint graph (``""`` for none).

    Forward nodes read their ``nn_module_stack``. A backward node is attributed, in this
    order, to the module owning a parameter it reads (``state_names[i]`` is the name of
    ``primals_{i+1}``), to the last module that consumed a forward value it reads (the
    gradient of an op reads that op's inputs), to the module of its most recent input so
    attributed, or else to the module of its most recent input.
    See Note [Inspecting a compilation]."""
    found: dict[str, str] = {}
    consumer: dict[str, str] = {}
    order = {node.name: i for i, node in enumerate(joint.graph.nodes)}
    for node in joint.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            found[node.name] = path = list(stack.values())[-1][0]
            for arg in node.all_input_nodes:
                consumer[arg.name] = path  # the last forward consumer wins
    owners = {
        f"primals_{i + 1}": name.rpartition(".")[0] for i, name in enumerate(state_names)
    }
    # the placeholders' descriptors name them exactly (tied parameters are passed once,
    # which shifts the primals): See Note [Inputs named by their descriptors]
    described = {
        n.name: n.meta["desc"].target.rpartition(".")[0]
        for n in joint.graph.nodes
        if n.op == "placeholder" and hasattr(n.meta.get("desc"), "target")
    }
    if described:
        owners = described
    # anchored: labelled from the forward or a parameter, not only from gradient flow
    anchored = set(found)
    for node in joint.graph.nodes:
        if node.name in found:
            continue
        inputs = node.all_input_nodes
        label = next((owners[a.name] for a in inputs if a.name in owners), None)
        if label is None:
            label = next((consumer[a.name] for a in inputs if a.name in consumer), None)
        # the most recently computed input first: gradients flow forward in time
        recent = sorted(inputs, key=lambda a: order[a.name], reverse=True)
        if label is None:
            label = next((found[a.name] for a in recent if a.name in anchored), None)
        if label is not None:
            anchored.add(node.name)
        else:
            label = next((found[a.name] for a in recent if found.get(a.name)), "")
        found[node.name] = label
    return found


def capture(fn_or_module: Callable[..., Any], *args: Any) -> Capture:
    """Compile ``fn_or_module(*args)`` once and keep its graphs. See Note [Inspecting a
    compilation]. The compiled forward runs once, as a call would (a module's buffers, such
    as BatchNorm's running statistics, are updated as by ``model(*args)``)."""
    recorded: dict[str, Any] = {}

    def recorder(
        joint: torch.fx.GraphModule, joint_inputs: Sequence[Any], *, num_fwd_outputs: int,
        **kwargs: Any,
    ) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
        recorded.update(
            joint=copy_graph_module(joint), inputs=list(joint_inputs), n=num_fwd_outputs
        )
        return default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)

    state_names: tuple[str, ...] = ()
    if isinstance(fn_or_module, nn.Module):
        state_names = tuple(
            [n for n, _ in fn_or_module.named_parameters(remove_duplicate=False)]
            + [n for n, _ in fn_or_module.named_buffers(remove_duplicate=False)]
        )
        compiled: Any = aot_module(fn_or_module, nop, partition_fn=recorder)
        cache = compiled._compiled._aotkit_cache
    else:
        compiled = aot_function(fn_or_module, nop, partition_fn=recorder)
        cache = compiled._aotkit_cache
    recording = (
        _record_module_stack(fn_or_module) if isinstance(fn_or_module, nn.Module)
        else contextlib.nullcontext()
    )
    with torch.enable_grad(), recording:
        compiled(*args)
    artifacts = cache.artifacts[-1]
    return Capture(
        meta=artifacts.meta,
        joint=recorded.get("joint"),
        joint_inputs=recorded.get("inputs", ()),
        num_fwd_outputs=recorded.get("n", 0),
        inference=artifacts.inference_module,
        state_names=state_names,
    )


def metadata_summary(
    meta: ViewAndMutationMeta, descs: Sequence[AOTInput | None] | None = None
) -> str:
    """Mutations and aliases of the inputs and outputs, in words; inputs named by their
    descriptors ``descs`` (See Note [Inputs named by their descriptors])."""
    named = list(descs or ())
    named += [None] * (len(meta.input_info) - len(named))
    facts: list[tuple[int, AOTInput | None, str]] = []
    lines = [
        f"{len(meta.input_info)} inputs, {len(meta.output_info)} outputs; "
        f"{'training (joint forward+backward)' if meta.is_train else 'inference only'}"
    ]
    for i, info in enumerate(meta.input_info):
        what = []
        if info.mutates_data:
            what.append("data mutated")
        if info.mutates_metadata:
            what.append("metadata mutated (e.g. resize_/transpose_)")
        if info.mutations_hidden_from_autograd:
            what.append("mutation hidden from autograd")
        if info.mutation_type is MutationType.MUTATED_IN_GRAPH:
            what.append("mutation kept in the graph")
        if what:
            facts.append((i, named[i], ", ".join(what)))
    lines += grouped_input_lines(facts)
    for i, out in enumerate(meta.output_info):
        if out.output_type is OutputType.non_alias:
            continue
        base = ""
        if out.base_idx is not None:
            is_input = out.output_type in (OutputType.alias_of_input, OutputType.is_input)
            base = (f" (base: {input_name(named[out.base_idx], out.base_idx)})" if is_input
                    else f" (base: input {out.base_idx})")
        lines.append(f"  output {i}: {out.output_type.name.replace('_', ' ')}{base}")
    if len(lines) == 1:
        lines.append("  no input is mutated and no output aliases an input or another output")
    return "\n".join(lines)


def _graph_text(gm: torch.fx.GraphModule, title: str) -> str:
    code = gm.print_readable(print_output=False, include_stride=True, include_device=True)
    return f"===== {title} =====\n{code}"


def report_table(outcomes: Sequence[PartitionOutcome]) -> str:
    """One row per partitioner: saved tensors and bytes, recomputed nodes and FLOPs, node
    counts."""
    head = ("partitioner", "saved", "saved MiB", "recomputed", "recompute FLOPs", "fw nodes",
            "bw nodes")
    rows = [head]
    for o in outcomes:
        r = o.report
        if r is None:
            rows.append((o.name, "failed", o.error or "", "", "", "", ""))
            continue
        rows.append((
            o.name, str(r.num_saved_tensors), f"{r.saved_bytes / 2**20:.3f}",
            str(len(r.recomputed_node_names)), f"{r.recompute_flops:.3g}",
            str(r.num_fw_nodes), str(r.num_bw_nodes),
        ))
    widths = [max(len(row[c]) for row in rows) for c in range(len(head))]
    return "\n".join(
        "  ".join(cell.ljust(w) if c == 0 else cell.rjust(w) for c, (cell, w) in
                  enumerate(zip(row, widths, strict=True))).rstrip()
        for row in rows
    )

"""Descriptors on the graphs aotkit builds (See Note [Graph descriptors] in aotkit_schemas).

See Note [Where descriptors are attached].
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch.fx
from aotkit_analysis import InputLayout
from aotkit_schemas import (
    AOTConfig,
    AOTInput,
    AOTOutput,
    BackwardTokenAOTInput,
    BackwardTokenAOTOutput,
    DifferentiableAOTInput,
    DifferentiableAOTOutput,
    ForwardTokenAOTInput,
    ForwardTokenAOTOutput,
    GradAOTOutput,
    InputMutationAOTOutput,
    IntermediateBaseAOTOutput,
    JointPassError,
    OutputType,
    PlainAOTInput,
    PlainAOTOutput,
    SavedForBackwardsAOTOutput,
    SyntheticBaseAOTInput,
    TangentAOTInput,
    ViewAndMutationMeta,
    ViewBaseAOTInput,
    active_joint_passes,
)

log = logging.getLogger(__name__)
DESC = "desc"

# Note [Where descriptors are attached]
# torch writes descriptors while it traces; aotkit derives them afterwards from what fixes
# each graph's calling convention (Note [Joint graph calling convention], Note [Forward
# graph calling convention]): the input layout (synthetic bases first, then the inputs
# passed through, duplicates once), the metadata (mutated inputs returned, then user
# outputs, then intermediate bases; the tangents of those that need one) and the effect
# tokens. The user's flat inputs are described by ``AOTConfig.input_descs`` (parameters
# and buffers by FQN for the module entry points) or ``PlainAOTInput(i)``.
# - the joint graph: after the trace, before the joint passes and the partitioner;
# - the forward and backward graphs: placeholders keep the joint placeholder's descriptor
#   by name (the partitioner copies nodes with their meta), the forward's outputs are the
#   joint's forward outputs then ``SavedForBackwardsAOTOutput(i)``, the backward's the
#   joint's gradients (torch leaves the saved values' backward placeholders without one);
# - the inference graph: its placeholders and returns.
# When the counts do not add up, no descriptor is written: a graph has them all, correct,
# or none. Graphs traced through the tensor subclass layer (See Note [Tensor subclasses are
# desugared]) carry none yet: torch's ``SubclassGetAttrAOTInput``/``...AOTOutput`` of the
# inner tensors are not derived, so exporting such a joint raises JointDescriptorError.
# A disk cache hit restores the descriptors stored with the graphs (aotkit_cache).


def user_input_descs(cfg: AOTConfig, n: int) -> list[AOTInput]:
    given = list(cfg.input_descs or ())
    return given[:n] + [PlainAOTInput(i - len(given)) for i in range(len(given), n)]


def compiled_input_descs(layout: InputLayout, user: Sequence[AOTInput]) -> list[AOTInput]:
    """One descriptor per compiled input: the synthetic bases, then the inputs kept."""
    out: list[AOTInput] = []
    for group in layout.synthetic_bases:
        if group.common_view_base_of is not None:
            out.append(ViewBaseAOTInput(user[group.common_view_base_of]))
        else:
            out.append(SyntheticBaseAOTInput(user[group.members[0].user_index]))
    out += [user[i] for _, i in layout.kept_positions()]
    return out


def forward_return_descs(
    meta: ViewAndMutationMeta, inputs: Sequence[AOTInput]
) -> list[AOTOutput]:
    """Mutated inputs, user outputs, intermediate bases (tokens not included)."""
    outs: list[AOTOutput] = [InputMutationAOTOutput(inputs[i]) for i in meta.mutated_inp_runtime_indices]
    outs += [PlainAOTOutput(j) for j in range(len(meta.output_info))]
    bases = [
        IntermediateBaseAOTOutput(PlainAOTOutput(j))
        for j, o in enumerate(meta.output_info)
        if o.output_type is OutputType.alias_of_intermediate_save_as_output
    ]
    if len(bases) != meta.num_intermediate_bases:
        raise _Mismatch("intermediate bases")
    return outs + list(bases)


class _Mismatch(Exception):
    pass


def _placeholders(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _output(gm: torch.fx.GraphModule) -> tuple[torch.fx.Node, list[Any]]:
    node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    args = node.args[0]
    return node, list(args) if isinstance(args, (list, tuple)) else [args]


def _write(gm: torch.fx.GraphModule, ins: Sequence[Any], outs: Sequence[Any], what: str) -> bool:
    phs = _placeholders(gm)
    node, values = _output(gm)
    if len(phs) != len(ins) or len(values) != len(outs):
        log.debug("aotkit: no descriptors on the %s graph (%d/%d inputs, %d/%d outputs)",
                  what, len(phs), len(ins), len(values), len(outs))
        return False
    for ph, d in zip(phs, ins, strict=True):
        ph.meta[DESC] = d
    node.meta[DESC] = list(outs)
    return True


def describe_joint(
    joint: torch.fx.GraphModule, meta: ViewAndMutationMeta, layout: InputLayout, cfg: AOTConfig
) -> bool:
    """Write the joint graph's descriptors; False when its shape is not the one expected."""
    try:
        user = user_input_descs(cfg, layout.num_user_inputs)
        primals = compiled_input_descs(layout, user)
        fw = forward_return_descs(meta, primals)
    except (_Mismatch, IndexError):
        return False
    n_tok, n_btok = len(meta.tokens), meta.num_backward_tokens
    tangents: list[AOTInput] = []
    for i in meta.tangent_indices:
        o = fw[i]
        assert isinstance(o, DifferentiableAOTOutput)
        tangents.append(TangentAOTInput(o))
    ins: list[AOTInput] = [ForwardTokenAOTInput(i) for i in range(n_tok)]
    ins += primals + tangents + [BackwardTokenAOTInput(i) for i in range(n_btok)]
    fw_outs: list[AOTOutput] = [ForwardTokenAOTOutput(i) for i in range(n_tok)] + fw
    grads: list[AOTOutput | None] = []
    for i, d in enumerate(primals):
        needs = meta.input_info[i].requires_grad if i < len(meta.input_info) else False
        grads.append(GradAOTOutput(d) if needs and isinstance(d, DifferentiableAOTInput) else None)
    _, values = _output(joint)
    if len(values) == len(fw_outs) + n_tok + len(grads) + n_btok:
        grads[:0] = [None] * n_tok  # the token primals' (absent) gradients
    outs = fw_outs + grads + [BackwardTokenAOTOutput(i) for i in range(n_btok)]
    return _write(joint, ins, outs, "joint")


def describe_partition(
    joint: torch.fx.GraphModule, fw: torch.fx.GraphModule, bw: torch.fx.GraphModule, n_fwd: int
) -> None:
    """Carry the joint's descriptors to the forward and backward graphs."""
    jnode, _ = _output(joint)
    joint_outs = jnode.meta.get(DESC)
    if joint_outs is None:
        return
    by_name = {n.name: n.meta[DESC] for n in _placeholders(joint) if DESC in n.meta}
    fw_phs, bw_phs = _placeholders(fw), _placeholders(bw)
    if not all(n.name in by_name for n in fw_phs):
        return
    _, fw_values = _output(fw)
    saved = [SavedForBackwardsAOTOutput(i) for i in range(len(fw_values) - n_fwd)]
    _write(fw, [by_name[n.name] for n in fw_phs], list(joint_outs[:n_fwd]) + saved, "forward")
    _write(bw, [by_name.get(n.name) for n in bw_phs], list(joint_outs[n_fwd:]), "backward")


def describe_inference(
    gm: torch.fx.GraphModule, meta: ViewAndMutationMeta, layout: InputLayout, cfg: AOTConfig
) -> None:
    try:
        inputs = compiled_input_descs(layout, user_input_descs(cfg, layout.num_user_inputs))
        outs = forward_return_descs(meta, inputs)
    except (_Mismatch, IndexError):
        return
    n_tok = len(meta.tokens)
    ins: list[AOTInput] = [ForwardTokenAOTInput(i) for i in range(n_tok)] + inputs
    _write(gm, ins, [ForwardTokenAOTOutput(i) for i in range(n_tok)] + outs, "inference")


def run_joint_passes(
    joint: torch.fx.GraphModule, joint_inputs: Any, cfg: AOTConfig
) -> torch.fx.GraphModule:
    """See Note [Joint graph passes] in aotkit_schemas."""
    for joint_pass in active_joint_passes(cfg):
        new = joint_pass(joint, joint_inputs)
        if not isinstance(new, torch.fx.GraphModule):
            raise JointPassError(
                f"the joint graph pass {getattr(joint_pass, '__qualname__', joint_pass)!r} "
                f"returned {type(new).__name__}, not a torch.fx.GraphModule; a joint pass "
                "returns the (possibly edited) joint graph. See Note [Joint graph passes]."
            )
        joint = new
    return joint


def graph_descriptors(gm: torch.fx.GraphModule) -> tuple[list[Any], list[Any]] | str:
    """(placeholder descriptors, output descriptors) of ``gm``, or what lacks one."""
    phs = _placeholders(gm)
    missing = [n.name for n in phs if DESC not in n.meta]
    node, values = _output(gm)
    outs = node.meta.get(DESC)
    if missing or outs is None or len(outs) != len(values):
        what = f"placeholders {', '.join(missing)}" if missing else "the output node"
        return what
    return [n.meta[DESC] for n in phs], list(outs)

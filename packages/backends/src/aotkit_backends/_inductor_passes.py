"""What torch's ``inductor`` backend does around Inductor's compiler, for ``aotkit_inductor``.

# Note [Inductor's graph roles]
# torch's ``inductor`` backend does more than call ``compile_fx_inner`` on each graph:
#   * its partition function first runs Inductor's joint-graph passes on the joint graph
#     (canonicalization, no-op removal, constant folding of uniform values, the pattern
#     matcher's joint patterns such as pointless views and converts, the seeded-random
#     rewrite), then partitions with min-cut; the forward and backward Inductor then
#     compiles are smaller, and the partitioner decides on the simplified graph;
#   * an inference graph (no partition) gets the same passes in its compiler;
#   * each graph is compiled with its role: ``is_inference`` for inference graphs and
#     ``is_backward`` for backward graphs (Inductor's post-grad passes differ by role), the
#     backward's saved-tensor inputs marked static (their addresses are not re-checked for
#     alignment at every call), and the outputs whose strides the caller observes marked
#     user-visible (``user_visible_output_idxs`` on the output node): the forward's
#     non-saved outputs (aotkit's partition step marks them) and every output of an
#     inference or backward graph. Inductor gives user-visible outputs exactly the strides
#     of the trace; it may lay out the others (saved activations) as it likes.
# ``joint_graph_passes`` and ``compile_for_role`` do the same for aotkit_inductor. Inductor
# itself is the compiler, so calling its pass pipeline is using the compiler; no part of
# torch's AOTAutograd is involved.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._guards import detect_fake_mode

GraphRole = Literal["forward", "backward", "inference"]

# aotkit_inductor's partition step marks the forward's non-saved outputs on the forward
# graph's output node under Inductor's own key (See Note [Inductor's graph roles])
USER_VISIBLE_OUTPUTS_KEY = "user_visible_output_idxs"


def joint_graph_passes(gm: torch.fx.GraphModule, example_inputs: Any) -> torch.fx.GraphModule:
    """Run Inductor's joint-graph passes on ``gm`` (a joint or inference graph) in place and
    return it, as torch's ``inductor`` backend does before partitioning. See Note
    [Inductor's graph roles]. ``example_inputs`` (any pytree of fake or real tensors) give
    the fake mode the pattern matcher traces its replacements in, and the device."""
    from torch._inductor.fx_passes.joint_graph import (
        joint_graph_passes as inductor_joint_passes,
    )
    from torch._inductor.virtualized import V

    flat = [x for x in pytree.tree_leaves(example_inputs) if isinstance(x, torch.Tensor)]
    fake_mode = detect_fake_mode(flat) or _fake_mode_of(gm)
    device = flat[0].device if flat else None
    if fake_mode is None:
        out: torch.fx.GraphModule = inductor_joint_passes(gm, device)
        return out
    with V.set_fake_mode(fake_mode):
        out = inductor_joint_passes(gm, device)
    return out


def _fake_mode_of(gm: torch.fx.GraphModule) -> Any:
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    return detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])


def mark_user_visible_outputs(gm: torch.fx.GraphModule, count: int | None = None) -> None:
    """Mark the first ``count`` outputs of ``gm`` (all when None) that are graph values as
    the ones whose strides the caller observes. See Note [Inductor's graph roles]."""
    output = gm.graph.find_nodes(op="output")[0]
    outs = output.args[0]
    if not isinstance(outs, list | tuple):
        return
    n = len(outs) if count is None else min(count, len(outs))
    output.meta[USER_VISIBLE_OUTPUTS_KEY] = [
        i for i in range(n) if isinstance(outs[i], torch.fx.Node)
    ]


def role_kwargs(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], role: GraphRole | None
) -> dict[str, Any]:
    """``compile_fx_inner``'s keyword arguments for a graph of ``role`` (None: none), after
    the role's preparation of ``gm`` (joint passes for an inference graph, user-visible
    outputs). See Note [Inductor's graph roles]."""
    if role is not None and role != "forward":
        # the forward's are marked by the partition step (a graph restored from the disk
        # cache keeps the mark: See Note [User-visible output stamps of cached graphs] in
        # aotkit_capture), or (another partitioner) left unmarked: then no output's
        # strides are pinned
        mark_user_visible_outputs(gm)
    return compile_kwargs_for_role(gm, role)


def compile_kwargs_for_role(gm: torch.fx.GraphModule, role: GraphRole | None) -> dict[str, Any]:
    """``role_kwargs`` without preparing ``gm``: the keyword arguments alone."""
    if role is None:
        return {}
    placeholders = gm.graph.find_nodes(op="placeholder")
    if role != "backward":
        # See Note [Static inputs of aotkit_inductor's graphs]
        static = [i for i, p in enumerate(placeholders) if p.meta.get(STATIC_INPUT_KEY) is True]
        kwargs: dict[str, Any] = {"is_inference": role == "inference"}
        if static:
            kwargs["static_input_idxs"] = static
        return kwargs
    static = [i for i, p in enumerate(placeholders) if not p.name.startswith("tangents")]
    if static != list(range(len(static))):
        static = []  # not the saved-then-tangents layout: check every input's alignment
    # a saved plain user input gets a fresh tensor every call: the partitioner stamps it
    # not static (unstamped saved values stay static, as in torch)
    static = [i for i in static if placeholders[i].meta.get(STATIC_INPUT_KEY, True)]
    return {"is_backward": True, "static_input_idxs": static}


# Note [Static inputs of aotkit_inductor's graphs]
# torch's ``inductor`` backend tells Inductor which graph inputs keep their address from
# call to call (``static_input_idxs``; See Note: [static_input_idxs semantics] in
# torch/_inductor/compile_fx.py): for the forward and inference graphs, the parameters,
# buffers and inputs dynamo marks static (AOTAutograd's ``static_input_indices``); for the
# backward, the saved values (every input before the tangents) except saved plain user
# inputs, which the partitioner stamps ``is_static_input = False``. Inductor skips the
# alignment check and copy of static inputs (GPU) and lets CUDA graphs keep them in place
# instead of copying them into graph-owned memory; the indices are also part of its FX
# graph cache key. aotkit's partitioners stamp every primal placeholder of both graphs with
# ``meta["is_static_input"]`` from the ``static_lifetime_input_indices`` they are given, so
# the forward's static inputs are read off its placeholders. A graph without the stamps
# (another partitioner, an inference graph) passes none: every input is then checked,
# which is always safe; claiming an input static that is not would not be.
STATIC_INPUT_KEY = "is_static_input"

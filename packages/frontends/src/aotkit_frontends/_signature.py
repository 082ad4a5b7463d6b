"""Reading a GraphSignature off an exported graph.

# Note [Exported graph calling convention]
# A graph from aot_export_module takes
#     (*parameters, *buffers, *flat user inputs)
# and returns
#     (*updated inputs, *flat user outputs[, *parameter grads, *user input grads])
# * updated inputs: the new value of every input with a data mutation, in input order
#   (parameters, then buffers, then user inputs, since inputs are ordered that way); the
#   caller copies them back. Metadata mutations are banned in export, and so are parameter
#   mutations in a joint graph; an inference graph may update a parameter (torch's
#   ``parameters_to_mutate``).
# * the gradients exist only in joint graphs: one per parameter that requires grad, then
#   one per user input that requires grad, in input order. There is no tangent input: the
#   backward starts from the scalar loss with a gradient of one.
# Every name in the signature is the name of a placeholder or of a node the output node
# returns, so ``GraphSignature`` can be checked against ``gm.graph`` directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from aotkit_schemas import BackwardSignature, GraphSignature, ViewAndMutationMeta, graph_outputs


def graph_input_names(gm: torch.fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.find_nodes(op="placeholder")]


def graph_output_names(gm: torch.fx.GraphModule) -> list[str]:
    names: list[str] = []
    for i, out in enumerate(graph_outputs(gm)):
        if not isinstance(out, torch.fx.Node):
            raise AssertionError(f"exported graph output {i} is {out!r}, not a graph node")
        names.append(out.name)
    return names


def build_graph_signature(
    gm: torch.fx.GraphModule,
    meta: ViewAndMutationMeta,
    *,
    in_spec: Any,
    out_spec: Any,
    param_names: Sequence[str],
    buffer_names: Sequence[str],
    num_user_outputs: int,
    grad_inputs: Sequence[int] | None,
    loss_index: int | None,
) -> GraphSignature:
    """The signature of a graph that follows Note [Exported graph calling convention].

    ``grad_inputs`` lists, for a joint graph, the flat input indices that receive a
    gradient output (None for an inference graph); ``loss_index`` is the loss's position
    among the user outputs.
    """
    inputs = graph_input_names(gm)
    outputs = graph_output_names(gm)
    # See Note [Effect tokens] in aotkit_tracing: the tokens lead the inputs and outputs
    n_tokens = len(meta.tokens)
    input_tokens, inputs = inputs[:n_tokens], inputs[n_tokens:]
    output_tokens, outputs = outputs[:n_tokens], outputs[n_tokens:]
    n_params, n_buffers = len(param_names), len(buffer_names)
    n_pb = n_params + n_buffers
    fqns = [*param_names, *buffer_names]
    user_inputs = inputs[n_pb:]

    mutated = meta.mutated_inp_runtime_indices
    n_mut = len(mutated)
    parameters_to_mutate: dict[str, str] = {}
    buffers_to_mutate: dict[str, str] = {}
    user_inputs_to_mutate: dict[str, str] = {}
    for out_name, idx in zip(outputs[:n_mut], mutated, strict=True):
        if idx < n_params:
            if grad_inputs is not None:
                raise AssertionError("joint export rejects parameter mutations before this")
            parameters_to_mutate[out_name] = fqns[idx]
        elif idx < n_pb:
            buffers_to_mutate[out_name] = fqns[idx]
        else:
            user_inputs_to_mutate[out_name] = inputs[idx]
    user_outputs = outputs[n_mut : n_mut + num_user_outputs]

    backward: BackwardSignature | None = None
    n_grads = 0
    if grad_inputs is not None:
        assert loss_index is not None
        grad_names = outputs[n_mut + num_user_outputs :]
        n_grads = len(grad_inputs)
        assert len(grad_names) == n_grads, f"{len(grad_names)} gradient outputs for {n_grads} inputs"
        to_params: dict[str, str] = {}
        to_user_inputs: dict[str, str] = {}
        for name, idx in zip(grad_names, grad_inputs, strict=True):
            if idx < n_pb:
                to_params[name] = fqns[idx]
            else:
                to_user_inputs[name] = inputs[idx]
        # torch names outputs[loss_index] here, which is wrong as soon as an input is
        # mutated: the updated inputs come first. See Note [Exported graph calling convention].
        backward = BackwardSignature(
            gradients_to_parameters=to_params,
            gradients_to_user_inputs=to_user_inputs,
            loss_output=user_outputs[loss_index],
        )
    assert len(outputs) == n_mut + num_user_outputs + n_grads, (
        f"exported graph returns {len(outputs)} values, expected {n_mut} updated inputs + "
        f"{num_user_outputs} user outputs + {n_grads} gradients"
    )
    return GraphSignature(
        parameters=list(param_names),
        buffers=list(buffer_names),
        user_inputs=user_inputs,
        user_outputs=user_outputs,
        inputs_to_parameters=dict(zip(inputs[:n_params], param_names, strict=True)),
        inputs_to_buffers=dict(zip(inputs[n_params:n_pb], buffer_names, strict=True)),
        buffers_to_mutate=buffers_to_mutate,
        parameters_to_mutate=parameters_to_mutate,
        user_inputs_to_mutate=user_inputs_to_mutate,
        in_spec=in_spec,
        out_spec=out_spec,
        backward_signature=backward,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )

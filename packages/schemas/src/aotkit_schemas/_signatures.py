"""Signatures of exported graphs: which inputs/outputs are params, buffers, user values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FQN = str
GraphInputName = str
GraphOutputName = str


@dataclass(frozen=True)
class BackwardSignature:
    """What the backward part of an exported joint graph returns.

    gradients_to_parameters: graph output name -> parameter FQN
    gradients_to_user_inputs: graph output name -> graph input name
    loss_output: the graph output name of the loss
    """

    gradients_to_parameters: dict[GraphOutputName, FQN]
    gradients_to_user_inputs: dict[GraphOutputName, GraphInputName]
    loss_output: GraphOutputName


@dataclass(frozen=True)
class GraphSignature:
    """The calling convention of an exported graph, by input and output name.

    Inputs are ``(*parameters, *buffers, *user_inputs)``; outputs are
    ``(*updated inputs, *user outputs[, *param grads, *input grads])``, the updated inputs
    in input order (parameters, buffers, user inputs). Field order matches torch's
    GraphSignature, so the reprs list fields alike. ``parameters_to_mutate`` is only
    non-empty for inference graphs (joint export rejects parameter mutations).
    """

    parameters: list[FQN]
    buffers: list[FQN]
    user_inputs: list[GraphInputName]
    user_outputs: list[GraphOutputName]
    inputs_to_parameters: dict[GraphInputName, FQN]
    inputs_to_buffers: dict[GraphInputName, FQN]
    buffers_to_mutate: dict[GraphOutputName, FQN]
    parameters_to_mutate: dict[GraphOutputName, FQN]
    user_inputs_to_mutate: dict[GraphOutputName, GraphInputName]
    in_spec: Any
    out_spec: Any
    backward_signature: BackwardSignature | None
    input_tokens: list[GraphInputName]
    output_tokens: list[GraphOutputName]

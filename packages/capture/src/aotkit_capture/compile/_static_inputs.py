"""The partitioner's static-lifetime inputs: the joint graph's primals that live as long
as the model, which torch's AOTAutograd hands every partitioner as
``static_lifetime_input_indices`` (saving one for the backward costs no memory)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from aotkit_analysis import InputLayout
from aotkit_schemas import ViewAndMutationMeta


def static_lifetime_indices(
    meta: ViewAndMutationMeta, layout: InputLayout, n_tokens: int
) -> list[int]:
    """The joint graph's primal positions of the inputs that live as long as the model
    (parameters, buffers and the inputs dynamo marks static): torch hands its partitioner
    these as ``static_lifetime_input_indices``; saving one costs no memory. The user
    positions of ``meta.static_input_indices`` mapped through the input layout (a
    synthetic base is never static) and shifted past the leading effect tokens."""
    static = set(meta.static_input_indices)
    if not static:
        return []
    return [n_tokens + c for c, i in layout.kept_positions() if i in static]


def partition_kwargs(partition_fn: Callable[..., Any], static: list[int]) -> dict[str, Any]:
    """``static_lifetime_input_indices=static`` when ``partition_fn`` takes it (torch always
    passes it; a partitioner written without it keeps working with aotkit)."""
    try:
        params = inspect.signature(partition_fn).parameters.values()
    except (TypeError, ValueError):
        return {}
    takes = any(
        p.kind is inspect.Parameter.VAR_KEYWORD
        or (p.name == "static_lifetime_input_indices" and p.kind is not p.POSITIONAL_ONLY)
        for p in params
    )
    return {"static_lifetime_input_indices": static} if takes else {}

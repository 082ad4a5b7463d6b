"""The compilers' artifact keys in an on-disk cache entry (See Note [Compiled-artifact keys]
in aotkit_schemas): stored with each graph, set on the restored graphs, and added to the
entry when a graph's compiler records one after the entry was written (the backward is
compiled at its first call)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import torch.fx
from aotkit_schemas import (
    ARTIFACT_KEY_META,
    ARTIFACT_KEY_PATTERN,
    CacheFormatError,
    PartitionResult,
    on_artifact_key,
)
from aotkit_schemas import artifact_key as recorded_key

from aotkit_cache._files import load as cache_load
from aotkit_cache._files import store as cache_store


class _Compiled(Protocol):
    """A compilation's artifacts or a restored entry: both hold the partition result."""

    @property
    def partition(self) -> PartitionResult | None: ...


log = logging.getLogger(__name__)

FIELD = "artifact_keys"


def compiled_graphs(artifacts: _Compiled) -> dict[str, torch.fx.GraphModule]:
    """The entry's graphs by role: ``fw``/``bw`` or ``inference``."""
    partition = artifacts.partition
    if partition is not None:
        return {"fw": partition.fw_module, "bw": partition.bw_module}
    inference = getattr(artifacts, "inference", None) or getattr(
        artifacts, "inference_module", None
    )
    return {} if inference is None else {"inference": inference}


def artifact_keys_json(graphs: dict[str, torch.fx.GraphModule]) -> dict[str, str]:
    """The keys recorded on ``graphs`` so far."""
    keys = {role: recorded_key(gm) for role, gm in graphs.items()}
    return {role: k for role, k in keys.items() if k is not None}


def apply_artifact_keys(payload: dict[str, Any], graphs: dict[str, torch.fx.GraphModule]) -> None:
    """Set a payload's keys on the restored graphs; CacheFormatError when malformed."""
    keys = payload.get(FIELD, {})
    if not isinstance(keys, dict):
        raise CacheFormatError("bad artifact keys")
    for role, k in keys.items():
        if role not in graphs or not isinstance(k, str) or not ARTIFACT_KEY_PATTERN.fullmatch(k):
            raise CacheFormatError("bad artifact key")
        graphs[role].meta[ARTIFACT_KEY_META] = k


def keep_artifact_keys_current(name: str, graphs: dict[str, torch.fx.GraphModule]) -> None:
    """Rewrite entry ``name`` when a compiler records a key on one of ``graphs`` that the
    entry lacks (a backward compiled after the entry was written, or an artifact compiled
    again after a restored key no longer applied). The entry is read again from disk then,
    not kept in memory meanwhile."""

    def update(role: str, key: str) -> None:
        try:
            payload = cache_load(name)
            keys = None if payload is None else payload.get(FIELD)
            if payload is None or not isinstance(keys, dict) or keys.get(role) == key:
                return
            cache_store(name, {**payload, FIELD: {**keys, role: key}}, counter="artifact_update")
        except Exception as e:  # never an error: See Note [On-disk compile cache]
            log.warning("aotkit cache: could not add an artifact key to %s (%s: %s)",
                        name, type(e).__name__, e)

    def listener(role: str) -> Callable[[str], None]:
        return lambda key: update(role, key)

    for role, gm in graphs.items():
        on_artifact_key(gm, listener(role))

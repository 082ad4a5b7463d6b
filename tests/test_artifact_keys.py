"""Compiled-artifact keys: recorded on graphs, heard by listeners, checked when restored.
See Note [Compiled-artifact keys] in aotkit_schemas."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.fx
from aotkit_cache.entry._artifacts import apply_artifact_keys, artifact_keys_json
from aotkit_schemas import CacheFormatError, artifact_key, on_artifact_key, record_artifact_key


def _gm() -> torch.fx.GraphModule:
    return torch.fx.symbolic_trace(lambda x: x.sin() + 1)


def test_record_and_listen() -> None:
    gm = _gm()
    heard: list[str] = []
    on_artifact_key(gm, heard.append)
    assert artifact_key(gm) is None
    record_artifact_key(gm, "fxgraph/abc/f123")
    record_artifact_key(gm, "fxgraph/abc/f123")  # the same key again: not heard twice
    record_artifact_key(gm, "not a key: spaces/../")  # not a handle: ignored
    assert artifact_key(gm) == "fxgraph/abc/f123" and heard == ["fxgraph/abc/f123"]
    record_artifact_key(gm, "fxgraph/abd/f124")
    assert heard == ["fxgraph/abc/f123", "fxgraph/abd/f124"]
    gm.meta["aotkit_artifact_key"] = "x" * 300  # too long to be a handle
    assert artifact_key(gm) is None


def test_graphs_with_keys_and_listeners_stay_copyable() -> None:
    gm = _gm()
    on_artifact_key(gm, lambda key: None)
    record_artifact_key(gm, "fxgraph/abc/f123")
    x = torch.randn(3)
    for other in (copy.deepcopy(gm), pickle.loads(pickle.dumps(gm))):
        torch.testing.assert_close(other(x), gm(x))


def test_restored_keys_are_checked() -> None:
    fw, bw = _gm(), _gm()
    graphs = {"fw": fw, "bw": bw}
    record_artifact_key(fw, "fxgraph/a/f1")
    assert artifact_keys_json(graphs) == {"fw": "fxgraph/a/f1"}
    restored = {"fw": _gm(), "bw": _gm()}
    apply_artifact_keys({"artifact_keys": {"fw": "fxgraph/a/f1", "bw": "fxgraph/a/f2"}}, restored)
    assert artifact_key(restored["fw"]) == "fxgraph/a/f1"
    assert artifact_key(restored["bw"]) == "fxgraph/a/f2"
    apply_artifact_keys({}, restored)  # an entry without keys: nothing to set
    for bad in ({"inference": "fxgraph/a/f1"}, {"fw": "a b"}, {"fw": 3}, ["fw"]):
        with pytest.raises(CacheFormatError):
            apply_artifact_keys({"artifact_keys": bad}, {"fw": _gm(), "bw": _gm()})

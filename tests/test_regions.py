"""aotkit_regions: repeated blocks shared under torch.compile(backend="aotkit_eager"),
bitwise equal to eager; refusals named; a differing block alone; the switch off."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from aotkit_regions import dedup_regions, min_repeats, record_region_reports, set_dedup_regions


class Block(nn.Module):
    def __init__(self, d: int, kind: str = "plain") -> None:
        super().__init__()
        self.kind = kind
        self.l1, self.l2, self.ln = nn.Linear(d, d), nn.Linear(d, d), nn.LayerNorm(d)
        if kind == "bn":
            self.bn = nn.BatchNorm1d(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.l1(self.ln(x))
        if self.kind == "inplace":
            h.mul_(2)
        h = torch.relu(h)
        if self.kind == "dropout":
            h = F.dropout(h, 0.5, training=True)
        elif self.kind == "bn":
            h = self.bn(h)
        elif self.kind == "nograd":
            with torch.no_grad():
                c = x.mean()
            h = h * c
        out: torch.Tensor = x + self.l2(h)
        return out


class Net(nn.Module):
    def __init__(self, n: int = 4, d: int = 8, kind: str = "plain", odd: int | None = None) -> None:
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList(Block(d, kind) for _ in range(n))
        if odd is not None:  # one block with another width inside
            self.blocks[odd] = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return x.sum()


def _run(model: nn.Module, threshold: int = 3, seed: int = 0):  # type: ignore[no-untyped-def]
    torch._dynamo.reset()
    x = torch.randn(4, 8)
    with record_region_reports() as reports, dedup_regions(threshold):
        torch.manual_seed(seed)
        out = torch.compile(model, backend="aotkit_eager")(x)
        out.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert len(grads) == len(list(model.parameters()))
    model.zero_grad()
    torch.manual_seed(seed)
    expected = model(x)
    expected.backward()
    assert torch.equal(out, expected)
    for g, p in zip(grads, model.parameters(), strict=True):
        assert p.grad is not None and torch.equal(g, p.grad)
    model.zero_grad()
    return reports


def test_repeated_blocks_shared_bitwise() -> None:
    torch.manual_seed(0)
    reports = _run(Net(4))
    (report,) = reports
    (paths,) = report.shared.values()
    assert [p.rsplit(".", 1)[-1] for p in paths] == ["0", "1", "2", "3"]
    (ident,) = report.shared
    assert ident.startswith("aotkit_region_")


def test_region_schema_generated_once_per_distinct_call(monkeypatch: Any) -> None:
    # See Note [Region schemas generated once] in aotkit_regions: torch's autograd rule
    # asks for invoke_subgraph's schema on every training call; six shared blocks, bitwise
    # equal to eager (checked by _run), trace the block for its schema once per distinct
    # call, not once per block
    hop_type = type(torch.ops.higher_order.invoke_subgraph)
    original = hop_type.gen_schema
    calls: list[str] = []

    def counted(self: Any, subgraph: Any, identifier: Any, *operands: Any) -> Any:
        calls.append(identifier)
        return original(self, subgraph, identifier, *operands)

    monkeypatch.setattr(hop_type, "gen_schema", counted)
    torch.manual_seed(0)
    (report,) = _run(Net(6))
    (paths,) = report.shared.values()
    assert len(paths) == 6
    # one schema per distinct call (the region, and the forward and backward graphs torch
    # derives from it), not one per block
    assert calls and len(calls) == len(set(calls)), calls


def test_differing_block_alone() -> None:
    torch.manual_seed(0)
    (report,) = _run(Net(5, odd=2))
    (paths,) = report.shared.values()
    assert not any(p.endswith("blocks.2") for p in paths) and len(paths) == 4


def test_switch_off_leaves_graph() -> None:
    torch.manual_seed(0)
    (report,) = _run(Net(4), threshold=0)
    assert report.shared == {} and report.skipped == "region sharing is off"
    previous = min_repeats()
    set_dedup_regions(False)
    try:
        assert min_repeats() == 0
    finally:
        set_dedup_regions(previous)


def _reasons(kind: str) -> list[str]:
    torch.manual_seed(0)
    (report,) = _run(Net(4, kind=kind))
    assert report.shared == {} or all("blocks.0." in p or ".l" in p for ps in report.shared.values() for p in ps)
    return [why for cls, _, why in report.refused if cls.endswith("Block")]


def test_refusals_name_the_reason() -> None:
    assert _reasons("dropout") == ["it draws random numbers (dropout)"]
    assert _reasons("inplace") == ["it mutates a tensor in place (Tensor.mul_)"]
    assert _reasons("nograd") == ["it changes grad mode or autocast (_set_grad_enabled)"]
    bn = _reasons("bn")  # one entry per buffer name
    assert bn and all(w.startswith("it reads a module buffer (") and "_buffers_" in w for w in bn)


def test_checkpointed_block_refused() -> None:
    from torch.utils.checkpoint import checkpoint

    class Ckpt(Net):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.inp(x)
            for b in self.blocks:
                x = checkpoint(b, x, use_reentrant=False)
            return x.sum()

    torch.manual_seed(0)
    reports = _run(Ckpt(4))
    assert all(not r.shared for r in reports)

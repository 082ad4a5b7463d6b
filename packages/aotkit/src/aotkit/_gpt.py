"""A small character-level GPT and the text it learns from (shipped with the package).

The text is the first chapter of Jane Austen's *Pride and Prejudice* (1813, public domain),
in ``aotkit/data``: nothing is downloaded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources

import torch
import torch.nn as nn
import torch.nn.functional as F

TEXT_FILE = "pride_and_prejudice_ch1.txt"


def load_text() -> str:
    """The demo's training text (about 4.5 KB)."""
    return resources.files("aotkit").joinpath("data", TEXT_FILE).read_text(encoding="utf-8")


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64


class CausalSelfAttention(nn.Module):
    mask: torch.Tensor

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        mask = torch.tril(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, cfg.block_size, cfg.block_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        out: torch.Tensor = self.proj(y)
        return out


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class GPT(nn.Module):
    """A GPT-2-shaped decoder: token and position embeddings, ``n_layer`` blocks, a head."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.size(1)
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


class CharData:
    """The text as a tensor of character ids, and fixed random batches of it."""

    def __init__(self, text: str, block_size: int) -> None:
        self.chars = sorted(set(text))
        index = {ch: i for i, ch in enumerate(self.chars)}
        self.ids = torch.tensor([index[ch] for ch in text], dtype=torch.long)
        self.block_size = block_size

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def batch(self, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(self.ids) - self.block_size - 1, (batch_size,), generator=generator)
        x = torch.stack([self.ids[s : s + self.block_size] for s in starts.tolist()])
        y = torch.stack([self.ids[s + 1 : s + 1 + self.block_size] for s in starts.tolist()])
        return x, y


def make_gpt(n_layer: int = 2, block_size: int = 32, n_embd: int = 64, seed: int = 0) -> tuple[GPT, CharData]:
    """A freshly initialised GPT (seeded) and the demo text's data."""
    data = CharData(load_text(), block_size)
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=data.vocab_size, block_size=block_size, n_layer=n_layer, n_embd=n_embd)
    return GPT(cfg), data

"""Depth benchmark of region sharing (aotkit_regions): Llama / GPT-2 from transformers
configs (hidden 128), 2/8/24 layers, first training step under torch.compile.

Reports, per model and depth: the time inside aotkit's AOT layer (the backend call) with
sharing on and off, and the first step of aotkit_eager (sharing on) against torch's
aot_eager, measured in one process, alternating, medians of --repeats. Never in CI.

Usage: uv run --group bench python tools/bench/regions_depth.py [--repeats 1] [--layers 2 8 24]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch


def build(kind: str, layers: int) -> torch.nn.Module:
    import transformers as tf

    if kind == "llama":
        cfg = tf.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=4, vocab_size=512)
        model = tf.LlamaForCausalLM(cfg)
    else:
        cfg = tf.GPT2Config(n_embd=128, n_layer=layers, n_head=4, vocab_size=512,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = tf.GPT2LMHeadModel(cfg)
    model.config.use_cache = False
    return model.train()


def first_step(model: torch.nn.Module, backend: Any, ids: torch.Tensor) -> float:
    torch._dynamo.reset()
    model.zero_grad()
    t = time.perf_counter()
    try:
        out = torch.compile(model, backend=backend)(input_ids=ids, labels=ids)
        out.loss.backward()
    except Exception as e:  # reported, not hidden: the step's column reads nan
        print(f"  step failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
        return float("nan")
    return time.perf_counter() - t


def main() -> None:
    import aotkit  # noqa: F401  (registers the backends)
    from aotkit_frontends._dynamo_backend import aotkit_eager
    from aotkit_regions import dedup_regions

    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--layers", type=int, nargs="*", default=[2, 8, 24])
    p.add_argument("--models", nargs="*", default=["llama", "gpt2"])
    a = p.parse_args()
    ids = torch.randint(0, 512, (2, 32))
    aot_time: list[float] = []

    def timed(gm: Any, ex: Any) -> Any:
        t = time.perf_counter()
        r = aotkit_eager(gm, ex)
        aot_time.append(time.perf_counter() - t)
        return r

    print("model layers | AOT on | AOT off | on/off | step aotkit_eager | step aot_eager | ratio")
    base: dict[str, float] = {}
    for kind in a.models:
        for n in a.layers:
            torch.manual_seed(0)
            model = build(kind, n)
            rows: dict[str, list[float]] = {"on": [], "off": [], "step": [], "torch": []}
            for _ in range(a.repeats):
                for mode in ("on", "off"):
                    aot_time.clear()
                    with dedup_regions(True if mode == "on" else False):
                        s = first_step(model, timed, ids)
                    rows[mode].append(sum(aot_time))
                    if mode == "on":
                        rows["step"].append(s)
                rows["torch"].append(first_step(model, "aot_eager", ids))
            m = {k: statistics.median(v) for k, v in rows.items()}
            base.setdefault(kind, m["on"])
            print(f"{kind} {n} | {m['on']:.2f} | {m['off']:.2f} | {m['on'] / m['off']:.2f} | "
                  f"{m['step']:.2f} | {m['torch']:.2f} | {m['step'] / m['torch']:.2f} "
                  f"(AOT on {n}/{a.layers[0]}: {m['on'] / base[kind]:.2f}x)", flush=True)


if __name__ == "__main__":
    main()

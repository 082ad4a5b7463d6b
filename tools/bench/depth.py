"""Depth benchmark: the first and steady training step as models get deeper (issue 36).

transformers' Llama, GPT-2, BERT and ViT built from configs (hidden size 128, nothing
downloaded) at 2, 8 and 24 layers, with and without nested compile regions (each decoder /
encoder layer's forward wrapped in ``torch.compiler.nested_compile_region``), for both
backend pairs (``aotkit_eager`` / ``aot_eager``, ``aotkit_inductor`` / ``inductor``).

Every measurement is zoo.py's (``zoo.bench_pair``): correctness over 3 AdamW steps
(bitwise, close within rtol 1e-4 / atol 1e-5, or DIFF), the first step of a fresh
``torch.compile`` (wall), the time inside the AOT layer (compilers excluded), the steady
step (eager, aotkit and torch interleaved), saved-for-backward bytes; aotkit and torch in
one process, alternating, medians, ratios ours/theirs. Graph caches are off
(``AOTKIT_CACHE=0``, Inductor's FX graph and AOTAutograd caches) and Inductor's cache
directory is a fresh temporary one (``TORCHINDUCTOR_CACHE_DIR``) for the whole process.

Usage (never in CI; minutes for a quick run, Inductor runs are slow on a busy machine):
  uv run --group bench python tools/bench/depth.py --quick --backends eager
  uv run --group bench python tools/bench/depth.py --models llama --depths 2,8 --backends inductor
  uv run --group bench python tools/bench/depth.py --models llama,gpt2 --depths 2,8,24 --nested on,off
Benchmarks are not tests: the exit status is 0 whether targets pass or miss.
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="depth-inductor-"))
os.environ.setdefault("AOTKIT_CACHE", "0")

import argparse  # noqa: E402
import functools  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import zoo  # noqa: E402  (sets the remaining cache switches before torch is used)

_LAYERS = {  # where each model keeps its repeated layers
    "llama": lambda m: m.model.layers,
    "gpt2": lambda m: m.transformer.h,
    "bert": lambda m: m.bert.encoder.layer,
    "vit": lambda m: m.vit.encoder.layer,
}
_NESTED_CLASSES: dict[type, type] = {}


def _nested_class(base: type) -> type:
    """``base`` with its forward a nested compile region (one function for every layer,
    so that dynamo gives all layers one region)."""
    if base not in _NESTED_CLASSES:
        forward = torch.compiler.nested_compile_region(base.forward)  # type: ignore[attr-defined]
        _NESTED_CLASSES[base] = type(base.__name__ + "Nested", (base,), {"forward": forward})
    return _NESTED_CLASSES[base]


def _model(kind: str, layers: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    import transformers as tf

    tf.logging.set_verbosity_error()
    small: dict[str, Any] = dict(vocab_size=512, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    ids = torch.randint(0, 512, (2, 32))
    if kind == "llama":
        cfg = tf.LlamaConfig(
            num_hidden_layers=layers, hidden_size=128, intermediate_size=256,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, **small,
        )
        return tf.LlamaForCausalLM(cfg), (ids,)
    if kind == "gpt2":
        cfg = tf.GPT2Config(
            n_layer=layers, n_embd=128, n_head=4, n_positions=64, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, **small,
        )
        return tf.GPT2LMHeadModel(cfg), (ids,)
    if kind == "bert":
        cfg = tf.BertConfig(
            num_hidden_layers=layers, hidden_size=128, intermediate_size=256,
            num_attention_heads=4, max_position_embeddings=64, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, **small,
        )
        return tf.BertForMaskedLM(cfg), (ids,)
    if kind == "vit":
        cfg = tf.ViTConfig(
            num_hidden_layers=layers, hidden_size=128, intermediate_size=256,
            num_attention_heads=4, image_size=32, patch_size=8, num_labels=10,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        )
        x = torch.randn(2, 3, 32, 32)
        return tf.ViTForImageClassification(cfg), (x, torch.randint(0, 10, (2,)))
    raise ValueError(kind)


def _loss(kind: str, inner: nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
    if kind == "vit":
        return inner(pixel_values=inputs[0], labels=inputs[1]).loss  # type: ignore[no-any-return]
    return inner(input_ids=inputs[0], labels=inputs[0]).loss  # type: ignore[no-any-return]


def _build(kind: str, layers: int, nested: bool) -> zoo.Built:
    model, inputs = _model(kind, layers)
    if nested:
        for layer in _LAYERS[kind](model):
            layer.__class__ = _nested_class(type(layer))
    return zoo._built(zoo._Loss(model, functools.partial(_loss, kind)), *inputs)


def _name(kind: str, layers: int, nested: bool) -> str:
    return f"{kind}-{layers}{'-nested' if nested else ''}"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default="llama,gpt2,bert,vit")
    p.add_argument("--depths", default="2,8,24")
    p.add_argument("--backends", default="eager,inductor", help="pairs: eager, inductor")
    p.add_argument("--nested", default="off,on", help="off, on or both")
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--reps", type=int, default=0, help="first-step repetitions (0: settings')")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    s = zoo.QUICK if args.quick else zoo.FULL
    if args.reps:
        s = zoo.Settings(args.reps, args.reps, s.steady_reps, s.steady_block_s)
    backends = zoo.make_backends()
    results = []
    for kind in args.models.split(","):
        for depth in (int(d) for d in args.depths.split(",")):
            for nested in (n == "on" for n in args.nested.split(",")):
                name = _name(kind, depth, nested)
                zoo.MODELS[name] = functools.partial(_build, kind, depth, nested)
                for pair in args.backends.split(","):
                    r = zoo.bench_pair(
                        name, pair, backends, s,
                        lambda m: print(m, file=sys.stderr, flush=True), 0,
                    )
                    results.append(r)
                    print(f"{name}/{pair}: {zoo.summary(r)}", file=sys.stderr, flush=True)
                    if args.json:
                        zoo.write_json(args.json, s, results)
    zoo.report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

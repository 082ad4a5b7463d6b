"""Side-by-side benchmark: aotkit's min-cut partitioner vs torch's, on the same joint graphs.

For each model the joint graph is captured once with torch's ``aot_function`` (a
``partition_fn`` that records the joint module; torch is the oracle here). Both partitioners
then split that same graph, in one process with ``torch.set_num_threads(1)``:

* saved MB: bytes of the tensors the forward saves for the backward (``numel * itemsize``
  from ``meta['val']``, symbolic sizes at their hints; 1 MB = 10**6 bytes), measured with
  ``aotkit_partitioners.partition_report`` for both;
* partition time: contenders take turns within every repetition (torch, aotkit, torch, ...);
  torch's partitioner modifies its input, so it gets a fresh deep copy each time (copied
  outside the timed region). Times are medians; the time ratio is the median of the paired
  per-repetition ratios. ``noise`` is the larger interquartile range / median of the two.
  Both produce ordinary GraphModules (code generated eagerly); the ``lazy`` table repeats
  the timing with torch's lazy-graph-module switch on for both, as under torch.compile.
* ok: aotkit's forward/backward pair reproduces the joint graph's outputs and gradients on
  random inputs (with the generator seeded alike before each run, so random ops draw the
  same numbers: with functionalized RNG a recomputed dropout mask replays the forward's).

Models with dropout (``*_dropout``) are also split by aotkit with functionalized RNG off
(Note [Functionalized RNG]), in a table of saved MB and of whether each pair's gradients
are identical (``torch.equal``) to the joint's and to torch's pair's.

Then a scaling curve: aotkit's min-cut time on TransformerEncoder joints of growing depth,
up to ~20,000 nodes (torch's time alongside, up to ``--torch-max-nodes``).

Usage: python tools/bench/partitioners.py [--reps 7] [--models mlp,chain] [--no-scaling]
Benchmarks are not tests: the exit status is 0 whether targets pass or miss.
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import aotkit_partitioners as ap
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._pytree as pytree
from aotkit_partitioners.testing import run_partition
from torch._functorch.aot_autograd import aot_function
from torch._functorch.partitioners import default_partition as torch_default_partition
from torch._functorch.partitioners import (
    min_cut_rematerialization_partition as torch_min_cut,
)
from torch.func import functional_call
from torch.fx._lazy_graph_module import _use_lazy_graph_module

MB = 1e6


@dataclass(frozen=True)
class Joint:
    gm: torch.fx.GraphModule
    joint_inputs: Any
    num_fwd_outputs: int

    @property
    def num_nodes(self) -> int:
        return len(self.gm.graph.nodes)


def capture_joint(model: nn.Module, *inputs: torch.Tensor) -> Joint:
    """The joint graph torch's aot_function builds for ``model(*inputs)``."""
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    names = list(state)
    got: list[Joint] = []

    def fn(*args: Any) -> Any:
        return functional_call(
            model, dict(zip(names, args[: len(names)], strict=True)), args[len(names) :]
        )

    def partition(gm: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        got.append(Joint(copy.deepcopy(gm), joint_inputs, kwargs["num_fwd_outputs"]))
        return torch_default_partition(gm, joint_inputs, **kwargs)

    compiled = aot_function(fn, fw_compiler=lambda gm, _: gm, partition_fn=partition)
    compiled(*state.values(), *inputs)
    return got[0]


class PointwiseChain(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(24):
            x = F.gelu(x) * x.sigmoid() + x.cos()
        return x


def _mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(512, 512), nn.GELU()]
    return nn.Sequential(*layers), (torch.randn(64, 512),)


def _transformer_layer() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    layer = nn.TransformerEncoderLayer(256, 4, dim_feedforward=512, dropout=0.0, batch_first=True)
    return layer, (torch.randn(8, 128, 256),)


def _transformer_layer_dropout() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    layer = nn.TransformerEncoderLayer(256, 4, dim_feedforward=512, dropout=0.1, batch_first=True)
    return layer.train(), (torch.randn(8, 128, 256),)


def _conv_bn_relu() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    layers: list[nn.Module] = []
    channels = 3
    for _ in range(3):
        layers += [nn.Conv2d(channels, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()]
        channels = 16
    return nn.Sequential(*layers), (torch.randn(8, 3, 32, 32),)


def _pointwise_chain() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return PointwiseChain(), (torch.randn(256, 256, requires_grad=True),)


def _encoder(
    layers: int, d_model: int = 128, ff: int = 512, heads: int = 4, batch: int = 8, seq: int = 128
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    layer = nn.TransformerEncoderLayer(
        d_model, heads, dim_feedforward=ff, dropout=0.0, batch_first=True
    )
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False), (
        torch.randn(batch, seq, d_model),
    )


MODELS: dict[str, tuple[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]]] = {
    "mlp": ("4x Linear(512)+GELU, batch 64", _mlp),
    "transformer": ("TransformerEncoderLayer(256,4,ff=512), 8x128", _transformer_layer),
    "transformer_dropout": (
        "TransformerEncoderLayer(256,4,ff=512,dropout=0.1), 8x128, training",
        _transformer_layer_dropout,
    ),
    "conv_bn_relu": ("3x conv-bn-relu, 8x3x32x32", _conv_bn_relu),
    "chain": ("24-deep gelu(x)*sigmoid(x)+cos(x), 256x256", _pointwise_chain),
    "encoder12": ("12-layer TransformerEncoder(d_model=128)", lambda: _encoder(12)),
}


def saved_mb(fw: torch.fx.GraphModule, bw: torch.fx.GraphModule, n: int) -> float:
    return ap.partition_report(fw, bw, n).saved_bytes / MB


def _real_inputs(joint: Joint) -> tuple[list[Any], list[Any]]:
    primals, tangents = joint.joint_inputs

    def real(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if t.dtype.is_floating_point:
            return torch.randn(t.shape, dtype=t.dtype)
        return torch.zeros(t.shape, dtype=t.dtype)

    return [real(x) for x in primals], [real(x) for x in tangents]


_SEED = 2026


def run_joint(joint: Joint, p: list[Any], t: list[Any]) -> list[Any]:
    torch.manual_seed(_SEED)
    return list(pytree.tree_leaves(joint.gm(p, t), is_leaf=lambda x: x is None))


def run_pair(
    joint: Joint, fw: torch.fx.GraphModule, bw: torch.fx.GraphModule, p: list[Any], t: list[Any]
) -> list[Any]:
    torch.manual_seed(_SEED)
    return list(run_partition(fw, bw, joint.num_fwd_outputs, [*p, *t], len(p)))


def _same(got: list[Any], want: list[Any], *, exact: bool = False) -> bool:
    return len(got) == len(want) and all(
        (a is None and b is None)
        or (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and (torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-3, atol=1e-4))
        )
        for a, b in zip(got, want, strict=True)
    )


def check(joint: Joint, fw: torch.fx.GraphModule, bw: torch.fx.GraphModule) -> bool:
    p, t = _real_inputs(joint)
    return _same(run_pair(joint, fw, bw, p, t), run_joint(joint, p, t))


def run_rng(names: list[str]) -> None:
    """Saved MB with and without functionalized RNG, and whether gradients are identical."""
    rows = [n for n in names if n.endswith("_dropout")]
    if not rows:
        return
    print("\nfunctionalized RNG (aotkit min-cut with it on and off vs torch's min-cut, CPU):")
    print(
        f"{'model':20s} {'torch MB':>9s} {'rng on MB':>9s} {'rng off MB':>10s} "
        f"{'on/torch':>8s} {'on = joint':>10s} {'on = torch':>10s} {'off = joint':>11s}"
    )
    for name in rows:
        torch.manual_seed(0)
        model, inputs = MODELS[name][1]()
        joint = capture_joint(model, *inputs)
        n = joint.num_fwd_outputs
        _, (tfw, tbw) = _time_torch(joint)
        on_fw, on_bw = ap.min_cut_rematerialization_partition(
            joint.gm, joint.joint_inputs, num_fwd_outputs=n, functionalize_rng=True
        )
        off_fw, off_bw = ap.min_cut_rematerialization_partition(
            joint.gm, joint.joint_inputs, num_fwd_outputs=n, functionalize_rng=False
        )
        t_mb = saved_mb(tfw, tbw, n)
        on_mb, off_mb = saved_mb(on_fw, on_bw, n), saved_mb(off_fw, off_bw, n)
        p, t = _real_inputs(joint)
        want = run_joint(joint, p, t)
        on = run_pair(joint, on_fw, on_bw, p, t)
        theirs = run_pair(joint, tfw, tbw, p, t)
        off = run_pair(joint, off_fw, off_bw, p, t)
        print(
            f"{name:20s} {t_mb:9.3f} {on_mb:9.3f} {off_mb:10.3f} {on_mb / t_mb:8.3f} "
            f"{_same(on, want, exact=True)!s:>10s} {_same(on, theirs, exact=True)!s:>10s} "
            f"{_same(off, want, exact=True)!s:>11s}",
            flush=True,
        )


@contextmanager
def _lazy(on: bool) -> Iterator[None]:
    with _use_lazy_graph_module(on):
        yield


def _time_torch(joint: Joint) -> tuple[float, tuple[torch.fx.GraphModule, torch.fx.GraphModule]]:
    gm = copy.deepcopy(joint.gm)
    gc.collect()
    start = time.perf_counter()
    out = torch_min_cut(gm, joint.joint_inputs, num_fwd_outputs=joint.num_fwd_outputs)
    return time.perf_counter() - start, out


def _time_ours(joint: Joint) -> tuple[float, tuple[torch.fx.GraphModule, torch.fx.GraphModule]]:
    gc.collect()
    start = time.perf_counter()
    out = ap.min_cut_rematerialization_partition(
        joint.gm, joint.joint_inputs, num_fwd_outputs=joint.num_fwd_outputs
    )
    return time.perf_counter() - start, out


@dataclass
class Timing:
    torch_s: float
    ours_s: float
    ratio: float
    noise: float


def _iqr_rel(xs: list[float]) -> float:
    if len(xs) < 4:
        return 0.0
    q = statistics.quantiles(xs, n=4)
    return (q[2] - q[0]) / statistics.median(xs)


def time_both(joint: Joint, reps: int, *, lazy: bool = False) -> Timing:
    theirs: list[float] = []
    ours: list[float] = []
    with _lazy(lazy):
        _time_torch(joint), _time_ours(joint)  # warm-up: lazy imports, caches
        for _ in range(reps):
            theirs.append(_time_torch(joint)[0])
            ours.append(_time_ours(joint)[0])
    return Timing(
        statistics.median(theirs),
        statistics.median(ours),
        statistics.median(o / t for o, t in zip(ours, theirs, strict=True)),
        max(_iqr_rel(theirs), _iqr_rel(ours)),
    )


def run_models(names: list[str], reps: int) -> None:
    print(
        f"{'model':14s} {'nodes':>6s} {'torch MB':>9s} {'aotkit MB':>9s} {'MB ratio':>8s} "
        f"{'torch ms':>9s} {'aotkit ms':>9s} {'t ratio':>8s} {'noise':>6s} {'ok':>3s}"
    )
    lazy_rows: list[tuple[str, Timing]] = []
    for name in names:
        desc, factory = MODELS[name]
        torch.manual_seed(0)
        model, inputs = factory()
        joint = capture_joint(model, *inputs)
        n = joint.num_fwd_outputs
        _, (tfw, tbw) = _time_torch(joint)
        _, (ofw, obw) = _time_ours(joint)
        t_mb, o_mb = saved_mb(tfw, tbw, n), saved_mb(ofw, obw, n)
        ok = check(joint, ofw, obw)
        timing = time_both(joint, reps)
        print(
            f"{name:14s} {joint.num_nodes:6d} {t_mb:9.3f} {o_mb:9.3f} {o_mb / t_mb:8.3f} "
            f"{timing.torch_s * 1e3:9.1f} {timing.ours_s * 1e3:9.1f} {timing.ratio:8.3f} "
            f"{timing.noise:6.2f} {'yes' if ok else 'NO':>3s}",
            flush=True,
        )
        lazy_rows.append((name, time_both(joint, reps, lazy=True)))
    print("\nlazy graph modules for both (code generated on first call, as under torch.compile):")
    print(f"{'model':14s} {'torch ms':>9s} {'aotkit ms':>9s} {'t ratio':>8s} {'noise':>6s}")
    for name, t in lazy_rows:
        print(
            f"{name:14s} {t.torch_s * 1e3:9.1f} {t.ours_s * 1e3:9.1f} {t.ratio:8.3f} {t.noise:6.2f}"
        )
    print("\n" + "\n".join(f"  {k}: {v[0]}" for k, v in MODELS.items() if k in names))


def run_scaling(layers: list[int], torch_max_nodes: int) -> None:
    print(
        "\nscaling: aotkit min-cut on TransformerEncoder(d_model=32, ff=64, 2 heads, 4x16) joints"
    )
    print(
        f"{'layers':>6s} {'nodes':>7s} {'aotkit ms':>10s} {'us/node':>8s} {'torch ms':>10s} "
        f"{'t ratio':>8s}"
    )
    for n_layers in layers:
        torch.manual_seed(0)
        model, inputs = _encoder(n_layers, d_model=32, ff=64, heads=2, batch=4, seq=16)
        joint = capture_joint(model, *inputs)
        reps = 3 if joint.num_nodes < 5000 else 1
        _time_ours(joint)
        ours = statistics.median(_time_ours(joint)[0] for _ in range(reps))
        theirs_txt, ratio_txt = "-", "-"
        if joint.num_nodes <= torch_max_nodes:
            _time_torch(joint)
            theirs = statistics.median(_time_torch(joint)[0] for _ in range(reps))
            theirs_txt, ratio_txt = f"{theirs * 1e3:10.1f}", f"{ours / theirs:8.3f}"
        print(
            f"{n_layers:6d} {joint.num_nodes:7d} {ours * 1e3:10.1f} "
            f"{ours * 1e6 / joint.num_nodes:8.1f} {theirs_txt:>10s} {ratio_txt:>8s}",
            flush=True,
        )
        del joint, model
        gc.collect()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--no-scaling", action="store_true")
    parser.add_argument("--layers", default="1,4,16,32,64,128")
    parser.add_argument("--torch-max-nodes", type=int, default=20000)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, python {sys.version.split()[0]}, "
        f"{args.reps} paired repetitions per model"
    )
    models = [m for m in args.models.split(",") if m]
    run_models(models, args.reps)
    run_rng(models)
    if not args.no_scaling:
        run_scaling([int(x) for x in args.layers.split(",")], args.torch_max_nodes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

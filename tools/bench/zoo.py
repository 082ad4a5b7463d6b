"""Model-zoo benchmark: aotkit's torch.compile backends against torch's, on real models.

Models are built from configs with random initialisation (nothing is downloaded:
``HF_HUB_OFFLINE=1``, timm's ``pretrained=False``): transformers' GPT-2, BERT, Llama, T5 and
ViT (2 layers, hidden size 128), timm's resnet18, mobilenetv3_small_100, efficientnet_b0 and
vit_tiny_patch16_224 (small images), and the four micro models of ``compare.py`` (imported
from it). Each model is wrapped so that its forward returns a scalar loss and is compiled
whole with ``torch.compile(model, backend=...)``; a training step is ``zero_grad``, forward,
``loss.backward()``, ``AdamW.step()`` (the optimizer runs eagerly).

Two pairs of backends, each aotkit's against torch's: ``aotkit_eager`` / ``aot_eager`` and
``aotkit_inductor`` / ``inductor``. Per model and pair:

* correctness: 3 AdamW steps from the same initial state, losses and parameters against
  eager (``bitwise``, ``close`` within rtol 1e-4 / atol 1e-5, or ``DIFF`` with the max error);
* first step: a fresh ``torch.compile`` after ``torch._dynamo.reset()``, its first training
  step (dynamo + AOT layer + compilers + forward + backward + optimizer step);
* AOT layer: the time inside the AOTAutograd backend call (from dynamo's graph to the
  compiled forward) plus the lazy backward compile, minus the time spent in the graph
  compilers themselves (fw/bw/inference compilers and torch's pre-grad passes are wrapped
  and timed). torch's ``inductor`` partitioner runs Inductor's joint-graph passes: they
  count as AOT layer there, as they are part of its partitioning;
* steady step: step time after warm-up, eager, aotkit and torch interleaved;
* saved for backward: bytes of the distinct storages that autograd keeps for the backward
  of one compiled step (``torch.autograd.graph.saved_tensors_hooks``), not counting the
  model's parameters and inputs, which are alive anyway;
* path: for aotkit, per compiled graph, whether the single pass and the native
  functionalization were used and, if not, why (``aotkit_capture.record_compilations``).

Ratios are aotkit/torch, measured in one process, the two contenders alternating within
every repetition; figures are medians, ratios medians of the per-repetition ratios. Graph
caches that would make a later compile of the same graph free are off (Inductor's FX graph
cache, torch's AOTAutograd cache, aotkit's on-disk cache); Inductor's in-process cache of compiled C++ kernels is
not, and every contender compiles once untimed before it is timed (the correctness run), so
the first-step figures do not include the C++ compiler building a kernel for the first time.

Usage:
  uv run --group bench python tools/bench/zoo.py                     # full run (~20 min)
  uv run --group bench python tools/bench/zoo.py --backends eager    # the eager pair only
  uv run --group bench python tools/bench/zoo.py --quick --models gpt2,resnet18
  uv run --group bench python tools/bench/zoo.py --profile --backends eager --models bert
  uv run --group bench python tools/bench/zoo.py --json zoo.json
  uv run --group bench python tools/bench/zoo.py --set wide --quick --backends eager   # zoo_wide.py
  uv run --group bench python tools/bench/zoo.py --clock cpu ...    # on a shared machine
Benchmarks are not tests: the exit status is 0 whether targets pass or miss.
"""

from __future__ import annotations

import os

# Before transformers or torch are imported: no network, no graph caches.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
# aotkit's on-disk compile cache is torch's AOTAutograd cache's counterpart: off too, or the
# timed compiles after the (untimed) correctness run would restore instead of trace
os.environ.setdefault("AOTKIT_CACHE", "0")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import copy  # noqa: E402
import cProfile  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import pstats  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable, Iterator, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import aotkit  # noqa: E402, F401  (registers aotkit_eager and aotkit_inductor)
import aotkit_frontends  # noqa: E402
import compare  # noqa: E402
import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch._dynamo.backends.common as dynamo_common  # noqa: E402
import torch._dynamo.backends.debugging as dynamo_debugging  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from aotkit_schemas import mark_graph_reader, reads_graph_only  # noqa: E402
from compare import MODELS as MICRO_MODELS  # noqa: E402
from compare import Samples, calibrate, interleave, looped  # noqa: E402
from zoo_wide import WIDE  # noqa: E402

try:  # See Note [Why a graph took the path it took] in aotkit_capture
    from aotkit_capture import record_compilations as _record_compilations
except ImportError:  # an aotkit without the debug hook: the path column says "n/a"
    _record_compilations = None

PAIRS: dict[str, tuple[str, str]] = {
    "eager": ("aotkit_eager", "aot_eager"),
    "inductor": ("aotkit_inductor", "inductor"),
}

# --------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------


@dataclass
class Built:
    """A model ready to train: ``module(*inputs)`` returns a scalar loss; ``params`` are the
    tensors AdamW updates (the module's parameters, or grad-requiring inputs)."""

    module: nn.Module
    inputs: tuple[torch.Tensor, ...]
    params: list[torch.Tensor]
    # tensors alive whatever the step does (parameters, buffers, inputs): not counted as
    # saved for backward
    resident: list[torch.Tensor] = field(default_factory=list)


class _Loss(nn.Module):
    """``inner(*inputs)`` reduced to a scalar by ``loss``."""

    def __init__(self, inner: nn.Module, loss: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.inner = inner
        self.loss = loss

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.loss(self.inner, *inputs)


class _FunctionModel(nn.Module):
    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.fn(*inputs).sum()


def _built(module: nn.Module, *inputs: torch.Tensor) -> Built:
    module.train()
    params = [p for p in module.parameters() if p.requires_grad]
    resident = [*module.parameters(), *module.buffers(), *inputs]
    return Built(module, inputs, params, resident)


def _hf_lm(kind: str) -> Built:
    import transformers as tf

    tf.logging.set_verbosity_error()
    small: dict[str, Any] = dict(vocab_size=512, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    seq, batch = 32, 2
    ids = torch.randint(0, 512, (batch, seq))
    if kind == "gpt2":
        cfg = tf.GPT2Config(
            n_layer=2, n_embd=128, n_head=4, n_positions=64, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, **small,
        )
        model: nn.Module = tf.GPT2LMHeadModel(cfg)
    elif kind == "llama":
        cfg = tf.LlamaConfig(
            num_hidden_layers=2, hidden_size=128, intermediate_size=256,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, **small,
        )
        model = tf.LlamaForCausalLM(cfg)
    elif kind == "bert":
        cfg = tf.BertConfig(
            num_hidden_layers=2, hidden_size=128, intermediate_size=256,
            num_attention_heads=4, max_position_embeddings=64, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, **small,
        )
        model = tf.BertForMaskedLM(cfg)
    elif kind == "t5":
        cfg = tf.T5Config(
            num_layers=2, num_decoder_layers=2, d_model=128, d_kv=32, d_ff=256, num_heads=4,
            dropout_rate=0.0, decoder_start_token_id=0, **small,
        )
        model = tf.T5ForConditionalGeneration(cfg)
    else:
        raise ValueError(kind)
    return _built(_Loss(model, _hf_lm_loss), ids)


def _hf_lm_loss(inner: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return inner(input_ids=ids, labels=ids).loss  # type: ignore[no-any-return]


def _hf_vit() -> Built:
    import transformers as tf

    cfg = tf.ViTConfig(
        num_hidden_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=4,
        image_size=32, patch_size=8, num_labels=10, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = tf.ViTForImageClassification(cfg)
    return _built(_Loss(model, _classify_hf), torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,)))


def _classify_hf(inner: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return inner(pixel_values=x, labels=labels).loss  # type: ignore[no-any-return]


def _classify(inner: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(inner(x), labels)


def _timm(name: str, size: int, **kwargs: Any) -> Built:
    import timm

    model = timm.create_model(name, pretrained=False, num_classes=10, **kwargs)
    x = torch.randn(2, 3, size, size)
    return _built(_Loss(model, _classify), x, torch.randint(0, 10, (2,)))


def _micro(name: str) -> Built:
    w = MICRO_MODELS[name]()
    if isinstance(w.target, nn.Module):
        return _built(_Loss(w.target, _sum_loss), *w.inputs)
    # a function of grad-requiring inputs (pointwise): AdamW updates those inputs
    b = _built(_FunctionModel(w.target), *w.inputs)
    b.params = list(w.grad_leaves)
    return b


def _sum_loss(inner: nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
    return inner(*inputs).sum()  # type: ignore[no-any-return]


MODELS: dict[str, Callable[[], Built]] = {
    "gpt2": functools.partial(_hf_lm, "gpt2"),
    "bert": functools.partial(_hf_lm, "bert"),
    "llama": functools.partial(_hf_lm, "llama"),
    "t5": functools.partial(_hf_lm, "t5"),
    "vit": _hf_vit,
    "resnet18": functools.partial(_timm, "resnet18", 32),
    "mobilenetv3": functools.partial(_timm, "mobilenetv3_small_100", 32),
    "efficientnet_b0": functools.partial(_timm, "efficientnet_b0", 32),
    "vit_tiny": functools.partial(_timm, "vit_tiny_patch16_224", 32, img_size=32),
    **{f"micro_{name}": functools.partial(_micro, name) for name in MICRO_MODELS},
}
DEFAULT_SET = list(MODELS)


def _wide(make: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]) -> Built:
    module, inputs = make()
    return _built(module, *inputs)


# the wide set (zoo_wide.py): more architectures, selected with --set wide
MODELS.update({name: functools.partial(_wide, make) for name, make in WIDE.items()})
SETS: dict[str, list[str]] = {"default": DEFAULT_SET, "wide": list(WIDE), "all": list(MODELS)}


def build(name: str) -> Built:
    """A fresh copy of model ``name``: the same initial state every time."""
    torch.manual_seed(0)
    return MODELS[name]()


# --------------------------------------------------------------------------------------
# The AOT-layer clock: backends whose compilers are timed
# --------------------------------------------------------------------------------------


class AotClock:
    """Seconds inside AOTAutograd backend calls and lazy backward compiles, and inside the
    graph compilers called from them (subtracted). With ``profiler`` set, the profiler runs
    in the AOT layer only (paused inside the compilers)."""

    def __init__(self) -> None:
        self.outer = 0.0
        self.compilers = 0.0
        # compiler seconds per keyword (fw_compiler, bw_compiler, ...): inductor_split.py's
        # per-phase split of the first step
        self.by_kind: dict[str, float] = {}
        self.depth = 0
        self.profiler: cProfile.Profile | None = None

    def reset(self) -> None:
        self.outer = self.compilers = 0.0
        self.by_kind = {}

    @property
    def aot_seconds(self) -> float:
        return self.outer - self.compilers

    @contextlib.contextmanager
    def layer(self) -> Iterator[None]:
        """Around a backend call or a lazy backward compile."""
        self.depth += 1
        if self.depth == 1 and self.profiler is not None:
            self.profiler.enable()
        t0 = clock()
        try:
            yield
        finally:
            if self.depth == 1:
                self.outer += clock() - t0
                if self.profiler is not None:
                    self.profiler.disable()
            self.depth -= 1

    @contextlib.contextmanager
    def compiler(self, kind: str = "compiler") -> Iterator[None]:
        """Around a graph compiler: its time is not the AOT layer's."""
        if self.depth == 0:  # not under a timed layer (a compiler called by someone else)
            yield
            return
        if self.profiler is not None:
            self.profiler.disable()
        t0 = clock()
        saved, self.depth = self.depth, 0  # a compiler's own backend calls are its own
        try:
            yield
        finally:
            self.depth = saved
            spent = clock() - t0
            self.compilers += spent
            self.by_kind[kind] = self.by_kind.get(kind, 0.0) + spent
            if self.profiler is not None:
                self.profiler.enable()


CLOCK = AotClock()

# time.perf_counter (wall) by default; --clock cpu switches to time.process_time (this
# process's CPU time, which on a machine shared with other jobs does not count the time
# spent descheduled), for the AOT-layer and first-step clocks, the steady-step loops
# (compare.py's clock) and the profiler
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
clock: Callable[[], float] = time.perf_counter


def timed_compiler(compiler: Any, kind: str = "compiler") -> Any:
    """``compiler`` with its time counted as compiler time (markers such as aotkit's
    graph-reader flag are carried over by ``functools.wraps``)."""
    if compiler is None:
        return None
    if hasattr(compiler, "compiler_fn"):  # torch's SerializableAOTDispatchCompiler
        wrapped = copy.copy(compiler)
        wrapped.compiler_fn = timed_compiler(compiler.compiler_fn, kind)
        return wrapped

    @functools.wraps(compiler)
    def timed(*args: Any, **kwargs: Any) -> Any:
        with CLOCK.compiler(kind):
            return compiler(*args, **kwargs)

    if reads_graph_only(compiler):
        mark_graph_reader(timed)
    return timed


_COMPILER_KWARGS = ("fw_compiler", "bw_compiler", "inference_compiler", "pre_grad_passes")


def _timed_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    out = dict(kwargs)
    for k in _COMPILER_KWARGS:
        if out.get(k) is not None:
            out[k] = timed_compiler(out[k], k)
    return out


def _timed_backend(backend: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(backend)
    def call(*args: Any, **kwargs: Any) -> Any:
        with CLOCK.layer():
            return backend(*args, **kwargs)

    return call


def _install_torch_clock() -> None:
    """Time torch's AOTAutograd: every ``aot_autograd(...)`` backend torch's backends make
    (aot_eager and inductor look it up at call time), and the lazy backward compile."""
    original = dynamo_common.aot_autograd

    def aot_autograd(**kwargs: Any) -> Any:
        return _timed_backend(original(**_timed_kwargs(kwargs)))

    dynamo_common.aot_autograd = aot_autograd
    dynamo_debugging.aot_autograd = aot_autograd  # type: ignore[attr-defined]

    from torch._functorch._aot_autograd import runtime_wrappers

    compiler_cls: Any = runtime_wrappers._AutogradBackwardCompiler
    get_or_compile = compiler_cls.get_or_compile

    def timed_get_or_compile(self: Any, **kwargs: Any) -> Any:
        if self.compiled_bw is not None:
            return get_or_compile(self, **kwargs)
        with CLOCK.layer():
            return get_or_compile(self, **kwargs)

    compiler_cls.get_or_compile = timed_get_or_compile


def _install_aotkit_clock() -> dict[str, Callable[..., Any]]:
    """aotkit's registered backends rebuilt with timed compilers, and its lazy backward
    compile timed."""
    backends: dict[str, Callable[..., Any]] = {}
    for name in ("aotkit_eager", "aotkit_inductor"):
        registered = torch._dynamo.lookup_backend(name)
        assert isinstance(registered, aotkit_frontends.AotAutograd), registered
        kwargs = dict(registered.kwargs)
        bw = kwargs.get("bw_compiler")
        if bw is not None and getattr(bw, "_aotkit_disabled_bw", False):
            kwargs["bw_compiler"] = bw.__wrapped__  # AotAutograd disables it again
        backends[name] = _timed_backend(aotkit_frontends.aot_autograd(**_timed_kwargs(kwargs)))
    # the lazy backward compile: the thunk compile_flat hands to make_autograd_function.
    # Every module that calls it is patched (since the compile-and-wrap step moved to
    # _compiled_calls, _compile calls it only for the subclass layer: patching _compile
    # alone left aotkit's lazy backward compile untimed)
    patched = 0
    modnames = (
        "aotkit_capture.compile._compiled_calls",
        "aotkit_capture._subclass_calls",
        "aotkit_capture.compile._compile",
        "aotkit_frontends._compile",
    )
    for modname in modnames:
        module = sys.modules.get(modname)
        if module is None:
            with contextlib.suppress(ImportError):
                module = __import__(modname, fromlist=["_"])
        if module is not None and hasattr(module, "make_autograd_function"):
            make = module.make_autograd_function

            def make_timed(compiled_fw: Any, compiled_bw: Any, plan: Any, _make: Any = make) -> Any:
                def compile_backward() -> Any:
                    with CLOCK.layer():
                        return compiled_bw()

                return _make(compiled_fw, compile_backward, plan)

            module.make_autograd_function = make_timed
            patched += 1
    if not patched:
        warnings.warn("zoo: aotkit's lazy backward compile is not timed", stacklevel=1)
    return backends


def make_backends() -> dict[str, Callable[..., Any] | str]:
    _install_torch_clock()
    backends: dict[str, Callable[..., Any] | str] = dict(_install_aotkit_clock())
    backends["aot_eager"] = torch._dynamo.lookup_backend("aot_eager")
    backends["inductor"] = torch._dynamo.lookup_backend("inductor")
    return backends


# --------------------------------------------------------------------------------------
# Training, correctness, saved bytes
# --------------------------------------------------------------------------------------


@dataclass
class Trainer:
    """One model instance, compiled with one backend (or eager), with its optimizer."""

    built: Built
    fn: Callable[..., torch.Tensor]
    opt: torch.optim.Optimizer

    def step(self) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=True)
        loss = self.fn(*self.built.inputs)
        loss.backward()
        self.opt.step()
        return loss.detach()


def make_trainer(name: str, backend: Callable[..., Any] | str | None) -> Trainer:
    b = build(name)
    fn = b.module if backend is None else torch.compile(b.module, backend=backend)
    return Trainer(b, fn, torch.optim.AdamW(b.params, lr=1e-3))


def compare_training(
    ref: tuple[list[torch.Tensor], list[torch.Tensor]],
    got: tuple[list[torch.Tensor], list[torch.Tensor]],
) -> str:
    pairs = list(zip(ref[0] + ref[1], got[0] + got[1], strict=True))
    if all(torch.equal(a, b) for a, b in pairs):
        return "bitwise"
    if all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in pairs):
        return "close"
    err = max(float((a.double() - b.double()).abs().max()) for a, b in pairs)
    return f"DIFF {err:.1e}"


def train_three(t: Trainer) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    losses = [t.step() for _ in range(3)]
    return losses, [p.detach().clone() for p in t.built.params]


def saved_bytes(t: Trainer) -> int:
    """Bytes of the distinct storages autograd saves for one step's backward, minus the
    model's own tensors."""
    resident = {x.untyped_storage().data_ptr() for x in t.built.resident}
    storages: dict[int, int] = {}

    def pack(x: torch.Tensor) -> torch.Tensor:
        if type(x) is torch.Tensor or isinstance(x, nn.Parameter):
            st = x.untyped_storage()
            if st.data_ptr() not in resident:
                storages[st.data_ptr()] = st.nbytes()
        return x

    t.opt.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        loss = t.fn(*t.built.inputs)
    loss.backward()
    t.opt.zero_grad(set_to_none=True)
    return sum(storages.values())


# --------------------------------------------------------------------------------------
# Paths (aotkit's debug hook)
# --------------------------------------------------------------------------------------


def describe_paths(records: Sequence[Any]) -> str:
    """One line per compiled graph: ``single`` (single pass), ``native`` (two passes,
    native functionalization of the joint) or ``python`` (two passes, torch's Python mode),
    with the reason the faster path was not taken."""
    parts = []
    for r in records:
        path = getattr(r, "path", None)
        if path is None:
            parts.append("?")
            continue
        reason = getattr(r, "path_reason", None)
        parts.append(f"{path}" + (f" ({reason})" if reason else ""))
    if not parts:
        return "-"
    counted: dict[str, int] = {}
    for p in parts:
        counted[p] = counted.get(p, 0) + 1
    return "; ".join(f"{n}x {p}" if n > 1 else p for p, n in counted.items())


@contextlib.contextmanager
def recording() -> Iterator[list[Any]]:
    if _record_compilations is None:
        yield []
        return
    with _record_compilations() as records:
        yield records


# --------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    first_reps_eager: int
    first_reps_inductor: int
    steady_reps: int
    steady_block_s: float


FULL = Settings(first_reps_eager=5, first_reps_inductor=2, steady_reps=5, steady_block_s=0.3)
QUICK = Settings(first_reps_eager=2, first_reps_inductor=1, steady_reps=3, steady_block_s=0.1)


def first_step(name: str, backend: Callable[..., Any] | str) -> tuple[float, float]:
    """(first-step seconds, AOT-layer seconds) of a fresh compile."""
    torch._dynamo.reset()
    t = make_trainer(name, backend)
    gc.collect()
    CLOCK.reset()
    t0 = clock()
    t.step()
    elapsed = clock() - t0
    return elapsed, CLOCK.aot_seconds


@dataclass
class PairResult:
    model: str
    pair: str
    ours: str
    theirs: str
    correct: dict[str, str] = field(default_factory=dict)
    first: dict[str, list[float]] = field(default_factory=dict)
    aot: dict[str, list[float]] = field(default_factory=dict)
    steady: dict[str, list[float]] = field(default_factory=dict)
    saved: dict[str, int] = field(default_factory=dict)
    path: str = "n/a"
    # load average (1 min) when the model's measurements started: other processes on the
    # machine skew the ratios less than the times, but a busy machine is worth knowing
    load: float = float("nan")
    errors: list[str] = field(default_factory=list)
    profile: str = ""

    def ratio(self, table: dict[str, list[float]], num: str, den: str) -> float:
        if not table.get(num) or not table.get(den):
            return float("nan")
        return statistics.median(
            a / b for a, b in zip(table[num], table[den], strict=True) if b > 0
        )

    def med(self, table: dict[str, list[float]], key: str) -> float:
        return statistics.median(table[key]) if table.get(key) else float("nan")


def bench_pair(
    name: str,
    pair: str,
    backends: dict[str, Callable[..., Any] | str],
    s: Settings,
    progress: Callable[[str], None],
    profile_top: int,
) -> PairResult:
    ours, theirs = PAIRS[pair]
    res = PairResult(name, pair, ours, theirs)
    if hasattr(os, "getloadavg"):
        res.load = os.getloadavg()[0]
    # correctness (also the untimed first compile of each contender)
    progress(f"[{name}/{pair}] correctness")
    torch._dynamo.reset()
    eager = make_trainer(name, None)
    ref = train_three(eager)
    trainers: dict[str, Trainer] = {"eager": eager}
    for impl in (ours, theirs):
        torch._dynamo.reset()
        try:
            with recording() as records:
                trainers[impl] = make_trainer(name, backends[impl])
                got = train_three(trainers[impl])
        except Exception as e:  # report and go on with the other models
            res.errors.append(f"{impl}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            res.correct[impl] = "ERROR"
            continue
        res.correct[impl] = compare_training(ref, got)
        if impl == ours and _record_compilations is not None:
            res.path = describe_paths(records)
    if any(v == "ERROR" for v in res.correct.values()):
        return res

    progress(f"[{name}/{pair}] steady step, saved bytes")
    for impl, t in trainers.items():
        res.saved[impl] = saved_bytes(t)
    steps = {impl: t.step for impl, t in trainers.items()}
    for step in steps.values():
        for _ in range(2):
            step()
    n = calibrate(list(steps.values()), s.steady_block_s, max_n=1000)
    samples: Samples = interleave({k: looped(f, n) for k, f in steps.items()}, s.steady_reps)
    res.steady = samples.times
    del trainers, steps

    progress(f"[{name}/{pair}] first step")
    reps = s.first_reps_eager if pair == "eager" else s.first_reps_inductor
    for impl in (ours, theirs):
        res.first[impl], res.aot[impl] = [], []
    for rep in range(reps):
        # the order alternates, so that neither contender always runs right after the other
        for impl in (ours, theirs) if rep % 2 == 0 else (theirs, ours):
            f, a = first_step(name, backends[impl])
            res.first[impl].append(f)
            res.aot[impl].append(a)
    if profile_top:
        res.profile = profile_aot_layer(name, backends[ours], profile_top)

    return res


def profile_aot_layer(name: str, backend: Callable[..., Any] | str, top: int) -> str:
    """cProfile of the AOT layer alone (compilers excluded) during one fresh first step."""
    prof = cProfile.Profile(clock)
    CLOCK.profiler = prof
    try:
        first_step(name, backend)
    finally:
        CLOCK.profiler = None
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    out.write(own_time_split(stats) + "\n\n")
    stats.sort_stats("cumulative").print_stats(top)
    out.write("\n--- by own time ---\n")
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def own_time_split(stats: pstats.Stats) -> str:
    """The profile's own time by where the code lives: each aotkit package, each top-level
    part of torch (``torch/_subclasses`` is the fake tensors, ``torch/fx`` make_fx's
    proxies and graphs, ``torch/utils`` pytree and the dispatch-mode machinery), builtins
    (C functions, the ATen ops and the autograd engine among them) and the rest."""
    own: dict[str, float] = {}
    for (filename, _, _), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        if "/packages/" in filename:
            where = "aotkit_" + filename.split("/packages/")[1].split("/")[0]
        elif "/torch/" in filename:
            rest = filename.split("/torch/")[-1]
            where = "torch/" + rest.split("/")[0]
        elif filename == "~":
            where = "builtins"
        else:
            where = "other (stdlib, ...)"
        own[where] = own.get(where, 0.0) + tottime
    total = sum(own.values()) or 1.0
    ours = sum(v for k, v in own.items() if k.startswith("aotkit_"))
    rows = [f"own time by location (aotkit's packages together: {ours / total:.1%}):"]
    for where, t in sorted(own.items(), key=lambda kv: -kv[1])[:12]:
        rows.append(f"  {t * 1e3:8.1f} ms {t / total:6.1%}  {where}")
    return "\n".join(rows)


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def _ms(x: float) -> str:
    return "-" if x != x else f"{x * 1e3:.1f}"


def _r(x: float) -> str:
    return "-" if x != x else f"{x:.2f}"


def _mb(x: int | None) -> str:
    return "-" if x is None else f"{x / 2**20:.2f}"


def _table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(f"\n== {title} ==")
    for r in [list(header), *rows]:
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))


def summary(r: PairResult) -> str:
    """One line per finished model and pair, so that a long run shows results as it goes."""
    o, t = r.ours, r.theirs
    return (
        f"ok {r.correct.get(o, '-')}/{r.correct.get(t, '-')}, first o/t "
        f"{_r(r.ratio(r.first, o, t))}, aot o/t {_r(r.ratio(r.aot, o, t))}, steady o/t "
        f"{_r(r.ratio(r.steady, o, t))}, path {r.path}"
    )


def targets_of(results: Sequence[PairResult]) -> list[tuple[str, float, float]]:
    """(label, value, threshold) of every issue-18 target the results measure."""
    targets: list[tuple[str, float, float]] = []
    for r in results:
        o, t = r.ours, r.theirs
        if not r.first:
            continue
        if r.pair == "eager":
            targets.append((f"{r.model} eager: AOT layer ours/theirs", r.ratio(r.aot, o, t), 0.5))
            targets.append((f"{r.model} eager: first step ours/theirs", r.ratio(r.first, o, t), 1.0))
        else:
            targets.append((f"{r.model} inductor: first step ours/theirs", r.ratio(r.first, o, t), 0.9))
            targets.append((f"{r.model} inductor: steady step ours/theirs", r.ratio(r.steady, o, t), 1.02))
        so, st = r.saved.get(o), r.saved.get(t)
        if so is not None and st:
            targets.append((f"{r.model} {r.pair}: saved bytes ours/theirs", so / st, 1.0))
        elif so is not None and st == 0:
            targets.append((f"{r.model} {r.pair}: saved bytes ours-theirs (MB)", so / 2**20, 0.0))
    return targets


def write_json(path: str, s: Settings, results: Sequence[PairResult]) -> None:
    """Every measurement so far (written after each model, so an interrupted run keeps
    what it measured)."""
    with open(path, "w") as f:
        json.dump(
            {
                "torch": torch.__version__,
                "clock": "cpu" if clock is time.process_time else "wall",
                "settings": s.__dict__,
                "results": [{k: v for k, v in r.__dict__.items() if k != "profile"} for r in results],
                "targets": [
                    {"label": lbl, "value": v, "threshold": th} for lbl, v, th in targets_of(results)
                ],
            },
            f,
            indent=1,
        )


def report(results: list[PairResult]) -> list[tuple[str, float, float]]:
    rows = []
    for r in results:
        o, t = r.ours, r.theirs
        rows.append([
            r.model, r.pair, r.correct.get(o, "-"), r.correct.get(t, "-"),
            _ms(r.med(r.first, o)), _ms(r.med(r.first, t)), _r(r.ratio(r.first, o, t)),
            _ms(r.med(r.aot, o)), _ms(r.med(r.aot, t)), _r(r.ratio(r.aot, o, t)),
            _ms(r.med(r.steady, "eager")), _ms(r.med(r.steady, o)), _ms(r.med(r.steady, t)),
            _r(r.ratio(r.steady, o, "eager")), _r(r.ratio(r.steady, t, "eager")),
            _r(r.ratio(r.steady, o, t)),
            _mb(r.saved.get("eager")), _mb(r.saved.get(o)), _mb(r.saved.get(t)),
        ])
    if rows:
        _table(
            "zoo: aotkit (ours) vs torch (theirs); times in ms, medians; ratios ours/theirs",
            ["model", "pair", "ok ours", "ok theirs", "1st ours", "1st theirs", "1st o/t",
             "aot ours", "aot theirs", "aot o/t", "steady eager", "steady ours",
             "steady theirs", "ours/eager", "theirs/eager", "steady o/t", "saved MB eager",
             "saved ours", "saved theirs"],
            rows,
        )
    print("\n== aotkit paths per compiled graph (single pass / native / python, and why not) ==")
    for r in results:
        if r.pair == "eager" or all(x.model != r.model or x.pair == r.pair for x in results):
            print(f"{r.model:16} {r.path}")
    targets = targets_of(results)
    print("\n== targets ==")
    width = max((len(x[0]) for x in targets), default=0)
    for label, value, threshold in targets:
        verdict = "PASS" if value <= threshold else "MISS"
        print(f"{label.ljust(width)}  {value:6.2f} <= {threshold:<4}  {verdict}")
    for r in results:
        for e in r.errors:
            print(f"ERROR {r.model}/{r.pair}: {e}")
        for impl, ok in r.correct.items():
            if ok.startswith("DIFF"):
                print(f"WARNING {r.model}/{r.pair}: {impl} trains differently from eager ({ok})")
    return targets


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", default="", help=f"comma-separated subset of {','.join(MODELS)}")
    ap.add_argument(
        "--set", choices=sorted(SETS), default="default",
        help="the models when --models is not given: default (the 13), wide (zoo_wide.py) or all",
    )
    ap.add_argument("--backends", default="eager,inductor", help="pairs to run: eager, inductor or both")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, for a smoke run")
    ap.add_argument("--json", metavar="FILE", help="write every measurement to FILE")
    ap.add_argument("--profile", action="store_true", help="print the top frames of aotkit's AOT layer per model")
    ap.add_argument("--top", type=int, default=25, help="frames per profile (with --profile)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument(
        "--clock", choices=sorted(CLOCKS), default="wall",
        help="wall (time.perf_counter, default) or cpu (time.process_time: this process only)",
    )
    args = ap.parse_args(argv)
    global clock
    clock = compare.clock = CLOCKS[args.clock]
    names = [m for m in args.models.split(",") if m] or SETS[args.set]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    pairs = [p for p in args.backends.split(",") if p]
    if any(p not in PAIRS for p in pairs):
        ap.error(f"--backends takes a subset of {list(PAIRS)}")
    s = QUICK if args.quick else FULL

    torch.set_num_threads(args.threads)
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 100_000
    warnings.filterwarnings("ignore")
    backends = make_backends()
    started = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"{time.perf_counter() - started:7.1f}s {msg} ...", file=sys.stderr, flush=True)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"torch {torch.__version__}, threads={torch.get_num_threads()}, "
        f"{'quick' if args.quick else 'full'} run, clock={args.clock}, "
        f"load average at start {load:.2f}, "
        f"path hook {'on' if _record_compilations is not None else 'n/a'}"
    )
    results: list[PairResult] = []
    for name in names:
        for pair in pairs:
            r = bench_pair(name, pair, backends, s, progress, args.top if args.profile else 0)
            results.append(r)
            progress(f"[{name}/{pair}] {summary(r)}")
            if args.json:
                write_json(args.json, s, results)
            if r.profile:
                print(f"\n== profile: {name}, {r.ours}, AOT layer of one first step ==")
                print(r.profile)
    report(results)
    if args.json:
        write_json(args.json, s, results)
    print(f"\n(total {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

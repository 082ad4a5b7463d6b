"""The key of an on-disk compile cache entry: everything a compiled entry depends on.

# Note [On-disk cache keys]
# An entry is reused in another process only when the key says the compilation would come
# out the same. The key hashes:
#   * the program: for aot_function/aot_module a fingerprint of the user's code (bytecode,
#     constants and names of every function reached through closures, defaults and the
#     globals it names; modules by class code, extra_repr, plain attributes and training
#     flag, and their hooks by code (See Note [Module hooks in the on-disk cache key]);
#     custom autograd.Functions by the code of forward, backward, setup_context, vjp
#     and jvp, so they are cacheable rather than refused); under torch.compile, dynamo's
#     GraphModule code and its submodules';
#   * every input's metadata: type, dtype, device, layout, sizes, strides, storage offset;
#     for a tensor subclass its class by code, its ``__tensor_flatten__`` context by value
#     and its inner values recursively (See Note [Subclass inputs in the compile key]; a
#     context that is not plain data is Uncacheable, and entries with subclass inputs are
#     not stored yet: See Note [On-disk compile cache])
#     (with symbolic sizes, what the entry's shape facts do not check: See Note [Dynamic
#     shapes in the on-disk cache]),
#     requires_grad, the aliasing pattern (which inputs share storage), and the values of
#     Python scalars (traced as constants);
#   * ambient state, ``ambient_state_key()``: the in-memory compile key's ``ambient_key()``
#     (See Note [Ambient state in the compile key]: grad and inference mode, autocast per
#     device, deterministic algorithms, default dtype, __torch_function__, aotkit's
#     functionalized-RNG switch) plus matmul precision, the whole functorch config and the
#     symbolic-shapes config (``torch.fx.experimental._config``), by their config modules'
#     hashes (dynamo's config is not read by the AOT part: it shapes dynamo's graph, which
#     is keyed by its code);
#   * the configuration: partitioner, compilers (See Note [Compiler cache keys] in
#     aotkit_schemas: a key names the recipe and the process-wide settings it reads, e.g.
#     Inductor's config for aotkit_inductor's partitioner and compilers, See Note
#     [Inductor settings in the on-disk cache key] in aotkit_backends), decompositions (op
#     name plus the decomposition's code; Inductor's config when one comes from Inductor),
#     keep_inference_input_mutations, parameter count, static inputs;
#   * custom operators' code and schemas (See Note [Custom operators in the on-disk cache
#     key] in ``_ops``);
#   * the versions: torch's, the cache format's, and a hash of aotkit's own sources (a
#     development checkout changes without a version bump).
# Modules are fingerprinted with every attribute that is not nn.Module bookkeeping (private
# ones too); tensors a module or a dynamo graph holds by value (See Note [Tensor constants
# in the on-disk cache]).
# Anything the fingerprint cannot describe safely (an object of unknown type in a global,
# a tensor the format cannot store, a symbol no input binds) raises ``Uncacheable``: the
# compilation then simply is not cached. Being unable to cache is never an error.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from aotkit_backends import inductor_settings_key
from aotkit_capture import ambient_key, saved_tensors_hooks_key
from aotkit_functional import leaf_policy
from aotkit_schemas import AOTConfig, Uncacheable, active_joint_passes, compiler_cache_key
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ._fingerprint import PLAIN_TYPES, Fingerprint, global_hooks_key

CACHE_FORMAT = 4  # 2: artifact keys (See Note [Compiled-artifact keys]); 3: a header line;
# 4: nodes as arrays, bare node-name arguments (See Note [Graph nodes in the cache JSON])
_AOTKIT_PACKAGES = (
    "aotkit_schemas", "aotkit_functional", "aotkit_analysis", "aotkit_runtime",
    "aotkit_partitioners", "aotkit_backends", "aotkit_tracing", "aotkit_capture", "aotkit_cache",
    "aotkit_frontends",
)


def ambient_state_key() -> tuple[Any, ...]:
    """The process-wide state a trace depends on besides its inputs: the in-memory compile
    key's ``ambient_key()`` (See Note [Ambient state in the compile key]), plus state an
    entry reused by another process could see changed although today's traces do not read
    it (float32 matmul precision, the functorch configs export and torch's own pipeline
    read): kept in the disk key to be safe, read once per compilation."""
    import torch.fx.experimental._config as fx_config

    fconfig = torch._functorch.config
    return (
        *ambient_key(),
        # which leaf inputs the traces wrap as leaves (Note [Input wrappers that are
        # autograd leaves] in aotkit_functional)
        leaf_policy(),
        torch.get_float32_matmul_precision(),
        # every functorch setting (the partitioners', donated buffers, tokens, tangents...)
        # and the symbolic-shapes settings a fresh ShapeEnv traces with: their config
        # modules' own hashes, cached by torch until a setting changes (a callable
        # setting hashes by its address: a miss in every other process, never a reuse)
        fconfig.get_hash().hex(),
        fx_config.get_hash().hex(),  # type: ignore[attr-defined]
        getattr(fconfig, "functionalize_rng_ops", None),
        getattr(fconfig, "view_replay_for_aliased_outputs", None),
        getattr(fconfig, "activation_memory_budget", None),
        # the traced tangents' layouts (Note [Tangent strides follow the outputs])
        getattr(fconfig, "guess_tangent_strides_as_outputs", None),
    )


@functools.cache
def aotkit_source_hash() -> str:
    """A hash of every aotkit package's Python sources: each file's path, size and
    modification time (a development checkout changes without a version bump; reading
    every file would cost a warm start tens of milliseconds). ``os.scandir``, not
    pathlib: this runs on every warm start, and pathlib's globbing cost milliseconds.
    Computed once per process (every key and every entry read or written needs it): it
    describes the sources the process started with, which are the ones it runs."""
    h = hashlib.sha256()
    for name in _AOTKIT_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            h.update(f"{name}:absent".encode())
            continue
        root = next(iter(spec.submodule_search_locations))
        files: list[tuple[str, int, int]] = []
        _scan_sources(root, "", files)
        for rel, size, mtime in sorted(files):
            h.update(f"{name}/{rel}:{size}:{mtime}".encode())
    return h.hexdigest()


def _scan_sources(path: str, rel: str, out: list[tuple[str, int, int]]) -> None:
    with os.scandir(path) as entries:
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                if e.name != "__pycache__":
                    _scan_sources(e.path, f"{rel}{e.name}/", out)
            elif e.name.endswith(".py"):
                st = e.stat()
                out.append((f"{rel}{e.name}", st.st_size, st.st_mtime_ns))


def symbolic_kind(flat_args: Sequence[Any], cfg: AOTConfig) -> str | None:
    """How a compilation traces symbolic sizes (See Note [Dynamic shapes in the on-disk
    cache]): "fresh" (aot_function(dynamic=True): aotkit makes the ShapeEnv), "caller"
    (a fake mode with a ShapeEnv came with the inputs or dynamo's tracing context, and a
    SymInt or a symbolic fake is among the inputs), or None (static sizes)."""
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode(list(flat_args))
    if mode is None:
        return "fresh" if cfg.dynamic_shapes else None
    if mode.shape_env is None:
        return None
    for a in flat_args:
        if isinstance(a, torch.SymInt):
            return "caller"
        if _is_fake(a) and not all(
            type(d) is int for d in (*a.shape, *a.stride(), a.storage_offset())
        ):
            return "caller"
    return None


def _input_key(flat_args: Sequence[Any], cfg: AOTConfig, kind: str | None) -> list[Any]:
    """Every input's metadata; ``kind`` is ``symbolic_kind(flat_args, cfg)``. With symbolic
    sizes (See Note [Dynamic shapes in the on-disk cache]): the sizes of real inputs past
    the parameters and the values of ints are left to the entry's shape facts; dynamo's
    fakes are keyed by their expressions."""
    from ._symbolic import Canonical

    symbolic = kind is not None
    canon = Canonical()
    storages: dict[int, int] = {}
    out: list[Any] = []

    def tensor(a: torch.Tensor, i: int, where: str) -> tuple[Any, ...]:
        if type(a) not in (torch.Tensor, torch.nn.Parameter) and not _is_fake(a):
            if is_traceable_wrapper_subclass(a):
                return subclass(a, i, where)
            raise Uncacheable(f"{where} is a {type(a).__name__}")
        if a.is_sparse or a.is_mkldnn or a.is_nested:
            raise Uncacheable(f"{where} has layout {a.layout}")
        dims, nbytes = sizes(a, i, where)
        storage = storages.setdefault(a.untyped_storage()._cdata, i)
        return (
            "T", type(a) is torch.nn.Parameter, str(a.dtype), str(a.device), str(a.layout),
            tuple(dims), a.requires_grad, a.is_leaf, storage, nbytes, a._is_view(),
        )

    def sizes(a: torch.Tensor, i: int, where: str) -> tuple[tuple[Any, ...], Any]:
        dims: tuple[Any, ...] = (*a.shape, *a.stride(), a.storage_offset())
        if kind == "caller" and not _is_fake(a):
            dims = _dynamo_dims(a) or dims
        if not all(type(d) is int for d in dims):
            if not symbolic:
                raise Uncacheable(f"{where} has symbolic sizes")
            return tuple(canon.dim(d) for d in dims), None
        if kind == "fresh" and i >= cfg.num_params_buffers:
            return ("dynamic", a.dim()), None
        return dims, a.untyped_storage().nbytes()

    def subclass(a: torch.Tensor, i: int, where: str) -> tuple[Any, ...]:
        # See Note [Subclass inputs in the compile key]: the type by its code, the
        # flatten context by value (plain data only), the inner values recursively
        attrs, ctx = a.__tensor_flatten__()  # type: ignore[attr-defined]
        described = Fingerprint()
        described.cls(type(a), 0)
        try:
            described.value(ctx)
        except Uncacheable as e:
            raise Uncacheable(f"{where}'s {type(a).__name__} context: {e}") from e
        inner: list[Any] = []
        for name in attrs:
            attr = getattr(a, name)
            if isinstance(attr, torch.Tensor):
                inner.append((name, tensor(attr, i, f"{where}.{name}")))
            else:
                described.put("inner value", name)
                described.value(attr)
        dims, _ = sizes(a, i, where)
        return (
            "S", described.hexdigest(), str(a.dtype), str(a.device), tuple(dims),
            a.requires_grad, a.is_leaf, inner,
        )

    for i, a in enumerate(flat_args):
        if isinstance(a, torch.Tensor):
            out.append(tensor(a, i, f"input {i}"))
        elif isinstance(a, torch.SymInt) and symbolic:
            out.append(("SymInt", canon.dim(a)))
        elif type(a) is int and kind == "fresh":
            out.append(("int",))  # a SymInt in the trace
        elif isinstance(a, PLAIN_TYPES):
            out.append((type(a).__name__, a))
        else:
            raise Uncacheable(f"input {i} is a {type(a).__name__}")
    out.append(("shape_env", canon.state()))
    return out


def _dynamo_dims(a: torch.Tensor) -> tuple[Any, ...] | None:
    """A real input's sizes, strides and offset as dynamo fakified it (symbolic where
    dynamo made them so), or None when dynamo did not. Dynamo hands its backend real
    tensors; the trace uses the fakes its tracing context made (the same call: See
    ``_fakify._fakify_tensor``). Keying the real sizes would key a size hint: a warm
    start at another batch size would miss an entry whose shape facts hold."""
    from torch._guards import TracingContext

    tracing = TracingContext.try_get()
    if tracing is None or tracing.fake_mode is None:
        return None
    context = tracing.tensor_to_context.get(a)  # type: ignore[no-untyped-call]
    if context is None:
        return None
    f = tracing.fake_mode.from_tensor(
        a, symbolic_context=context, source=context.tensor_source, trace=False
    )
    return (*f.shape, *f.stride(), f.storage_offset())


def _is_fake(t: torch.Tensor) -> bool:
    return isinstance(t, FakeTensor)


def _callable_key(what: str, fn: Callable[..., Any] | None) -> str | None:
    if fn is None:
        return None
    # See Note [Compiler cache keys]: the key may read process-wide settings
    try:
        key = compiler_cache_key(fn)
    except Exception as e:  # a setting that cannot be described: not cached
        raise Uncacheable(f"the {what}'s settings cannot be described: {e}") from e
    if key is None:
        raise Uncacheable(f"the {what} {getattr(fn, '__qualname__', fn)!r} offers no cache key "
                          "(aotkit_schemas.mark_cache_key)")
    return key


def _decomposition_key(table: Any) -> list[Any]:
    items: list[Any] = []
    inductor = False
    for op, fn in table.items():
        fp = Fingerprint()
        fp.value(fn)
        items.append((str(op), fp.hexdigest()))
        inductor = inductor or (getattr(fn, "__module__", None) or "").startswith("torch._inductor")
    items.sort()
    if inductor:
        # Inductor's decompositions read its config while they trace (See Note [Inductor
        # settings in the on-disk cache key] in aotkit_backends)
        try:
            items.append(("inductor settings", inductor_settings_key()))
        except Exception as e:  # a setting that cannot be described: not cached
            raise Uncacheable(f"the decompositions' settings cannot be described: {e}") from e
    return items


def entry_key(identity: str, flat_args: Sequence[Any], cfg: AOTConfig) -> str:
    """The cache key of compiling the program ``identity`` for ``flat_args`` under ``cfg``
    and the current ambient state. Raises Uncacheable. See Note [On-disk cache keys]."""
    if cfg.is_export or cfg.pre_dispatch:
        raise Uncacheable("exports are not cached")
    if saved_tensors_hooks_key() is not None:  # See Note [Inlined saved-tensors hooks]
        raise Uncacheable("compilations that inline GraphModule saved tensors hooks are not cached")
    from ._ops import custom_ops_key  # it fingerprints with this module's tools

    symbolic = symbolic_kind(flat_args, cfg)
    parts = [
        ("format", CACHE_FORMAT),
        ("torch", torch.__version__),
        ("aotkit", aotkit_source_hash()),
        ("program", identity),
        ("inputs", _input_key(flat_args, cfg, symbolic)),
        ("ambient", [repr(x) for x in ambient_state_key()]),
        ("partitioner", _callable_key("partitioner", cfg.partition_fn)),
        ("fw", _callable_key("forward compiler", cfg.fw_compiler)),
        ("bw", _callable_key("backward compiler", cfg.bw_compiler)),
        ("inference", _callable_key("inference compiler", cfg.inference_compiler)),
        ("decompositions", _decomposition_key(cfg.decompositions)),
        # See Note [Joint graph passes]: a pass without a cache key turns the cache off
        ("joint passes", [_callable_key("joint pass", p) for p in active_joint_passes(cfg)]),
        # the entry stores the graphs' descriptors (See Note [Graph descriptors])
        ("input descriptors", [repr(d) for d in cfg.input_descs or ()]),
        ("module hooks", global_hooks_key()),  # See Note [Module hooks in the on-disk cache key]
        ("custom ops", custom_ops_key()),  # See Note [Custom operators in the on-disk cache key]
        ("config", symbolic, cfg.keep_inference_input_mutations, cfg.disable_functionalization,
         cfg.num_params_buffers, cfg.no_tangents, tuple(cfg.static_input_indices or ())),
    ]
    return hashlib.sha256(repr(parts).encode()).hexdigest()

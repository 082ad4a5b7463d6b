"""Inductor's FX-graph-cache key as aotkit's compiled-artifact key: a warm start loads
Inductor's artifact without recomputing Inductor's cache key.

# Note [Inductor artifact keys]
# On a warm start, aotkit's on-disk cache restores the forward and backward graphs and
# hands them to ``aotkit_inductor``'s compilers again. ``compile_fx_inner`` then computes
# Inductor's FX-graph-cache key before it can find its artifact: it pickles and hashes the
# graph, Inductor's whole config and, once per process, the sources of torch and triton
# (``torch_key``/``triton_key``: about 0.4 s of CPU, most of a small model's warm start).
# torch's AOTAutogradCache avoids the per-graph part by storing the FX-graph-cache key in
# its entry; aotkit does the same through Note [Compiled-artifact keys] in aotkit_schemas:
#   * Cold: when ``compile_fx_inner`` compiled (or found) a graph under an FX-graph-cache
#     key, the compiler records ``fxgraph/<settings hash>/<Inductor's key>`` on the graph
#     it was given; the disk cache stores it with the graph.
#   * Warm: before compiling, the compiler reads the handle off the restored graph. If the
#     settings hash is today's, it asks Inductor's cache for the artifact by that key
#     (``FxGraphCache.load_with_key``: Inductor reads its own cache directory; aotkit
#     unpickles nothing) and runs Inductor's post-load step, as ``compile_fx_inner`` does on
#     a hit. A missing artifact, another settings hash, or any error falls back to the full
#     ``compile_fx_inner``, which recomputes the key and compiles on a miss.
# Why the stored key still names the right artifact: Inductor's key is a function of the
# graph, its example inputs' metadata, the compile's keyword arguments and the settings
# ``FxGraphHashDetails`` collects. aotkit's own entry key already fixes the graph (the
# restored graph is the one that was compiled), but not all of its inputs' layouts: the
# backward's saved-tensor inputs take the strides the compiled forward gave them (See Note
# [Saved tensors keep the compiled forward's strides] in aotkit_capture), and a warm
# forward that is compiled rather than loaded (its artifact gone, or compiled without
# layout optimization: See Note [Layout optimization in aotkit_inductor] in
# aotkit_frontends) may give them other strides than the cold one did, so a warm backward
# may get contiguous inputs where the cold one got channels-last (the stored artifact then
# failed its stride asserts). Nor does Inductor's key hash the graph's node meta, where the
# forward's user-visible outputs are marked (which outputs keep the trace's strides: See
# Note [Inductor's graph roles]). The settings hash covers the inputs' layouts, the
# user-visible mark and every other part, read directly and cheaply:
#   * Inductor's and its comms config (``save_config_portable``, as Inductor hashes them),
#     the cache-key tag, the compile's keyword arguments (role, static inputs), deterministic
#     algorithms, default dtype, matmul settings, thread count, provenance tracking,
#     compile-on-one-rank;
#   * the sources of torch and triton by each file's path, size and modification time
#     (``torch_key``/``triton_key`` read and hash every byte: most of the cost avoided) plus
#     torch's version and git revision, CUDA/HIP versions and the devices' names and
#     Inductor device interfaces' cache information, as ``CacheBase.get_system`` reads them;
#   * ``config.pre_grad_custom_pass`` by its passes' ``uuid()``, as Inductor's key holds it.
# Anything the hash cannot describe turns the handle off (the compile then goes through
# ``compile_fx_inner`` as before): a pre-grad custom pass without ``uuid()``, other custom
# graph passes or partitioner, custom backend
# passes or codegen configs, a cudagraph policy or annotation, a remote FX graph cache,
# caches disabled, bundled autograd cache, AOT mode, symbolic inputs Inductor cannot guard
# (See Note [Inductor artifact keys for dynamic shapes]), a graph with higher-order ops or
# constants, and a torch whose ``FxGraphHashDetails`` collects other fields than the ones
# listed here (checked on its code, once per process).
#
# Note [Inductor artifact keys for dynamic shapes]
# A graph with symbolic sizes gets a handle too, used as Inductor's FX graph cache uses
# its own key. Inductor's key of such a graph hashes the sizes as expressions; the
# artifact carries ``guards_expr``, the guards Inductor's compile added, over the graph's
# SymInt inputs (``produce_guards_expression``): on a hit Inductor evaluates it on the
# inputs' hints, picks the artifact of that key whose guards hold, and evaluates it on the
# SymInts, which adds those guards to the ShapeEnv (so dynamo guards on them). The warm
# load does exactly that (``load_with_key`` with Inductor's default guard evaluation), so
# an artifact whose guards do not hold for today's sizes is not used: the graph is
# compiled. aotkit's entry already fixes the graph and its sizes' expressions (its shape
# facts, See Note [Dynamic shapes in the on-disk cache] in aotkit_cache), up to the
# symbols' names, which neither the guards (positional over the SymInt inputs) nor the
# compiled code (sizes read from the inputs) depend on. Handles are recorded and used only
# where that guard check sees every symbol: each symbol of a tensor input's sizes, strides
# or offset is a SymInt input (as in dynamo's graphs and the backward's saved sizes), each
# SymInt input is a plain symbol, the TracingContext has a ShapeEnv, and it holds no hint
# overrides. torch's AOTAutogradCache instead requires the exact guard expression it
# stored, relying on its own guards.
"""

from __future__ import annotations

import dis
import functools
import hashlib
import importlib.util
import json
import os
import re
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from aotkit_schemas import artifact_key, get_logger, record_artifact_key

from ._inductor_passes import USER_VISIBLE_OUTPUTS_KEY

_log = get_logger("compile")

_PREFIX = "fxgraph"
_INDUCTOR_KEY = re.compile(r"[a-z0-9]{8,128}")
# the fields FxGraphHashDetails.__init__ sets in the torch this was written against: a
# torch that collects other settings turns the handles off (See Note [Inductor artifact keys])
_KNOWN_DETAILS = frozenset({
    "_custom_partitioner_fn", "_fuse_ddp_communication_passes", "_post_fusion_custom_pass",
    "_pre_fusion_custom_pass", "cache_key_tag", "compile_on_one_rank",
    "cpp_runtime_thread_count", "cuda_matmul_settings", "cudagraph_annotation",
    "cudagraph_override", "custom_backend_codegen_configs",
    "custom_backend_codegen_implications", "custom_backend_passes",
    "default_cuda_device_index", "default_dtype", "deterministic_algorithms_settings",
    "example_inputs", "fx_kwargs", "gm", "inductor_config", "inductor_config_comms",
    "joint_custom_post_pass", "joint_custom_pre_pass", "nested_inductor_config_patches",
    "post_grad_custom_post_pass", "post_grad_custom_pre_pass", "pre_grad_custom_pass",
    "precompile_enabled", "provenance_tracking_level", "provenance_tracking_to_timeline",
    "system_info", "torch_version", "user_defined_triton_source", "var_to_hint_override",
})
# compile_fx_inner's defaults for the keyword arguments aotkit does not pass
_DEFAULT_KWARGS: dict[str, Any] = {
    "cudagraphs": None, "static_input_idxs": (), "is_backward": False, "graph_id": None,
    "cpp_wrapper": False, "fx_wrapper": False, "is_inference": False,
    "boxed_forward_device_index": None, "layout_opt": None, "extern_node_serializer": None,
}


# torch_key hashes torch's Python sources and three files of Inductor's AOT runtime
_TORCH = (".py", "interface.cpp", "streams.h", "script.ld")


class _NoHandle(Exception):
    """The settings cannot be described: no handle."""


@functools.cache
def _details_fields_known() -> bool:
    from torch._inductor.codecache import FxGraphHashDetails

    stored = {
        i.argval
        for i in dis.get_instructions(FxGraphHashDetails.__init__)
        if i.opname == "STORE_ATTR"
    }
    return stored == _KNOWN_DETAILS


def _scan(path: str, out: list[str], suffixes: tuple[str, ...]) -> None:
    with os.scandir(path) as entries:
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                if e.name != "__pycache__":
                    _scan(e.path, out, suffixes)
            elif e.name.endswith(suffixes):
                st = e.stat()
                out.append(f"{e.path}:{st.st_size}:{st.st_mtime_ns}")


@functools.cache
def _package_stamp(name: str, suffixes: tuple[str, ...]) -> str | None:
    """The path, size and modification time of each of a package's files ending in one of
    ``suffixes`` (None when it is not installed): the files ``torch_key``/``triton_key``
    hash (torch's Python sources; triton's, and its compiler library)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    files: list[str] = []
    for root in spec.submodule_search_locations:
        _scan(root, files, suffixes)
    h = hashlib.sha256("\n".join(sorted(files)).encode())
    return h.hexdigest()


@functools.cache
def _system() -> dict[str, Any]:
    """What ``CacheBase.get_system`` reads, triton's source hash replaced by a stamp."""
    system: dict[str, Any] = {
        "torch": [torch.__version__, torch.version.git_version, _package_stamp("torch", _TORCH)],
        "triton": _package_stamp("triton", (".py", ".so", ".pyd")),
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        system["device"] = props.name if torch.version.cuda is not None else props.gcnArchName
    from torch._dynamo.device_interface import get_registered_device_interfaces

    interfaces: dict[str, Any] = {}
    for name, interface in get_registered_device_interfaces():
        if ":" in name or not interface.is_available():
            continue
        info = interface.get_cache_system_info()
        if info is not None:
            interfaces[name] = info
    system["interfaces"] = interfaces
    return system


def _passes_describable() -> list[Any]:
    from torch._inductor import config
    from torch._inductor.codegen.common import (
        custom_backend_codegen_configs,
        custom_backend_passes,
    )

    for name in (
        "post_grad_custom_pre_pass", "post_grad_custom_post_pass",
        "joint_custom_pre_pass", "joint_custom_post_pass", "custom_partitioner_fn",
        "cudagraph_policy",
    ):
        if getattr(config, name, None):
            raise _NoHandle(f"config.{name} is set")
    if any(v is not None for v in custom_backend_passes.values()) or any(
        v is not None for v in custom_backend_codegen_configs.values()
    ):
        raise _NoHandle("custom backend passes or codegen configs")
    named: list[Any] = [_pre_grad_uuids(config.pre_grad_custom_pass)]
    for name in ("_pre_fusion_custom_pass", "_post_fusion_custom_pass",
                 "_fuse_ddp_communication_passes"):
        value = getattr(config, name, None)
        items = value if isinstance(value, list | tuple) else [value]
        if not all(v is None or isinstance(v, str) for v in items):
            raise _NoHandle(f"config.{name} holds a callable")
        named.append(value)
    return named


def _pre_grad_uuids(custom: Any) -> list[Any] | None:
    """``config.pre_grad_custom_pass`` as Inductor's FX-graph-cache key describes it: each
    pass by its ``uuid()`` (aotkit_inductor has run them before compiling: See Note
    [Inductor pre-grad passes]). Raises _NoHandle for a pass without one."""
    from torch._inductor.custom_graph_pass import CustomGraphPass, get_custom_graph_passes

    passes = get_custom_graph_passes(custom)
    if not passes:
        return None
    uuids = []
    for p in passes:
        uuid = p.uuid() if isinstance(p, CustomGraphPass) else None
        if not isinstance(uuid, str | bytes) or not uuid:
            raise _NoHandle("config.pre_grad_custom_pass holds a pass without uuid()")
        uuids.append(uuid if isinstance(uuid, str) else uuid.hex())
    return uuids


def _input_layouts(fake_inputs: Sequence[Any]) -> list[Any]:
    """Each example input's dtype, device, sizes, strides and offset (symbolic ones by
    their expressions). See Note [Inductor artifact keys]: the backward's inputs take the
    strides the compiled forward gave them, which the restored graph does not fix. As in
    Inductor's own key (``extract_tensor_metadata_for_cache_key``), the offset counts
    only for inputs Inductor marks static: its code does not depend on other inputs'
    offsets, and a restored graph's values do not keep them (the cold backward's saved
    query/key/value views had offsets, the restored ones none, so the handle missed)."""
    out: list[Any] = []
    for x in fake_inputs:
        if isinstance(x, torch.Tensor):
            offset = str(x.storage_offset()) if hasattr(x, "_is_inductor_static") else "0"
            out.append([str(x.dtype), str(x.device), [str(d) for d in x.shape],
                        [str(d) for d in x.stride()], offset])
        else:
            out.append(type(x).__name__)
    return out


def _user_visible(gm: torch.fx.GraphModule) -> Any:
    """The user-visible mark on ``gm``'s output node (See Note [Inductor artifact keys])."""
    marked = gm.graph.find_nodes(op="output")[0].meta.get(USER_VISIBLE_OUTPUTS_KEY)
    return None if marked is None else [int(i) for i in marked]


def _settings_hash(
    kwargs: dict[str, Any], fake_inputs: Sequence[Any], gm: torch.fx.GraphModule
) -> str:
    """See Note [Inductor artifact keys]. Raises _NoHandle."""
    from torch._inductor import config
    from torch._inductor.utils import should_use_remote_fx_graph_cache
    from torch._inductor.virtualized import V

    if not _details_fields_known():
        raise _NoHandle("this torch's FX graph cache key collects other settings")
    if (
        config.force_disable_caches
        or not config.fx_graph_cache
        or should_use_remote_fx_graph_cache()
        or V.aot_compilation
        or torch._functorch.config.bundled_autograd_cache
        or config.save_args
    ):
        raise _NoHandle("the FX graph cache is off, remote, or bundled")
    from torch._inductor import config_comms

    fx_kwargs = {k: v for k, v in kwargs.items() if k not in ("graph_id", "compile_region_name")}
    settings = {
        "system": _system(),
        "config": config.save_config_portable(ignore_private_configs=False, readonly_values=True),
        "comms": config_comms.save_config_portable(  # type: ignore[attr-defined]
            ignore_private_configs=False, readonly_values=True
        ),
        "passes": _passes_describable(),
        "tag": torch.compiler.config.cache_key_tag,
        "kwargs": {k: list(v) if isinstance(v, tuple) else v for k, v in fx_kwargs.items()},
        "cudagraphs": bool(config.triton.cudagraphs),
        "deterministic": [
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.utils.deterministic.fill_uninitialized_memory,  # type: ignore[attr-defined]
        ],
        "threads": [torch.get_num_threads(), config.cpp.threads, config.cpp.dynamic_threads],
        "provenance": [config.effective_provenance_tracking_level(),
                       config.trace.provenance_tracking_to_timeline],
        "dtype": str(torch.get_default_dtype()),
        "matmul": [
            str(torch.backends.cuda.matmul.fp32_precision),
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
            torch.get_float32_matmul_precision(),
        ],
        "coor": _coor(),
        "inputs": _input_layouts(fake_inputs),
        "user_visible": _user_visible(gm),
    }
    try:
        text = json.dumps(settings, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise _NoHandle(f"a setting has no JSON form ({e})") from e
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _coor() -> bool:
    from torch.fx.experimental.proxy_tensor import _coor_enabled

    return bool(_coor_enabled())


def full_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``compile_fx_inner``'s keyword arguments with its defaults filled in."""
    return {**_DEFAULT_KWARGS, **kwargs}


def _graph_describable(gm: torch.fx.GraphModule, fake_inputs: Sequence[Any]) -> bool:
    """Whether the graph's inputs are symbolic (See Note [Inductor artifact keys for
    dynamic shapes]). Raises _NoHandle."""
    if "cudagraph_annotation" in gm.meta:
        raise _NoHandle("a cudagraph annotation")
    if any(n.op == "get_attr" for n in gm.graph.nodes):
        raise _NoHandle("a graph with constants or higher-order-op subgraphs")
    if not any(isinstance(x, torch.Tensor) for x in fake_inputs):
        raise _NoHandle("no tensor inputs")
    bound: set[Any] = set()
    used: set[Any] = set()
    for x in fake_inputs:
        if isinstance(x, torch.SymFloat | torch.SymBool):
            raise _NoHandle("symbolic float or bool inputs")
        if isinstance(x, torch.SymInt):
            expr = x.node.expr
            if not expr.is_Symbol:
                raise _NoHandle("a SymInt input that is not a plain symbol")
            bound.add(expr)
        elif isinstance(x, torch.Tensor):
            for d in (*x.shape, *x.stride(), x.storage_offset()):
                if isinstance(d, torch.SymInt):
                    used |= d.node.expr.free_symbols
    if not bound and not used:
        return False
    if not used <= bound:
        raise _NoHandle("a symbolic size no SymInt input binds (Inductor cannot guard it)")
    shape_env = _shape_env()
    if shape_env is None or shape_env.var_to_hint_override:
        raise _NoHandle("no ShapeEnv to check Inductor's guards in, or hint overrides")
    return True


def _shape_env() -> Any:
    context = torch._guards.TracingContext.try_get()
    mode = None if context is None else context.fake_mode
    return None if mode is None else mode.shape_env


def remember(
    gm: torch.fx.GraphModule, compiled: Any, fake_inputs: Sequence[Any], kwargs: dict[str, Any]
) -> None:
    """After ``compile_fx_inner(copy of gm, fake_inputs, **kwargs)`` returned ``compiled``:
    record its FX-graph-cache key on ``gm`` when a warm start can use it. See Note
    [Inductor artifact keys]."""
    from torch._inductor.output_code import CompiledFxGraph

    key = getattr(compiled, "_fx_graph_cache_key", None)
    if not isinstance(compiled, CompiledFxGraph) or not isinstance(key, str):
        return
    if not _INDUCTOR_KEY.fullmatch(key):
        return
    try:
        if not _graph_describable(gm, fake_inputs) and compiled.guards_expr:
            return  # guards without symbolic inputs: not a case Inductor makes
        settings = _settings_hash(full_kwargs(kwargs), fake_inputs, gm)
        record_artifact_key(gm, f"{_PREFIX}/{settings}/{key}")
    except _NoHandle as e:
        _log.debug("Inductor's cache key not stored with the graph: %s", e)
    except Exception as e:  # an optimization only: never an error
        _log.debug("Inductor's cache key not stored with the graph (%s: %s)", type(e).__name__, e)


def load(gm: torch.fx.GraphModule, fake_inputs: list[Any], kwargs: dict[str, Any]) -> Any:
    """Inductor's compiled artifact for ``gm`` by the handle restored on it, ready to run
    (Inductor's post-load step done), or None: no handle, settings changed, artifact
    missing, or any error. See Note [Inductor artifact keys]."""
    handle = artifact_key(gm)
    if handle is None:
        return None
    parts = handle.split("/")
    if len(parts) != 3 or parts[0] != _PREFIX or not _INDUCTOR_KEY.fullmatch(parts[2]):
        return None
    try:
        symbolic = _graph_describable(gm, fake_inputs)
        graph_kwargs = full_kwargs(kwargs)
        if _settings_hash(graph_kwargs, fake_inputs, gm) != parts[1]:
            _log.debug("Inductor's settings or the inputs' layouts changed since the graph "
                       "was cached; compiling")
            return None
        return _load_by_key(parts[2], gm, fake_inputs, graph_kwargs, symbolic)
    except _NoHandle as e:
        _log.debug("not loading Inductor's artifact by key: %s", e)
    except Exception as e:  # fall back to compile_fx_inner, which recomputes the key
        _log.debug("loading Inductor's artifact by key failed (%s: %s); compiling",
                   type(e).__name__, e)
    return None


def _load_by_key(
    key: str, gm: torch.fx.GraphModule, fake_inputs: list[Any], graph_kwargs: dict[str, Any],
    symbolic: bool,
) -> Any:
    import torch._inductor.async_compile
    from torch._inductor import config
    from torch._inductor.codecache import FxGraphCache
    from torch._inductor.output_code import CompiledFxGraphConstantsWithGm
    from torch._inductor.utils import BoxedBool
    from torch.utils._python_dispatch import _disable_current_modes

    def no_guards(guards_expr: str, hints: Any) -> bool:
        return not guards_expr  # handles are only recorded for artifacts without guards

    with _disable_current_modes():  # as compile_fx_inner: the caller's fake mode is active
        torch._inductor.async_compile.CompiledTritonKernels.cache_clear()  # type: ignore[no-untyped-call]
        constants = CompiledFxGraphConstantsWithGm(gm)
        compiled, _ = FxGraphCache.load_with_key(
            key,
            [],
            fake_inputs,
            local=True,
            remote_cache=None,
            is_backward=bool(graph_kwargs["is_backward"]),
            constants=constants,
            # symbolic: Inductor's own check of the artifact's guards against the inputs'
            # hints, which also adds them to the ShapeEnv (See Note [Inductor artifact
            # keys for dynamic shapes])
            evaluate_guards=None if symbolic else no_guards,
        )
        if compiled is None:
            _log.debug("Inductor's artifact %s is gone; compiling", key)
            return None
        strides = compiled.output_strides
        outputs = gm.graph.find_nodes(op="output")[0].args[0]
        if strides is not None and len(strides) != len(outputs):
            _log.debug("Inductor's artifact %s returns another number of outputs", key)
            return None
        compiled._fx_graph_cache_key = key
        if graph_kwargs.get("cudagraphs") is None:
            graph_kwargs["cudagraphs"] = BoxedBool(config.triton.cudagraphs)
        compiled.post_compile(fake_inputs, constants, graph_kwargs)  # type: ignore[arg-type]
    return compiled

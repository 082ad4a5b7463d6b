"""Which tracing path a compilation takes, why, and a hook to observe it.

# Note [Why a graph took the path it took]
# compile_flat traces a training program in one of three ways, fastest first:
#   * ``single pass``: one native trace yields the metadata and the joint (Note
#     [Single-pass joint trace]);
#   * ``native``: the metadata pass, then a joint traced with the C++ Functionalize key
#     (Note [Native functionalization] in aotkit_functional);
#   * ``python``: the metadata pass, then a joint traced under torch's Python
#     FunctionalTensorMode (always right, slowest);
# and an inference program (nothing needs a gradient) as ``inference``. Every decision
# that rules a faster path out names its cause in one short sentence: the first op or
# input property that sent the program to the slower flow. ``CompiledArtifacts`` carries
# them (``single_pass_skipped``, ``native_skipped``; ``path`` and ``path_reason`` sum them
# up), and ``record_compilations()`` collects the artifacts of every compilation made
# while it is active, including those of entry points that do not return them
# (``aot_module_simplified``, the torch.compile backends). It is a debugging aid: the
# recorded artifacts keep their graphs alive, so do not leave it on in a long run.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from aotkit_analysis import InputLayout
from aotkit_runtime import is_subclass
from aotkit_schemas import AOTConfig, OutputType, ViewAndMutationMeta

_RECORDERS: list[list[Any]] = []
_SINGLE_PASS_REFUSED: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "aotkit_single_pass_refused", default=None
)


@contextlib.contextmanager
def refuse_single_pass(reason: str | None) -> Iterator[None]:
    """Compilations inside the block skip the single pass, for ``reason`` (a frontend that
    knows the program holds what the single pass cannot trace, such as the
    ``invoke_subgraph`` calls of shared regions, says so before tracing rather than after
    a failed attempt). None changes nothing. See Note [Why a graph took the path it took]."""
    token = _SINGLE_PASS_REFUSED.set(reason) if reason is not None else None
    try:
        yield
    finally:
        if token is not None:
            _SINGLE_PASS_REFUSED.reset(token)


@contextlib.contextmanager
def record_compilations() -> Iterator[list[Any]]:
    """Collect the ``CompiledArtifacts`` of every compilation made inside the block.

    ``with record_compilations() as compiled: ...`` then read ``compiled[i].path`` and
    ``compiled[i].path_reason``. See Note [Why a graph took the path it took].
    """
    records: list[Any] = []
    _RECORDERS.append(records)
    try:
        yield records
    finally:
        # by identity: two recorders that saw the same compilations compare equal
        del _RECORDERS[next(i for i, r in enumerate(_RECORDERS) if r is records)]


def notify_compiled(artifacts: Any) -> None:
    """Hand ``artifacts`` to every active ``record_compilations`` block."""
    for records in _RECORDERS:
        records.append(artifacts)


def single_pass_blocker(
    flat_args: Sequence[Any], layout: InputLayout, cfg: AOTConfig, shape_env: Any
) -> str | None:
    """Why Note [Single-pass joint trace] is not tried (None: it is): it takes training
    calls (grad mode on, an input requiring grad) with static shapes and no duplicated
    inputs or inputs sharing memory, outside export."""
    if (refused := _SINGLE_PASS_REFUSED.get()) is not None:
        return refused
    if shape_env is not None and _has_symbolic_sizes(flat_args):
        return "dynamic shapes"
    if cfg.is_export:
        return "export"
    if cfg.disable_functionalization:  # See Note [Tracing without functionalization]
        return "functionalization is disabled"
    if not layout.is_trivial:
        return "duplicated inputs"
    if not torch.is_grad_enabled():
        return "grad mode is off"
    if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in flat_args):
        return "no input requires grad"
    # inputs that share memory need the two-pass flow's synthetic bases as soon as one of
    # them is mutated, which only the metadata pass can tell
    if _inputs_share_storage(flat_args):
        return "inputs share memory"
    # See Note [Tensor subclasses are desugared] in aotkit_schemas
    if any(is_subclass(a) for a in flat_args):
        return "a tensor subclass input"
    return None


def _has_symbolic_sizes(flat_args: Sequence[Any]) -> bool:
    """Whether a size, stride or offset of an input, or an input itself, is symbolic."""
    for a in flat_args:
        if isinstance(a, torch.SymInt | torch.SymFloat | torch.SymBool):
            return True
        if isinstance(a, torch.Tensor) and not (a.is_sparse or a.is_mkldnn):
            if any(not isinstance(s, int) for s in (*a.shape, *a.stride(), a.storage_offset())):
                return True
    return False


def _inputs_share_storage(flat_args: Sequence[Any]) -> bool:
    storages: set[int] = set()
    for a in flat_args:
        if isinstance(a, torch.Tensor) and not (a.is_sparse or a.is_mkldnn):
            s = a.untyped_storage()._cdata
            if s in storages:
                return True
            storages.add(s)
    return False


def native_blocker(meta: ViewAndMutationMeta, cfg: AOTConfig, layout: InputLayout) -> str | None:
    """Why the joint is not traced with the C++ Functionalize key (None: it is). See Note
    [Native functionalization] in aotkit_functional.

    Only programs without input mutations, aliased outputs or aliased inputs qualify: there
    the joint is op for op the one torch's Python mode traces (minus no-op detach nodes).
    Mutation and aliasing programs, and exports, keep torch's exact graph text (view
    replay numbers its nodes differently on the native path).
    """
    if cfg.disable_functionalization:  # See Note [Tracing without functionalization]
        return "functionalization is disabled"
    if not meta.native_functionalization_ok:
        return meta.native_functionalization_blocker or "the metadata pass ran a Python-mode op"
    if cfg.is_export:
        return "export"
    if not layout.is_trivial:
        return "duplicated or aliased inputs"
    if meta.mutated_inp_runtime_indices or meta.mutated_inp_in_graph_indices:
        return "an input is mutated"
    if meta.num_intermediate_bases or any(
        o.output_type is not OutputType.non_alias for o in meta.output_info
    ):
        return "an output is an alias"
    return None


def describe_failure(e: BaseException) -> str:
    """One line naming a failed attempt's cause."""
    first = str(e).strip().splitlines()
    text = first[0] if first else ""
    return text if type(e).__name__ == "NotSinglePass" else f"{type(e).__name__}: {text}"

"""Which inputs may reuse a compiled entry.

# Note [Compile cache keys]
# torch's aot_function compiles once and reuses the graph for any later inputs. aotkit keys
# its compiled entries on what the graph was specialized to, so that a graph is never run
# on inputs it was not traced for:
#   * the aliasing pattern of the inputs (Note [Duplicate and aliased inputs]): which are
#     the same tensor, which share a storage, with their strides and offsets (sizes too
#     with dynamic shapes), and which tensor each of those is a view of, all of which
#     decide the synthetic bases;
#   * grad mode and each tensor's requires_grad (they decide inference vs training), and
#     whether one that requires grad is an autograd leaf and not a view (autocast caches
#     its casts of those only: See Note [Autocast's cast cache in the trace]);
#   * the rest of the ambient state that changes a trace: autocast, inference mode,
#     deterministic algorithms, default dtype, ... (Note [Ambient state in the compile key]);
#   * dtype, device, layout and number of dimensions of every tensor;
#   * with static shapes, every size and stride; with dynamic shapes, the ShapeEnv's
#     guards, checked against the new sizes (a violation triggers a retrace, see
#     Note [Shape guards]);
#   * the values of non-tensor inputs that the trace baked in as constants: every kind in
#     VALUE_KINDS (int, float by bit pattern, bool, str, complex, None, dtype, device,
#     layout, memory_format) and opaque constants (every Enum) by type and value; other
#     kinds are refused at compile time unless the graph takes them as inputs (See Note
#     [Non-tensor inputs] in aotkit_capture);
#   * the type of every tensor that is not a plain tensor or parameter, and for a tensor
#     subclass its ``__tensor_flatten__`` context by value and its inner tensors'
#     metadata, recursively (See Note [Subclass inputs in the compile key] in
#     aotkit_capture; a context the key cannot hold is refused).
# The ShapeEnv guards of a dynamic entry: See Note [Shape guards] in aotkit_capture.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from aotkit_capture import VALUE_KINDS, ambient_key, is_opaque_constant, subclass_key
from torch.utils._python_dispatch import is_traceable_wrapper_subclass


def _alias_key(flat_args: Sequence[Any], *, with_shapes: bool) -> tuple[Any, ...]:
    ids: dict[int, int] = {}
    storages: dict[int, int] = {}
    shared: set[int] = set()
    key: list[Any] = []
    n_tensors = 0
    for i, a in enumerate(flat_args):
        if isinstance(a, torch.Tensor):
            n_tensors += 1
            first = ids.setdefault(id(a), i)
            if first != i:
                key.append(("dup", i, first))
                continue
            if a.is_sparse or a.is_mkldnn:
                continue
            s = a.untyped_storage()._cdata
            other = storages.setdefault(s, i)
            if other != i:
                key.append(("alias", i, other, a.storage_offset(), tuple(a.stride())))
                if with_shapes:
                    b = flat_args[other]
                    key.append((a.shape, b.shape, b.stride(), b.storage_offset()))
                shared.update((i, other))
    if shared:
        key.append(("bases", _view_bases(flat_args, sorted(shared), ids)))
    return tuple(key)


def _view_bases(
    flat_args: Sequence[Any], indices: Sequence[int], ids: dict[int, int]
) -> tuple[Any, ...]:
    """For inputs that share a storage: which input, or which other tensor (numbered in
    order of appearance), each one is an autograd view of. The synthetic base of a
    group is chosen by these relations (See Note [Duplicate and aliased inputs])."""
    others: dict[int, int] = {}
    out: list[Any] = []
    for i in indices:
        base = flat_args[i]._base
        if base is None:
            out.append(None)
        elif id(base) in ids:
            out.append(("input", ids[id(base)]))
        else:
            out.append(("tensor", others.setdefault(id(base), len(others))))
    return tuple(out)


def input_key(
    flat_args: Sequence[Any], *, dynamic: bool, num_static: int = 0
) -> tuple[Any, ...]:
    """The cache key of Note [Compile cache keys] (minus ShapeEnv guards).

    With ``dynamic``, the first ``num_static`` inputs (those fakified with static shapes)
    keep their sizes and strides in the key; see Note [Shape guards].
    """
    parts: list[Any] = [ambient_key()]
    for i, a in enumerate(flat_args):
        if isinstance(a, torch.Tensor):
            rg = a.requires_grad
            # See Note [Autocast's cast cache in the trace] in aotkit_tracing
            leaf = rg and a.is_leaf and not a._is_view()
            static = not dynamic or i < num_static
            part: tuple[Any, ...] = (
                (a.dtype, a.device, a.layout, a.shape, a.stride(), rg, leaf, a.storage_offset())
                if static
                else (a.dtype, a.device, a.layout, a.dim(), rg, leaf)
            )
            cls = type(a)
            if cls is not torch.Tensor and cls is not torch.nn.Parameter:
                # See Note [Subclass inputs in the compile key] in aotkit_capture
                part = (*part, _tensor_kind(a, i, static))
            parts.append(part)
        elif type(a) is int:
            parts.append(int if dynamic else (int, a))
        elif type(a) is float:
            # hex tells -0.0 from 0.0 and keys a nan by value: See Note [Non-tensor inputs]
            parts.append((float, a.hex()))
        elif isinstance(a, VALUE_KINDS) or is_opaque_constant(a):
            # an Enum member is an opaque constant: See Note [Non-tensor inputs]
            parts.append((type(a), a))
        else:
            # graph inputs (SymInt, ScriptObject, opaque objects): See Note [Non-tensor inputs]
            parts.append(type(a))
    if len(flat_args) > 1:
        parts.append(_alias_key(flat_args, with_shapes=dynamic))
    return tuple(parts)


def _tensor_kind(a: torch.Tensor, i: int, static: bool) -> Any:
    """The key part of a tensor's type: a subclass's key, or the type itself."""
    if is_traceable_wrapper_subclass(a):
        return subclass_key(a, with_shapes=static, where=f"flat input {i}")
    return ("type", type(a))


def describe_flat_input(in_spec: Any, num_params_buffers: int, index: int) -> str:
    """Name flat input ``index`` of ``(args, kwargs)`` flattened to ``in_spec`` for an
    error message: "argument 1", "argument 0[2]", "keyword argument 'cfg'"."""
    import torch.utils._pytree as pytree

    leaves = pytree.tree_unflatten(list(range(in_spec.num_leaves)), in_spec)
    for path, leaf in pytree.tree_flatten_with_path(leaves)[0]:
        if leaf != index:
            continue
        top, rest = path[0], path[1:]
        sub = "".join(str(k) for k in rest[1:])
        if getattr(top, "idx", None) == 0:  # positional arguments
            pos = getattr(rest[0], "idx", 0) - num_params_buffers
            return f"argument {pos}{sub}" + (f" (flat input {index})" if sub else "")
        return f"keyword argument {getattr(rest[0], 'key', rest[0])!r}{sub} (flat input {index})"
    return f"flat input {index}"

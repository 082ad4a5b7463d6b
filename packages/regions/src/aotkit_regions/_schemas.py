"""One schema per distinct region call while aotkit traces.

# Note [Region schemas generated once]
# torch's autograd rule for ``invoke_subgraph`` (``maybe_run_autograd`` of
# ``HigherOrderOperator.py_autograd_impl``) calls ``gen_schema`` on every training call, to
# refuse a subgraph that writes its inputs. ``gen_schema`` traces the whole subgraph again
# (``materialize_as_graph``), so a 24-layer model whose blocks share one region paid one
# trace of the block per layer and per trace pass: 4.4 of the 7.3 s of aotkit's layer on
# Llama-24 (cProfile), more than sharing saved. ``region_schemas()`` memoises the schema
# for the span of one compilation, keyed by what the schema is a function of:
#   * the subgraph object itself (one shared GraphModule per identifier; held in the key,
#     so the id cannot be reused by another object while the cache lives) and the
#     identifier;
#   * each operand's kind, and for tensors: type, shape, stride, storage offset, dtype,
#     device, requires_grad, and which earlier operand shares its storage (aliasing
#     decides what a write may reach).
# An operand that cannot be described (a tensor whose storage cannot be read, an opaque
# object) calls torch's ``gen_schema`` uncached. The cache lives only inside the block:
# nothing outlives one compilation, and code outside aotkit's traces is untouched.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = ["region_schemas"]

_LOCK = threading.Lock()
_DEPTH = [0]


def _operand_key(operands: tuple[Any, ...]) -> tuple[Any, ...] | None:
    key: list[Any] = []
    storages: list[Any] = []
    for o in operands:
        if isinstance(o, torch.Tensor):
            try:
                ref = StorageWeakRef(o.untyped_storage())  # type: ignore[no-untyped-call]
            except Exception:
                return None
            shared = next((i for i, s in enumerate(storages) if s == ref), -1)
            storages.append(ref)
            key.append((
                type(o), tuple(o.shape), tuple(o.stride()), o.storage_offset(), o.dtype,
                o.device, o.requires_grad, shared,
            ))
        elif o is None or isinstance(o, (int, float, bool, torch.SymInt)):
            key.append((type(o), str(o)))
        else:
            return None
    return tuple(key)


@contextlib.contextmanager
def region_schemas() -> Iterator[None]:
    """Memoise ``invoke_subgraph``'s schema inside the block. See Note [Region schemas
    generated once]."""
    hop = torch.ops.higher_order.invoke_subgraph
    cache: dict[tuple[Any, ...], Any] = {}
    original: Any = type(hop).gen_schema

    def gen_schema(subgraph: Any, identifier: Any, *operands: Any) -> Any:
        ops = _operand_key(operands)
        if ops is None:
            return original(hop, subgraph, identifier, *operands)
        key = (subgraph, identifier, ops)
        try:
            return cache[key]
        except (KeyError, TypeError):  # TypeError: an unhashable subgraph
            pass
        schema = original(hop, subgraph, identifier, *operands)
        with contextlib.suppress(TypeError):
            cache[key] = schema
        return schema

    with _LOCK:
        _DEPTH[0] += 1
        if _DEPTH[0] == 1:
            hop.gen_schema = gen_schema  # type: ignore[method-assign]
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                del hop.gen_schema

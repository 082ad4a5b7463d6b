"""The ShapeEnv guards of one dynamic-shape compilation.

# Note [Shape guards]
# With ``dynamic=True`` the inputs are fakified with a fresh ShapeEnv per compilation:
# tensor sizes, strides and offsets and Python ints become symbols. Tracing, partitioning
# and the compilers record, as ShapeEnv guards, every fact about those symbols that the
# graphs rely on: branches (``x.shape[0] > 4``), sizes baked in as constants, equalities
# from broadcasting, and the 0/1 specialization (a size 0 or 1 is traced as a constant,
# every other size as a symbol known to be >= 2).
# aotkit's ShapeEnv does not duck-size (give equal sizes one symbol): a size that happened
# to equal another one on the first call would be guarded equal to it, and every later
# call with other sizes would retrace.
# A dynamic cache entry is therefore found in two steps:
#   1. ``input_key(..., dynamic=True)`` keys everything except the symbolic sizes. Inputs
#      that were fakified with static shapes (parameters and buffers, torch's
#      static_weight_shapes) and inputs that alias each other (synthetic bases bake their
#      views' sizes in) keep their full sizes and strides in the key, as in the static path;
#   2. the entry's ``ShapeGuard``, built once after compilation with
#      ``ShapeEnv.produce_guards`` over the symbolic placeholders (``ignore_static=False``,
#      so that sizes that came out static, e.g. by 0/1 specialization, are checked too),
#      is evaluated on the new inputs. Several entries may share a key; the newest whose
#      guards pass runs, and when none does, the function is traced again for the new
#      inputs and a new entry is added.
# The guards are compiled once into one Python lambda, so a call costs the key plus one
# comparison per guard (a few microseconds for a handful of dynamic inputs). An entry
# restored from the on-disk cache checks its stored shape facts instead (never eval'd
# text: See Note [Dynamic shapes in the on-disk cache]).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from aotkit_analysis import InputLayout

if TYPE_CHECKING:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv


def guardable_positions(fake: Sequence[Any], static: Collection[int]) -> list[int]:
    """Positions of ``fake`` to guard: not ``static``, and of a kind ``produce_guards``
    takes (a tensor, int or float, symbolic or not). Other non-tensor inputs (str, None,
    an Enum member) are constants held by the compile key (Note [Compile cache keys])."""
    kinds = (torch.Tensor, torch.SymInt, torch.SymFloat, int, float)
    return [c for c, a in enumerate(fake) if c not in static and isinstance(a, kinds)]


@dataclass(frozen=True)
class ShapeGuard:
    """The ShapeEnv guards of one dynamic-shape compilation. See Note [Shape guards]."""

    # one python expression per guard, over ``L['t<k>']`` = the k-th guarded input
    exprs: tuple[str, ...]
    # positions, among the compiled inputs, of the inputs the guards read
    positions: tuple[int, ...]
    layout: InputLayout
    _check: Callable[[dict[str, Any]], bool]
    # the failing guards, for an entry whose guards are not python expressions (an
    # entry from the on-disk cache: See Note [Dynamic shapes in the on-disk cache])
    _explain: Callable[[dict[str, Any]], list[str]] | None = None

    @classmethod
    def build(
        cls,
        shape_env: ShapeEnv,
        fake_compiled_args: Sequence[Any],
        positions: Sequence[int],
        layout: InputLayout,
    ) -> ShapeGuard:
        """Guards over ``fake_compiled_args[positions]``, as accumulated so far in
        ``shape_env``; call after everything that may add guards (tracing, partitioning,
        the compilers) has run."""
        # only dynamic shapes need dynamo's Source classes and sympy's printer: See
        # Note [Import cost] in aotkit_frontends
        from torch._dynamo.source import LocalSource
        from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

        placeholders = [fake_compiled_args[p] for p in positions]
        sources = [LocalSource(f"t{k}") for k in range(len(placeholders))]
        exprs = tuple(
            shape_env.produce_guards(
                placeholders,
                sources,  # type: ignore[arg-type]
                input_contexts=[_context(t, src) for t, src in zip(placeholders, sources, strict=True)],
                ignore_static=False,
            )
        )
        code = "lambda L: " + (" and ".join(f"({e})" for e in exprs) if exprs else "True")
        check = eval(compile(code, "<aotkit shape guards>", "eval"), dict(SYMPY_INTERP))
        return cls(exprs, tuple(positions), layout, check)

    def _locals(self, flat_args: Sequence[Any]) -> dict[str, Any]:
        args = flat_args if self.layout.is_trivial else self.layout.compiled_args(flat_args)
        return {f"t{k}": args[p] for k, p in enumerate(self.positions)}

    def __call__(self, flat_args: Sequence[Any]) -> bool:
        """Whether the entry traced under these guards is valid for ``flat_args`` (the
        user's flat inputs, with the key of the entry)."""
        return bool(self._check(self._locals(flat_args)))

    def failures(self, flat_args: Sequence[Any]) -> list[str]:
        """The guard expressions that ``flat_args`` violate (slow; for diagnostics)."""
        if self._explain is not None:
            return self._explain(self._locals(flat_args))
        from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP  # loaded by build()

        env = {**SYMPY_INTERP, "L": self._locals(flat_args)}
        return [e for e in self.exprs if not eval(e, env)]


def _context(value: Any, source: Any) -> Any:
    """The symbolic context produce_guards needs for one input: a tensor subclass needs
    one that describes its inner tensors (their sizes are guarded too, through
    ``L['t0'].a``), everything else gets the default."""
    import torch
    from torch._dynamo.source import AttrSource
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        StatelessSymbolicContext,
        SubclassSymbolicContext,
    )
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not isinstance(value, torch.Tensor):
        return None
    dynamic = [DimDynamic.DYNAMIC] * value.dim()
    constraints: list[Any] = [None] * value.dim()
    if not is_traceable_wrapper_subclass(value):
        return StatelessSymbolicContext(dynamic_sizes=dynamic, constraint_sizes=constraints)
    attrs, _ = value.__tensor_flatten__()  # type: ignore[attr-defined]
    inner = {
        a: _context(getattr(value, a), AttrSource(source, a))
        for a in attrs
        if isinstance(getattr(value, a), torch.Tensor)
    }
    return SubclassSymbolicContext(
        dynamic_sizes=dynamic,
        constraint_sizes=constraints,
        inner_contexts=inner,
        tensor_source=source,
    )

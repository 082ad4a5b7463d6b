"""The subclass layer: tracing a program over tensor subclasses as a program over their
inner tensors. See Note [Tensor subclasses are desugared] in aotkit_schemas.

    joint(primals: [TwoTensor, Tensor], tangents: [TwoTensor])
      ──desugar──▶ joint'(primals: [Tensor, Tensor, Tensor], tangents: [Tensor, Tensor])

``joint'`` rebuilds the subclasses from the traced inner tensors, runs ``joint`` (whose
subclass ``__torch_dispatch__`` records ops on the inner tensors) and flattens what it
returns; the metas of the returns and gradients are recorded during that trace, as torch
records them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from aotkit_runtime import (
    SubclassZeros,
    check_rebuildable,
    create_subclass_metas,
    is_nested_int,
    is_subclass,
    make_unwrapper,
    rebuild,
    unwrap_subclasses,
)
from aotkit_schemas import (
    SubclassCreationMeta,
    SubclassOrPlainMeta,
    ViewAndMutationMeta,
    has_subclass,
)


def needs_subclass_layer(fake_args: Sequence[Any], fw_outs: Sequence[Any]) -> bool:
    """Whether a subclass is among the (fake) inputs or the metadata pass's forward
    returns (subclasses the function creates itself)."""
    return any(is_subclass(a) for a in fake_args) or any(is_subclass(o) for o in fw_outs)


@dataclass
class SubclassLayer:
    """The desugaring of one program; filled in while its graph is traced."""

    inp_metas: tuple[SubclassOrPlainMeta, ...]
    tangent_metas: tuple[SubclassOrPlainMeta, ...]
    num_forward_returns: int
    # effect tokens lead the graphs' inputs and outputs, plain (See Note [Effect tokens])
    num_tokens: int = 0
    # recorded by the trace: the forward returns (before saved values) and the gradients
    fw_out_metas: tuple[SubclassOrPlainMeta, ...] = ()
    grad_metas: tuple[SubclassOrPlainMeta, ...] = ()
    _traced: bool = field(default=False, repr=False)

    @staticmethod
    def build(fake_args: Sequence[Any], meta: ViewAndMutationMeta) -> SubclassLayer:
        _tie_outer_to_inner(fake_args)
        inp_metas = create_subclass_metas(fake_args)
        _check_static_input_outers(inp_metas)
        return SubclassLayer(
            inp_metas=inp_metas,
            tangent_metas=create_subclass_metas(meta.traced_tangents),
            num_forward_returns=meta.num_forward_returns,
            num_tokens=len(meta.tokens),
        )

    @property
    def num_flat_forward_returns(self) -> int:
        assert self._traced, "known once the graph is traced"
        return sum(m.arg_count for m in self.fw_out_metas)

    def flat_positions(self, user_index: int) -> range:
        """Graph input positions of flat input ``user_index``."""
        m = self.inp_metas[user_index]
        start = m.flat_tensor_start_idx if isinstance(m, SubclassCreationMeta) else m.unwrapped_idx
        return range(start, start + m.arg_count)

    def with_metas(self, meta: ViewAndMutationMeta) -> ViewAndMutationMeta:
        """``meta`` with the layer's metas (See ``requires_subclass_dispatch``)."""
        assert self._traced
        return dataclasses.replace(
            meta,
            subclass_inp_meta=self.inp_metas,
            subclass_fw_graph_out_meta=self.fw_out_metas,
            subclass_tangent_meta=self.tangent_metas if meta.is_train else (),
        )

    def zero_tangents(self, meta: ViewAndMutationMeta) -> tuple[SubclassZeros | None, ...] | None:
        """Per tangent, how to build its zero in the traced subclass form; None when no
        tangent is a subclass. See Note [Zero tangents of subclass outputs] in
        aotkit_runtime."""
        zeros = tuple(
            SubclassZeros.for_tangent(t, m)
            for t, m in zip(meta.traced_tangents, self.tangent_metas, strict=True)
        )
        return zeros if any(z is not None for z in zeros) else None

    def unwrap_tangents(self, tangents: Sequence[Any]) -> list[Any]:
        """The traced tangents' inner tensors, in the backward graph's tangent order."""
        return make_unwrapper(self.tangent_metas)(tangents)

    def _rebuild_all(self, metas: Sequence[SubclassOrPlainMeta], flat: Sequence[Any]) -> list[Any]:
        return [rebuild(m, flat, mirror_grad=True) for m in metas]

    def _flatten_returns(self, returns: Sequence[Any]) -> list[Any]:
        self.fw_out_metas = create_subclass_metas(returns)
        # See Note [Symbolic outer sizes of subclasses] in aotkit_schemas
        check_rebuildable(self.fw_out_metas, "forward outputs")
        return unwrap_subclasses(returns)

    def _flatten_grads(self, grads: Sequence[Any]) -> list[Any]:
        self.grad_metas = create_subclass_metas(grads)
        check_rebuildable(self.grad_metas, "gradients")
        return unwrap_subclasses(grads)

    def desugar_forward(
        self, fn: Callable[..., Sequence[Any]], fake_args: Sequence[Any]
    ) -> tuple[Callable[..., tuple[Any, ...]], list[Any]]:
        """``fn(*tokens, *values) -> (*tokens, *returns)`` as ``fn'(*tokens, *flat values)
        -> (*tokens, *flat returns)``, and the flat example inputs; ``fake_args`` start
        with the tokens' (See Note [Effect tokens])."""
        n_tok = self.num_tokens

        def desugared(*flat: Any) -> tuple[Any, ...]:
            tokens, flat = flat[:n_tok], flat[n_tok:]
            outs = list(fn(*tokens, *self._rebuild_all(self.inp_metas, flat)))
            returns = self._flatten_returns(outs[n_tok:])
            self._traced = True
            # a tuple, as torch's inference graphs return
            return (*outs[:n_tok], *returns)

        return desugared, [*fake_args[:n_tok], *unwrap_subclasses(fake_args[n_tok:])]

    def desugar_joint(
        self,
        joint: Callable[[list[Any], list[Any]], list[Any]],
        primals: Sequence[Any],
        tangents: Sequence[Any],
    ) -> tuple[Callable[[list[Any], list[Any]], list[Any]], list[Any], list[Any]]:
        """``joint(primals, tangents) -> (*forward returns, *gradients)`` over the graph
        values, and the flat example primals and tangents. With effect tokens (See Note
        [Effect tokens]) ``primals`` and the forward returns start with the forward's
        tokens and the backward's tokens end the outputs; tokens are plain and pass as
        they are."""
        n, n_tok = self.num_forward_returns, self.num_tokens
        n_inputs = len(self.inp_metas)

        # named like ``joint``'s parameters: make_fx names the placeholders after them
        # (primals_1, tangents_1), and partitioners read those names
        def desugared(primals: list[Any], tangents: list[Any]) -> list[Any]:
            tokens = list(primals[:n_tok])
            outs = joint(
                [*tokens, *self._rebuild_all(self.inp_metas, primals[n_tok:])],
                self._rebuild_all(self.tangent_metas, tangents),
            )
            out_tokens, outs = outs[:n_tok], outs[n_tok:]
            returns = self._flatten_returns(outs[:n])
            grads = self._flatten_grads(outs[n : n + n_inputs])
            self._traced = True
            return [*out_tokens, *returns, *grads, *outs[n + n_inputs :]]

        flat_primals = [*primals[:n_tok], *unwrap_subclasses(primals[n_tok:])]
        return desugared, flat_primals, unwrap_subclasses(tangents)


def _tie_outer_to_inner(fake_args: Sequence[Any]) -> None:
    """Fakification gives a subclass input's outer sizes symbols of their own. Each outer
    symbol whose example value equals an inner tensor's symbolic size or stride is
    asserted equal to it (a ShapeEnv guard, checked on every later call: an input where
    they differ gets a new trace), so the outer shape is a function of the inner tensors.
    See Note [Symbolic outer sizes of subclasses] in aotkit_schemas."""
    for a in fake_args:
        if not is_subclass(a):
            continue
        inner_syms: dict[int, Any] = {}
        for t in unwrap_subclasses([a]):
            if isinstance(t, torch.Tensor):
                for v in (*t.shape, *t.stride()):
                    if _is_symbol(v):
                        inner_syms.setdefault(int(v.node.hint), v)  # type: ignore[arg-type]
        for v in (*a.shape, *a.stride()):
            if not _is_symbol(v):
                continue
            twin = inner_syms.get(int(v.node.hint))  # type: ignore[arg-type]
            if twin is not None and v.node.expr != twin.node.expr:
                torch._check(v == twin)


def _is_symbol(v: Any) -> bool:
    """A SymInt that is one ShapeEnv symbol (not an expression, not a nested int: See
    Note [Nested ints in outer sizes] in aotkit_runtime)."""
    import sympy

    return (
        isinstance(v, torch.SymInt)
        and not is_nested_int(v)
        and isinstance(v.node.expr, sympy.Symbol)
    )


def _check_static_input_outers(metas: Sequence[Any]) -> None:
    """A subclass input whose outer shape has symbols of its own (fakification gives the
    outer and the inner sizes separate symbols) would need them as graph inputs, as torch
    passes them; aotkit does not yet. See Note [Symbolic outer sizes of subclasses] in
    aotkit_schemas."""
    for m in metas:
        if (
            isinstance(m, SubclassCreationMeta)
            and m.symbolic_outer is not None
            and m.symbolic_outer.unbound
        ):
            raise NotImplementedError(
                f"aotkit: the tensor subclass input {m.original_subclass_type.__name__} has "
                f"symbolic sizes or strides ({m.outer_size}, {m.outer_stride}); aotkit "
                "desugars subclass inputs with static outer shapes only (subclasses the "
                "function creates may be dynamic). Compile with dynamic=False (or mark the "
                "subclass's dimensions static)."
            )


def check_layer_applies(meta: ViewAndMutationMeta, layer: SubclassLayer) -> None:
    """torch's errors for what the subclass layer does not support."""
    for i, m in enumerate(layer.inp_metas):
        info = meta.input_info[i]
        if isinstance(m, SubclassCreationMeta) and info.mutates_storage_metadata:
            raise RuntimeError(
                f"aotkit: input {i} is a tensor subclass ({m.original_subclass_type.__name__}) "
                "whose storage the function swaps with set_; this is not supported for "
                "subclasses. Copy into it instead (x.copy_(y))."
            )
    assert has_subclass(layer.inp_metas) or True

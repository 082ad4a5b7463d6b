"""Turning runtime inputs into fake tensors (and symbolic ints) for tracing."""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch._guards import TracingContext, detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from ._input_kinds import check_input_kinds

if TYPE_CHECKING:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv


def construct_fake_mode(
    flat_args: Sequence[Any], *, dynamic: bool
) -> tuple[FakeTensorMode, ShapeEnv | None]:
    """Reuse the fake mode the inputs already live in, or make a new one."""
    mode = detect_fake_mode(list(flat_args))
    if mode is not None:
        return mode, mode.shape_env
    shape_env = None
    if dynamic:
        # symbolic_shapes imports sympy: See Note [Import cost] in aotkit_frontends
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        shape_env = ShapeEnv(duck_shape=False)  # no duck sizing: See Note [Shape guards]
    return FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=False), shape_env


def fakify_inputs(
    flat_args: Sequence[Any],
    fake_mode: FakeTensorMode,
    shape_env: ShapeEnv | None,
    *,
    static_positions: Container[int],
    is_export: bool = False,
    static_weight_shapes: bool = True,
) -> list[Any]:
    """Fake versions of ``flat_args``.

    With a shape env, tensor sizes become symbolic (parameters and buffers, the inputs at
    ``static_positions``, keep static shapes when ``static_weight_shapes``) and Python
    ints become SymInts, except in export, which specializes on ints.
    """
    check_input_kinds(flat_args)
    out: list[Any] = []
    with fake_mode:
        for idx, x in enumerate(flat_args):
            if isinstance(x, FakeTensor):
                if x.fake_mode is not fake_mode:
                    raise RuntimeError(
                        "aotkit: inputs are fake tensors from different FakeTensorModes; "
                        "create all fake inputs under one mode."
                    )
                out.append(x)
            elif isinstance(x, torch.Tensor):
                out.append(
                    _fakify_tensor(
                        x, fake_mode, shape_env,
                        param=idx in static_positions and static_weight_shapes,
                    )
                )
            elif isinstance(x, int) and not isinstance(x, bool) and shape_env is not None and not is_export:
                # dynamo's Source classes load all of dynamo: only when shapes are dynamic.
                # See Note [Import cost] in aotkit_frontends.
                from torch._dynamo.source import ConstantSource

                source = ConstantSource(f"sym_{idx}")
                out.append(
                    shape_env.create_symintnode(
                        shape_env.create_symbol(x, source, positive=x >= 0),
                        hint=x,
                        source=source,
                    )
                )
            else:
                out.append(x)
    return out


def _fakify_tensor(
    x: torch.Tensor, fake_mode: FakeTensorMode, shape_env: ShapeEnv | None, *, param: bool
) -> FakeTensor:
    """A real tensor as a fake one. Under dynamo, a tensor dynamo already fakified keeps
    the symbols (and sources) dynamo gave it, so that dynamo's guards cover our trace."""
    tracing = TracingContext.try_get()
    contexts: Any = tracing.tensor_to_context if tracing is not None else {}
    if x in contexts:
        context = contexts[x]
        return fake_mode.from_tensor(
            x, symbolic_context=context, source=context.tensor_source, trace=False
        )
    return fake_mode.from_tensor(x, static_shapes=shape_env is None or param)

"""What the on-disk cache must refuse to store: metadata with no cache form, whose loss on a
warm start would change what a call does in silence (See Note [On-disk compile cache])."""

from __future__ import annotations

from typing import Any

import torch
from aotkit_backends import nop
from aotkit_cache.entry._entry import entry_payload
from aotkit_capture import record_compilations
from aotkit_frontends import aot_function


def _artifacts(fn: Any, *args: Any) -> Any:
    with record_compilations() as compiled:
        aot_function(fn, nop)(*args)
    assert len(compiled) == 1
    return compiled[0]


def test_a_plain_program_has_a_payload() -> None:
    # the refusals below are about their metadata, not about every program
    art = _artifacts(lambda x: (x * 2).sin(), torch.randn(3))
    assert entry_payload(art, None) is not None


def test_effect_tokens_are_stored_with_their_effect_types() -> None:
    # a restored entry without its tokens would drop the print (See Note [Effect tokens]):
    # they are stored (See Note [Effect tokens in the on-disk cache]; they were refused
    # before, which this test checked)
    def f(x: torch.Tensor) -> torch.Tensor:
        torch.ops.aten._print("effect")
        return x * 2

    art = _artifacts(f, torch.randn(3))
    assert art.meta.tokens
    payload = entry_payload(art, None)
    assert payload is not None
    assert payload["tokens"] == {"effects": ["ORDERED"], "backward": 0}


def test_recorded_view_chains_are_stored() -> None:
    # an output viewing a mutated non-contiguous input is replayed from functionalization's
    # recorded view chain (See Note [View replay]); restored without it, the view would be
    # rebuilt another way. It was refused before (what this test checked); the chain is
    # now stored and read back (See Note [View chains in the cache JSON format])
    from aotkit_schemas import meta_from_json

    def h(x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return x[1:].t()

    art = _artifacts(h, torch.arange(30.0).reshape(5, 6).t()[1:])
    infos = [*art.meta.input_info, *art.meta.output_info]
    chains = [i.view_meta_sequence for i in infos if i.view_meta_sequence is not None]
    assert chains
    payload = entry_payload(art, None)
    assert payload is not None
    back = meta_from_json(payload["meta"])
    restored = [
        i.view_meta_sequence for i in [*back.input_info, *back.output_info]
        if i.view_meta_sequence is not None
    ]
    assert [[type(v).__name__ for v in c] for c in restored] == [
        [type(v).__name__ for v in c] for c in chains
    ]
    assert [[v.as_tuple() for v in c] for c in restored] == [[v.as_tuple() for v in c] for c in chains]


def test_bad_view_chains_are_refused() -> None:
    import pytest
    from aotkit_schemas import CacheFormatError
    from aotkit_schemas._view_chains_json import view_chain_from_json

    good = ["t_ViewMeta", [False, True, {"irm": "ViewOrScatterInverse"}]]
    assert len(view_chain_from_json([good])) == 1
    for bad in (
        [],
        [["ViewMeta", []]],                                     # the abstract base
        [["Tensor", []]],                                       # not a ViewMeta
        [["t_ViewMeta", [False, True, {"irm": "Nope"}]]],       # unknown mode
        [["t_ViewMeta", [1.5]]],                                # a float
        [["slice_Tensor_ViewMeta", [False, True]]],             # too few arguments
    ):
        with pytest.raises(CacheFormatError):
            view_chain_from_json(bad)


def test_a_tangent_layout_the_format_cannot_carry_is_refused() -> None:
    # a channels-last tangent behind symbolic strides: its stored TensorSpec would restore
    # as contiguous, feeding the backward tangents it was not compiled for
    import pytest
    from aotkit_cache.entry._entry import _check_tangent_layouts_round_trip
    from aotkit_schemas import Uncacheable
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    mode = FakeTensorMode(shape_env=ShapeEnv())
    ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 4)
    real = torch.empty(2, 3, 4, 5)
    plain = mode.from_tensor(real, symbolic_context=ctx)
    channels_last = mode.from_tensor(
        real.to(memory_format=torch.channels_last), symbolic_context=ctx
    )
    _check_tangent_layouts_round_trip([plain])  # contiguous: the spec carries it
    with pytest.raises(Uncacheable, match="tangent layout"):
        _check_tangent_layouts_round_trip([channels_last])


def test_view_chains_of_intermediates_do_not_refuse_an_entry() -> None:
    # views of intermediates carry a recorded chain too (See Note [View replay of
    # intermediate aliases]), but a restored entry without it replays the graph value's
    # own view, which is correct there: the program stays cacheable
    def g(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = x.add(10)
        return b, b.view(-1)

    art = _artifacts(g, torch.ones(2, 2, requires_grad=True))
    assert art.meta.output_info[1].view_meta_sequence is not None
    assert entry_payload(art, None) is not None

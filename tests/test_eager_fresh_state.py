"""Programs that once differed from eager (issue 13, "still diverge"), checked on what the
corpus harness does not observe: gradients accumulated into a returned leaf, in-place
errors, BatchNorm's cumulative running stats over several steps, autocast's cast cache.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from aotkit_backends import nop
from aotkit_frontends import aot_function, aot_module

# ---- a leaf made inside the function (See Note [Leaves made inside the function]) -----


def _leaf_inside(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.ones(3)
    y.requires_grad_()
    return x * 2, y


def test_a_returned_leaf_made_inside_is_a_leaf_that_accumulates_its_grad() -> None:
    for fn in (_leaf_inside, aot_function(_leaf_inside, nop)):
        x = torch.randn(3, requires_grad=True)
        a, y = fn(x)
        assert y.is_leaf and y.requires_grad and y.grad_fn is None
        (a.sum() + (y * torch.arange(3.0)).sum()).backward()
        assert y.grad is not None
        torch.testing.assert_close(y.grad, torch.arange(3.0))
        torch.testing.assert_close(x.grad, torch.full((3,), 2.0))


def test_another_output_computed_from_a_leaf_made_inside_raises_naming_the_fix() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = torch.ones(3, requires_grad=True)
        return x * w, w

    with pytest.raises(RuntimeError, match="pass it in as an input"):
        aot_function(f, nop)(torch.randn(3, requires_grad=True))


def test_a_leaf_made_inside_and_only_used_inside_still_compiles() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        w = torch.full((3,), 2.0, requires_grad=True)
        return (x * w).sum()

    x = torch.randn(3, requires_grad=True)
    aot_function(f, nop)(x).backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))


# ---- a view with grad on of a view made under no_grad ---------------------------------


def _grad_view_of_no_grad_view(x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        v = x[1:]
    return v.view(-1)


def test_a_grad_view_of_a_no_grad_view_carries_no_gradient_and_rejects_in_place() -> None:
    for fn in (_grad_view_of_no_grad_view, aot_function(_grad_view_of_no_grad_view, nop)):
        leaf = torch.randn(4, requires_grad=True)
        w = fn(leaf * 1)
        assert w.requires_grad and not w.is_leaf and w.grad_fn is not None
        (w * 3).sum().backward()
        assert leaf.grad is None
        with pytest.raises(RuntimeError, match="created in no_grad mode"):
            fn(leaf * 1).mul_(2)


# ---- out= keeps the out tensor's layout ------------------------------------------------


def test_out_into_a_fresh_transposed_tensor_keeps_its_strides_and_values() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        r = torch.empty(3, 2).t()
        torch.mul(x, 2, out=r)
        return r

    x = torch.randn(2, 3)
    got, want = aot_function(f, nop)(x), f(x)
    assert got.stride() == want.stride() == (1, 2)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


# ---- BatchNorm with momentum=None (See Note [BatchNorm's cumulative moving average]) ---


def _bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4, momentum=None), nn.ReLU())


def _train(model: nn.Module, run: object, steps: int) -> list[torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(5)
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 4, generator=g)
        loss = run(x).square().mean()  # type: ignore[operator]
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses


def _assert_same_state(a: nn.Module, b: nn.Module) -> None:
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        torch.testing.assert_close(x, y, msg=name)


@pytest.mark.parametrize("entry", ["aot_module", "torch.compile"])
def test_batch_norm_with_cumulative_average_trains_as_eager(entry: str) -> None:
    eager = _bn_model()
    model = copy.deepcopy(eager)
    if entry == "aot_module":
        run = aot_module(model, nop)
    else:
        torch._dynamo.reset()
        run = torch.compile(model, backend="aotkit_eager")
    want = _train(eager, eager, 4)
    got = _train(model, run, 4)
    torch.testing.assert_close(torch.stack(got), torch.stack(want))
    _assert_same_state(model, eager)
    assert int(model[1].num_batches_tracked) == 4
    # and in eval mode, the running stats are used as eager does
    eager.eval()
    model.eval()
    x = torch.randn(5, 4)
    torch.testing.assert_close(run(x), eager(x))


def test_the_new_output_flags_survive_the_cache_json() -> None:
    from aotkit_schemas import OutputAliasInfo, OutputType
    from aotkit_schemas._json import output_info_from_json, output_info_to_json

    for info in (
        OutputAliasInfo(OutputType.non_alias, torch.Tensor, None, frozenset(), True, True,
                        fresh_leaf=True),
        OutputAliasInfo(OutputType.alias_of_input, torch.Tensor, 0, frozenset(), True, True,
                        grad_view_of_no_grad_view=True),
    ):
        back = output_info_from_json(output_info_to_json(info))
        assert back.fresh_leaf == info.fresh_leaf
        assert back.grad_view_of_no_grad_view == info.grad_view_of_no_grad_view
    # an entry written before the flags existed reads them as False
    old = output_info_to_json(OutputAliasInfo(OutputType.non_alias, torch.Tensor, None, frozenset(), False))
    del old["fresh_leaf"], old["grad_view_of_no_grad_view"]
    back = output_info_from_json(old)
    assert not back.fresh_leaf and not back.grad_view_of_no_grad_view

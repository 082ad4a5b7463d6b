"""Tensors made inside the function: out= into fresh views, leaves, views under no_grad.

Each program once gave a different result through aotkit than in eager (issue 13, "still
diverge"); the harness compares layouts, flags and gradients (Note [What the differential
harness compares]).
"""

from __future__ import annotations

import torch

from corpus import TorchDiffers, case_registrar, nonleaf, rand

case = case_registrar("mutation")

_OUT_LAYOUT = TorchDiffers(
    "torch's functionalization gives an out= result the functional op's layout, not the "
    "out tensor's (See Note [out= keeps the out tensor's layout] in aotkit_functional)"
)


@case(inputs=lambda: (rand(2, 3),), torch_differs=_OUT_LAYOUT)
def out_into_transposed_fresh(x):
    r = torch.empty(3, 2).t()
    torch.mul(x, 2, out=r)
    return r


@case(inputs=lambda: (rand(2, 3, grad=True),), torch_differs=_OUT_LAYOUT)
def out_into_transposed_fresh_training(x):
    r = torch.empty(3, 2).t()
    torch.mul(x.detach(), 2, out=r)
    return r, x.sin() * r


@case(inputs=lambda: (rand(2, 3),), torch_differs=_OUT_LAYOUT)
def out_into_transposed_fresh_base_returned(x):
    base = torch.zeros(3, 2)
    torch.add(x, 1, out=base.t())
    return base, base.t()


@case(inputs=lambda: (rand(3, 4),))
def out_tuple_into_strided_fresh(x):
    values = torch.empty(3, 2)[:, 0]
    indices = torch.empty(3, 2, dtype=torch.long)[:, 1]
    torch.max(x, 1, out=(values, indices))
    return values, indices


@case(inputs=lambda: (rand(2, 3),))
def out_resized_keeps_the_op_layout(x):
    r = torch.empty(0)
    torch.mul(x.t(), 2, out=r)
    return r


# ---- a view taken with grad mode on from a view made under no_grad ---------------------
# See Note [Views of inputs made under no_grad] in aotkit_runtime: eager's view has a
# grad_fn that reaches nothing (no gradient into ``x``) and CreationMeta NO_GRAD_MODE.

_GRAD_THROUGH_NO_GRAD_VIEW = TorchDiffers(
    "torch replays the view chain with grad mode on: the view carries gradient into its base "
    "and takes in-place ops"
)


@case(inputs=lambda: (rand(4, grad=True),), torch_differs=_GRAD_THROUGH_NO_GRAD_VIEW)
def grad_view_of_no_grad_view_of_input(x):
    with torch.no_grad():
        v = x[1:]
    return v.view(-1), x * 2


@case(inputs=lambda: (rand(3, 4, grad=True),), torch_differs=_GRAD_THROUGH_NO_GRAD_VIEW)
def grad_view_of_no_grad_view_of_intermediate(x):
    y = x.sin()
    with torch.no_grad():
        v = y.t()
    return v[1:], y


def _mul_first_output(outs, args):
    outs[0].mul_(2)


@case(
    inputs=lambda: (nonleaf(4),),
    torch_differs=_GRAD_THROUGH_NO_GRAD_VIEW,
    after=_mul_first_output,
    eager_raises=True,
)
def in_place_on_grad_view_of_no_grad_view(x):
    with torch.no_grad():
        v = x[1:]
    return v.view(-1), x * 2


# ---- a leaf made inside the function and returned --------------------------------------
# See Note [Leaves made inside the function] in aotkit_analysis.

_TORCH_FRESH_LEAF = TorchDiffers(
    "torch returns a leaf made inside the function as a non-leaf with a grad_fn"
)


@case(inputs=lambda: (rand(3, grad=True),), torch_differs=_TORCH_FRESH_LEAF)
def requires_grad_leaf_made_inside(x):
    y = torch.ones(3)
    y.requires_grad_()
    return x * 2, y


@case(inputs=lambda: (rand(2, 3, grad=True),), torch_differs=_TORCH_FRESH_LEAF)
def factory_leaf_made_inside_used_for_nothing_else(x):
    w = torch.full((3,), 0.5, requires_grad=True)
    return x.sin(), w


@case(
    inputs=lambda: (rand(3),),
    grad_enabled=False,
    torch_differs=TorchDiffers("torch's inference graph drops the leaf's requires_grad"),
)
def requires_grad_leaf_made_inside_under_no_grad(x):
    y = torch.zeros(3).requires_grad_()
    return x + 1, y


@case(
    inputs=lambda: (rand(3),),
    torch_differs=TorchDiffers("torch compiles an inference graph: the output loses requires_grad"),
)
def view_of_leaf_made_inside_without_grad_inputs(x):
    # See Note [Inference graphs and leaves made inside the function] (was a strict xfail)
    y = torch.full((3,), 0.5).requires_grad_()
    return y.reshape(-1), x + 1


@case(
    inputs=lambda: (rand(3),),
    torch_differs=TorchDiffers("torch compiles an inference graph: the output loses requires_grad"),
)
def product_of_leaf_made_inside_without_grad_inputs(x):
    y = torch.full((3,), 0.5).requires_grad_()
    return y * x, x + 1


@case(
    inputs=lambda: (rand(3),),
    torch_differs=TorchDiffers("torch's inference graph returns the views as leaves"),
)
def two_views_of_leaf_made_inside_without_grad_inputs(x):
    y = torch.full((3,), 0.5).requires_grad_()
    return y.view(-1), y.view(3, 1), x + 1


@case(
    inputs=lambda: (rand(3),),
    torch_differs=TorchDiffers("torch's inference graph returns the views as leaves"),
)
def two_views_of_product_with_leaf_made_inside_without_grad_inputs(x):
    z = torch.full((3,), 0.5).requires_grad_() * x
    return z.view(-1), z.t(), x.sin()


@case(
    inputs=lambda: (rand(3),),
    grad_enabled=False,
    torch_differs=TorchDiffers("torch compiles an inference graph: the output loses requires_grad"),
)
def leaf_made_inside_under_enable_grad_called_under_no_grad(x):
    with torch.enable_grad():
        y = torch.full((3,), 0.5).requires_grad_()
        z = (y * x).unsqueeze(0)
    return z, x + 1


# ---- autocast's cast cache --------------------------------------------------------------
# Eager autocast casts a leaf that requires grad once per outermost region and reuses the
# cast: its gradient is summed in bf16 before the one cast back, and a cast made before an
# in-place update under no_grad is reused after it. make_fx turns the cache off while
# tracing and functionalization's input wrappers are not autograd leaves (they carry an
# error grad_fn), so torch's trace casts at every use. aotkit wraps leaf inputs as leaves and
# turns the cache back on while the function runs (Note [Autocast's cast cache in the trace]).

_AUTOCAST_CACHE = (
    "autocast's cast cache: torch's trace casts a leaf weight at every use, eager once per "
    "region (make_fx disables the cache, and the traced inputs are not autograd leaves)"
)


def _square(n: int, grad: bool = False) -> torch.Tensor:
    return rand(n, n, grad=grad)


@case(
    inputs=lambda: (_square(16), _square(16, grad=True)),
    torch_differs=TorchDiffers(_AUTOCAST_CACHE),
)
def autocast_weight_used_twice(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = x @ w
        b = a @ w
    return b.float()


@case(
    inputs=lambda: (_square(16), _square(16, grad=True)),
    torch_differs=TorchDiffers(_AUTOCAST_CACHE),
)
def autocast_weight_updated_between_uses(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = x @ w
        with torch.no_grad():
            w.mul_(2)
        b = x @ w
    return a.float() + b.float()


@case(
    inputs=lambda: (rand(2, 3, grad=True),),
    torch_differs=TorchDiffers("torch returns the view as a plain tensor that needs no grad"),
)
def no_grad_view_of_intermediate_only_alias(x):
    y = x.sin().reshape(-1)
    with torch.no_grad():
        v = y.view(3, 2)
    return (v,)


# ---- inputs whose requires_grad the function changes ------------------------------------
# See Note [Inputs whose requires_grad the function changes] in aotkit_capture: the input is
# traced with its new flag and the caller's tensor flipped at run time, as eager does.

_TORCH_DROPS_FLIP = TorchDiffers(
    "torch traces the input with the flag it had at the call: its gradient is dropped"
)


@case(inputs=lambda: (rand(3, 3), rand(3, 3, grad=True)), torch_differs=_TORCH_DROPS_FLIP)
def input_requires_grad_turned_on(a, b):
    # torch's test_input_inplace_requires_grad_true
    a.requires_grad_(True)
    return a.mul(3), b.mul(4)


@case(inputs=lambda: (rand(3), rand(3)), torch_differs=_TORCH_DROPS_FLIP)
def input_requires_grad_turned_on_no_other_grad(a, b):
    a.requires_grad = True
    return (a * b).sin(), a[1:]


@case(
    inputs=lambda: (rand(3, grad=True), rand(3, grad=True)),
    torch_differs=TorchDiffers("torch's trace inputs are not leaves: requires_grad_(False) raises"),
)
def input_requires_grad_turned_off(a, b):
    b.requires_grad_(False)
    return a * b


# ---- a view made under no_grad of an intermediate rebuilt after a mutation -------------
# The mutation through ``y`` makes the graph rebuild the intermediate as ``view(add)``;
# returned as such a view from the compiled Function, the base's root was the graph's
# own ``add``, and the output regenerated from it under no_grad did not require grad.
# Eager's does (it views ``x.sin()``), and a backward through it raises (fuzzer seed 53;
# See Note [Intermediate bases are plain tensors] in aotkit_runtime).

_NO_GRAD_VIEW_PLAIN = TorchDiffers(
    "torch returns the no_grad view as a plain output of its Function (a grad_fn, not a "
    "view): the backward runs where eager's raises"
)


@case(inputs=lambda: (nonleaf(4),), torch_differs=_NO_GRAD_VIEW_PLAIN, eager_raises=True)
def no_grad_view_of_mutated_intermediate_then_input_updated_with_it(x):
    y = x.sin().reshape(-1)
    y.add_(1.5)
    with torch.no_grad():
        v = y.reshape(-1)
    x.add_(v.mean())
    return (v,)


@case(inputs=lambda: (rand(2, 3, grad=True),), torch_differs=_NO_GRAD_VIEW_PLAIN, eager_raises=True)
def no_grad_view_of_mutated_intermediate(x):
    y = x.sin()
    y.view(-1).mul_(2)
    with torch.no_grad():
        v = y.t()
    return (v,)


@case(inputs=lambda: (rand(2, 3, grad=True),))
def grad_views_of_mutated_intermediate_then_output_mutated(x):
    y = x.sin()
    y.view(-1).add_(1)
    return y.view(3, 2), y.view(-1)


# ---- an input written from a leaf made inside, in an inference graph -------------------
# Eager's input then requires grad and is not a leaf (fuzzer seed 59; See Note [Inference
# graphs and leaves made inside the function] in aotkit_runtime).

_TORCH_INPUT_FROM_FRESH_LEAF = TorchDiffers(
    "torch copies the value into the input without grad: the input stays a leaf that "
    "needs no grad"
)


@case(inputs=lambda: (rand(4),), torch_differs=_TORCH_INPUT_FROM_FRESH_LEAF)
def input_written_from_leaf_made_inside(x):
    w = torch.full((4,), 0.5).requires_grad_()
    x.add_(w.mean())
    return (x * 2,)


@case(inputs=lambda: (rand(2, 3),), torch_differs=_TORCH_INPUT_FROM_FRESH_LEAF)
def input_view_written_from_leaf_made_inside(x):
    w = torch.full((3,), 0.5).requires_grad_()
    v = x.reshape(-1)
    v.add_(w.sum())
    return (v,)

"""Core path: pointwise ops, reductions, broadcasting, linear algebra, conv, norms,
attention, custom autograd.Functions."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from corpus import NA, NM, case_registrar, ints, rand

case = case_registrar("core")



# ---- pointwise -------------------------------------------------------------------------


@case(inputs=lambda: (rand(3, 4, grad=True),), boxed=True, expect_outputs=(NA,), expect_inputs=(NM,))
def sin_cos(x):
    return x.sin().cos() * 2 + 1


@case(inputs=lambda: (rand(3, 4, grad=True), rand(3, 4)))
def mixed_requires_grad(x, y):
    return x * y + y.sigmoid(), y.exp()


@case(inputs=lambda: (rand(3, 4), rand(3, 4)), boxed=True)
def no_input_requires_grad(x, y):
    return (x + y).relu(), x.tanh()


@case(inputs=lambda: (rand(5, grad=True), rand(5, grad=True)))
def binary_math(x, y):
    return torch.atan2(x, y), torch.hypot(x, y), x.abs().sqrt().log1p(), torch.maximum(x, y)


@case(inputs=lambda: (rand(4, 4, grad=True),))
def activations(x):
    return F.gelu(x), F.silu(x), F.softplus(x), F.elu(x), F.leaky_relu(x, 0.1)


@case(inputs=lambda: (rand(3, 3, grad=True), rand(3, 3, grad=True)))
def where_and_masks(x, y):
    return torch.where(x > 0, x, y * 2), x.masked_fill(y < 0, 0.5), x.clamp(-0.5, 0.5)


@case(inputs=lambda: (rand(4, grad=True), 2.5, 3))
def python_scalar_args(x, alpha, n):
    return x.pow(n) * alpha + n


@case(inputs=lambda: (rand(3, 4, grad=True),))
def dtype_conversions(x):
    return x.double() * 2, x.to(torch.int64), (x > 0).float() + x


@case(inputs=lambda: (rand(3, 4, grad=True),))
def factory_functions(x):
    return x + torch.ones_like(x) + torch.arange(4.0), x.new_zeros(2, 2) + 1, torch.full((2,), 3.0)


# ---- reductions and broadcasting -------------------------------------------------------


@case(inputs=lambda: (rand(3, 5, grad=True),), boxed=True)
def reductions(x):
    return x.sum(), x.mean(0), x.amax(-1), x.logsumexp(1), x.prod(1)


@case(inputs=lambda: (rand(4, 6, grad=True),))
def var_std_norm(x):
    return x.var(0), x.std(), x.norm(dim=1), torch.linalg.vector_norm(x, 3)


@case(inputs=lambda: (rand(3, 1, grad=True), rand(1, 4, grad=True), rand(4, grad=True)))
def broadcasting(x, y, z):
    return x + y * z, (x * z).sum(0)


@case(inputs=lambda: (rand(2, 3, 4, grad=True),))
def cumulative_and_sort(x):
    values, idx = x.sort(dim=-1)
    return x.cumsum(1), x.cumprod(2), values, idx


@case(inputs=lambda: (rand(4, 5, grad=True), ints(4, 3)))
def index_ops(x, idx):
    return x[idx], x.index_select(1, idx), x.gather(0, idx.unsqueeze(1).expand(3, 5))


@case(inputs=lambda: (rand(3, 4, grad=True), rand(3, 4, grad=True)))
def cat_stack_split(x, y):
    a, b = torch.cat([x, y], 1).split(4, dim=1)
    return torch.stack([a.sum(1), b.sum(1)]), a * 2, b + 1


@case(inputs=lambda: (rand(2, 3, grad=True), rand(3, 4, grad=True), rand(4, grad=True)))
def einsum(x, y, z):
    return torch.einsum("ij,jk,k->i", x, y, z), torch.einsum("ij,jk->ik", x, y)


# ---- linear algebra, conv, norms -------------------------------------------------------


@case(inputs=lambda: (rand(5, 3, grad=True), rand(3, 4, grad=True)), boxed=True)
def matmul(x, w):
    return x @ w


@case(inputs=lambda: (rand(2, 5, 3, grad=True), rand(3, 4, grad=True)))
def batched_matmul_broadcast(x, w):
    return torch.matmul(x, w), torch.bmm(x, x.transpose(1, 2))


@case(inputs=lambda: (rand(6, 4, grad=True), rand(3, 4, grad=True), rand(3, grad=True)))
def linear(x, w, b):
    return F.linear(x, w, b).relu()


@case(inputs=lambda: (rand(2, 3, 8, 8, grad=True), rand(4, 3, 3, 3, grad=True), rand(4, grad=True)))
def conv2d(x, w, b):
    return F.conv2d(x, w, b, padding=1)


@case(inputs=lambda: (rand(2, 3, 10, grad=True), rand(5, 3, 3, grad=True)))
def conv1d_strided(x, w):
    return F.conv1d(x, w, stride=2)


@case(inputs=lambda: (rand(2, 3, 6, 6, grad=True),))
def pooling(x):
    return F.max_pool2d(x, 2), F.avg_pool2d(x, 3, stride=1), F.adaptive_avg_pool2d(x, 1)


@case(
    inputs=lambda: (
        rand(4, 3, 5, 5, grad=True),
        rand(3),
        rand(3).abs() + 0.5,
        rand(3, grad=True),
        rand(3, grad=True),
    )
)
def batchnorm_eval(x, running_mean, running_var, weight, bias):
    return F.batch_norm(x, running_mean, running_var, weight, bias, training=False)


@case(inputs=lambda: (rand(4, 6, 8, grad=True), rand(8, grad=True), rand(8, grad=True)))
def layernorm(x, w, b):
    return F.layer_norm(x, (8,), w, b)


@case(inputs=lambda: (rand(2, 6, 4, 4, grad=True),))
def groupnorm(x):
    return F.group_norm(x, 3)


# ---- softmax and attention -------------------------------------------------------------


@case(inputs=lambda: (rand(4, 7, grad=True),))
def softmaxes(x):
    return x.softmax(-1), F.log_softmax(x, 0)


@case(inputs=lambda: (rand(2, 5, 8, grad=True), rand(2, 5, 8, grad=True), rand(2, 5, 8, grad=True)))
def attention_by_hand(q, k, v):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v


@case(inputs=lambda: (rand(2, 3, 5, 8, grad=True), rand(2, 3, 5, 8, grad=True), rand(2, 3, 5, 8, grad=True)))
def scaled_dot_product_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# ---- losses and embeddings -------------------------------------------------------------


@case(inputs=lambda: (rand(6, 5, grad=True), ints(5, 6)))
def cross_entropy(logits, target):
    return F.cross_entropy(logits, target), F.nll_loss(F.log_softmax(logits, 1), target, reduction="none")


@case(inputs=lambda: (rand(4, 3, grad=True), rand(4, 3)))
def regression_losses(pred, target):
    return F.mse_loss(pred, target), F.smooth_l1_loss(pred, target), F.l1_loss(pred, target)


@case(inputs=lambda: (ints(10, 2, 3), rand(10, 4, grad=True)))
def embedding(idx, weight):
    return F.embedding(idx, weight).sum(1)


# ---- grads: detach, no_grad, inputs without grad ---------------------------------------


@case(inputs=lambda: (rand(3, 3, grad=True),))
def detached_output(x):
    y = x * 2
    return y.detach() + 1, y


@case(inputs=lambda: (rand(3, 3, grad=True),))
def no_grad_region(x):
    with torch.no_grad():
        scale = x.abs().max()
    return x / scale


@case(inputs=lambda: (rand(3, 3, grad=True),), grad_enabled=False, boxed=True)
def grad_input_under_no_grad(x):
    return x.exp() + 1


@case(inputs=lambda: (rand(3, 3, grad=True),))
def grad_mode_left_disabled(x):
    y = x * 2
    torch.set_grad_enabled(False)
    return y, x + 1


@case(inputs=lambda: (rand(3, 3, grad=True),), grad_enabled=False)
def grad_mode_left_enabled(x):
    torch.set_grad_enabled(True)
    return x * 2


@case(inputs=lambda: (rand(4, 8, grad=True),))
def dropout_training(x):
    return torch.nn.functional.dropout(x, 0.5, training=True) * 2


def _sin_dropout(x, w):
    return F.dropout(torch.sin(x @ w), 0.5, training=True).cos()


# See Note [RNG replay keys]: the recomputation replays the forward's mask, as eager does.
@case(inputs=lambda: (rand(4, 8, grad=True), rand(8, 8, grad=True)))
def checkpoint_dropout(x, w):
    return torch.utils.checkpoint.checkpoint(_sin_dropout, x, w, use_reentrant=False) * 2


# ---- higher-order operators (See Note [Higher-order operators] in aotkit_tracing) ------


def _cond_branches(x, w):
    return torch.cond(
        x.sum() > 0, lambda x, w: (x @ w).sin(), lambda x, w: (x * 2).cos() @ w, (x, w)
    )


def _positive(*shape, grad=False):
    return (torch.rand(*shape) + 0.1).requires_grad_(grad)


@case(inputs=lambda: (_positive(3, 4, grad=True), rand(4, 4, grad=True)))
def cond_true_branch(x, w):
    return _cond_branches(x, w)


@case(inputs=lambda: ((-_positive(3, 4)).requires_grad_(), rand(4, 4, grad=True)))
def cond_false_branch(x, w):
    return _cond_branches(x, w)


@case(inputs=lambda: (rand(2, 3, 4, grad=True), rand(4, grad=True)))
def map_nested(xs, w):
    from torch._higher_order_ops.map import map as hop_map

    return hop_map(lambda x, w: hop_map(lambda y, w: (y * w).sin(), x, w), xs, w)


@case(inputs=lambda: (rand(4, 8, grad=True), rand(8, 8, grad=True)))
def rand_like_forward(x, w):
    return (x * torch.rand_like(x)).sin() @ w


@case(inputs=lambda: (rand(3, 3, grad=True), rand(3, 3)))
def output_without_grad_only(x, y):
    return (y * 2).sum(), y.cos()


# ---- custom autograd.Function ----------------------------------------------------------


class DoubleGradSquare(torch.autograd.Function):
    """x**2 whose backward deliberately returns twice the true gradient."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * (2 * x * grad)


class NoisyGrad(torch.autograd.Function):
    """Identity whose backward scales the gradient by fresh uniform noise (a draw that
    eager makes during the backward)."""

    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):
        return grad * torch.rand_like(grad)


@case(inputs=lambda: (rand(4, 8, grad=True),))
def rand_in_custom_backward(x):
    return NoisyGrad.apply(x.sin()).cos()


class ScaledSum(torch.autograd.Function):
    """Two inputs, a non-tensor argument, two outputs, one of them non-differentiable."""

    @staticmethod
    def forward(ctx, x, y, scale):
        ctx.scale = scale
        mask = x > 0
        ctx.mark_non_differentiable(mask)
        return x * scale + y, mask

    @staticmethod
    def backward(ctx, grad, _mask_grad):
        return grad * ctx.scale * 3, -grad, None


@case(inputs=lambda: (rand(4, grad=True),), boxed=True)
def custom_function_own_backward(x):
    return DoubleGradSquare.apply(x.sin())


@case(inputs=lambda: (rand(4, grad=True), rand(4, grad=True)))
def custom_function_multi_output(x, y):
    out, mask = ScaledSum.apply(x, y, 0.5)
    return out.exp(), mask

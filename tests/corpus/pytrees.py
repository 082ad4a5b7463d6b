"""Core path: pytree inputs and outputs, kwargs, non-tensor outputs."""

from __future__ import annotations

from typing import NamedTuple

import torch

from corpus import Call, TorchDiffers, case_registrar, rand

case = case_registrar("core")


class Pair(NamedTuple):
    first: torch.Tensor
    second: torch.Tensor


@case(inputs=lambda: ({"a": rand(3, grad=True), "b": rand(3)},))
def dict_input(d):
    return d["a"] * d["b"] + d["a"].exp()


@case(inputs=lambda: (rand(3, grad=True), rand(3, grad=True)), boxed=True)
def dict_output(x, y):
    return {"sum": x + y, "prod": x * y, "nested": {"diff": x - y}}


@case(inputs=lambda: ((rand(2, grad=True), (rand(2, grad=True), rand(2))),))
def nested_tuple_input(t):
    a, (b, c) = t
    return a * b + c


@case(inputs=lambda: (rand(2, 2, grad=True),))
def nested_tuple_output(x):
    return (x + 1, (x * 2, (x.exp(),)))


@case(inputs=lambda: (rand(3, grad=True), rand(3, grad=True)))
def namedtuple_output(x, y):
    return Pair(x + y, x * y)


@case(inputs=lambda: (Pair(rand(3, grad=True), rand(3)),))
def namedtuple_input(p):
    return p.first * p.second, p.second.sum()


@case(inputs=lambda: ([rand(2, grad=True), rand(2, grad=True), rand(2)],))
def list_input_list_output(xs):
    return [x.sin() for x in xs]


@case(inputs=lambda: Call((rand(3, grad=True),), {"scale": rand(3, grad=True), "offset": 2.0}))
def keyword_arguments(x, *, scale, offset=0.0, unused=None):
    return x * scale + offset


@case(inputs=lambda: (rand(3, grad=True),))
def single_tensor_output(x):
    return x * 3


@case(inputs=lambda: (rand(3, grad=True),))
def one_element_tuple_output(x):
    return (x * 3,)


@case(inputs=lambda: (rand(3, 4, grad=True),))
def non_tensor_outputs(x):
    return x.sum(), x.shape[0], None, "label", 2.5, True


@case(
    inputs=lambda: (rand(3, 4, grad=True),),
    torch_differs=TorchDiffers("torch rejects torch.dtype/torch.device output leaves", raises=True),
)
def dtype_and_device_outputs(x):
    return x * 2, x.dtype, x.device


@case(
    inputs=lambda: (rand(3, 4, grad=True), 7, "mode"),
    torch_differs=TorchDiffers("a torch.Size output comes back as a plain tuple"),
)
def non_tensor_inputs_passed_through(x, n, mode):
    return {"out": x * n, "mode": mode, "n": n, "size": x.size()}

"""Tensor subclasses the subclass-layer tests use (besides torch's TwoTensor)."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import return_and_correct_aliasing

aten = torch.ops.aten


class WrapperTensor(torch.Tensor):
    """A one-tensor wrapper with its own ``__torch_dispatch__``: every op runs on the
    inner tensor and tensor results are wrapped again (aliasing kept correct)."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> WrapperTensor:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined,no-any-return]
            cls,
            elem.shape,
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            device=elem.device,
            requires_grad=elem.requires_grad,
        )

    def __init__(self, elem: torch.Tensor) -> None:
        self.elem = elem

    def __repr__(self) -> str:  # type: ignore[override]
        return f"WrapperTensor({self.elem!r})"

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["elem"], None

    @staticmethod
    def __tensor_unflatten__(
        inner: dict[str, torch.Tensor], ctx: Any, outer_size: Any, outer_stride: Any
    ) -> WrapperTensor:
        return WrapperTensor(inner["elem"])

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        inner_args, inner_kwargs = pytree.tree_map_only(WrapperTensor, lambda t: t.elem, (args, kwargs))
        out = func(*inner_args, **inner_kwargs)
        wrapped = pytree.tree_map_only(torch.Tensor, WrapperTensor, out)
        return return_and_correct_aliasing(func, args, kwargs, wrapped)

    __torch_function__ = torch._C._disabled_torch_function_impl


class Int8WeightTensor(torch.Tensor):
    """A weight-only quantized weight (float8/torchao style): int8 data and one scale per
    output row; every op but the few that copy the weight sees the dequantized value."""

    int_data: torch.Tensor
    scale: torch.Tensor

    @staticmethod
    def __new__(cls, int_data: torch.Tensor, scale: torch.Tensor) -> Int8WeightTensor:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined,no-any-return]
            cls, int_data.shape, dtype=scale.dtype, device=int_data.device, requires_grad=False
        )

    def __init__(self, int_data: torch.Tensor, scale: torch.Tensor) -> None:
        self.int_data = int_data
        self.scale = scale

    @staticmethod
    def quantize(w: torch.Tensor) -> Int8WeightTensor:
        scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127
        return Int8WeightTensor((w / scale[:, None]).round().to(torch.int8), scale)

    def dequantize(self) -> torch.Tensor:
        return self.int_data.to(self.scale.dtype) * self.scale[:, None]

    def __repr__(self) -> str:  # type: ignore[override]
        return f"Int8WeightTensor({self.int_data!r}, {self.scale!r})"

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["int_data", "scale"], None

    @staticmethod
    def __tensor_unflatten__(
        inner: dict[str, torch.Tensor], ctx: Any, outer_size: Any, outer_stride: Any
    ) -> Int8WeightTensor:
        return Int8WeightTensor(inner["int_data"], inner["scale"])

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in (aten.detach.default, aten.clone.default, aten.alias.default):
            w = args[0]
            return Int8WeightTensor(func(w.int_data), func(w.scale))
        args, kwargs = pytree.tree_map_only(Int8WeightTensor, lambda w: w.dequantize(), (args, kwargs))
        return func(*args, **kwargs)

    __torch_function__ = torch._C._disabled_torch_function_impl


class TaggedTensor(torch.Tensor):
    """A one-tensor wrapper whose ``__tensor_flatten__`` context is a tag: results carry
    the tag of their first TaggedTensor argument. A tangent with another tag converts
    itself to the traced one (``__coerce_same_metadata_as_tangent__``); the tangent of a
    "partial" output is traced as "replicate" (``__coerce_tangent_metadata__``)."""

    elem: torch.Tensor
    tag: str

    @staticmethod
    def __new__(cls, elem: torch.Tensor, tag: str) -> TaggedTensor:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined,no-any-return]
            cls, elem.shape, strides=elem.stride(), dtype=elem.dtype, device=elem.device,
            requires_grad=elem.requires_grad,
        )

    def __init__(self, elem: torch.Tensor, tag: str) -> None:
        self.elem = elem
        self.tag = tag

    def __repr__(self) -> str:  # type: ignore[override]
        return f"TaggedTensor({self.elem!r}, {self.tag!r})"

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["elem"], self.tag

    @staticmethod
    def __tensor_unflatten__(
        inner: dict[str, torch.Tensor], ctx: Any, outer_size: Any, outer_stride: Any
    ) -> TaggedTensor:
        return TaggedTensor(inner["elem"], ctx)

    def __coerce_same_metadata_as_tangent__(self, expected: Any, expected_type: Any = None) -> Any:
        if expected_type is not None and expected_type is not TaggedTensor:
            return None
        return TaggedTensor(self.elem, expected)

    def __coerce_tangent_metadata__(self) -> Any:
        # as DTensor traces a Partial output's tangent as Replicate: the tangent of a
        # "partial" output is traced as "replicate"
        return TaggedTensor(self.elem, "replicate") if self.tag == "partial" else self

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        tags = [a.tag for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, TaggedTensor)]
        inner_args, inner_kwargs = pytree.tree_map_only(TaggedTensor, lambda t: t.elem, (args, kwargs))
        out = func(*inner_args, **inner_kwargs)
        wrapped = pytree.tree_map_only(torch.Tensor, lambda t: TaggedTensor(t, tags[0]), out)
        return return_and_correct_aliasing(func, args, kwargs, wrapped)

    __torch_function__ = torch._C._disabled_torch_function_impl

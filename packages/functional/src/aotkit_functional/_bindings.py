"""Typed handles on torch's private functionalization bindings.

torch ships these without type stubs; reading them once here keeps the rest of the package
``mypy --strict`` clean without scattering ``type: ignore``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _binding(name: str) -> Callable[..., Any]:
    fn: Callable[..., Any] = getattr(torch, name)
    return fn


sync: Callable[[torch.Tensor], None] = _binding("_sync")
has_data_mutation: Callable[[torch.Tensor], bool] = _binding("_functionalize_has_data_mutation")
has_metadata_mutation: Callable[[torch.Tensor], bool] = _binding(
    "_functionalize_has_metadata_mutation"
)
all_mutations_hidden_from_autograd: Callable[[torch.Tensor], bool] = _binding(
    "_functionalize_are_all_mutations_hidden_from_autograd"
)
all_mutations_under_no_grad_or_inference_mode: Callable[[torch.Tensor], bool] = _binding(
    "_functionalize_are_all_mutations_under_no_grad_or_inference_mode"
)
mutation_counter: Callable[[torch.Tensor], int] = _binding("_functionalize_mutation_counter")
was_storage_changed: Callable[[torch.Tensor], bool] = _binding(
    "_functionalize_was_storage_changed"
)
is_multi_output_view: Callable[[torch.Tensor], bool] = _binding(
    "_functionalize_is_multi_output_view"
)
unwrap_functional: Callable[[torch.Tensor], torch.Tensor] = _binding("_from_functional_tensor")


def view_func(t: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """The recorded view chain of a view tensor, replayable on a new base."""
    # getattr: _view_func is missing from torch's stubs
    fn: Callable[[torch.Tensor], torch.Tensor] = getattr(t, "_view_func")  # noqa: B009
    return fn
wrap_functional: Callable[[torch.Tensor], torch.Tensor] = _binding("_to_functional_tensor")
is_functional_wrapper: Callable[[torch.Tensor], bool] = _binding("_is_functional_tensor")
mirror_autograd_meta: Callable[[torch.Tensor, torch.Tensor], None] = _binding(
    "_mirror_autograd_meta_to"
)
enable_functionalization: Callable[..., None] = _binding("_enable_functionalization")
disable_functionalization: Callable[[], None] = _binding("_disable_functionalization")


def view_meta_sequence(t: torch.Tensor) -> list[Any] | None:
    """Functionalization's recorded view chain of FunctionalTensorWrapper ``t`` (the
    ViewMeta objects from its base to it), or None when torch lacks the binding or a view
    in the chain took symbolic arguments (it could not be replayed on runtime values)."""
    mod = getattr(torch._C, "_functionalization", None)
    getter = getattr(mod, "get_view_meta_sequence", None)
    if getter is None or getattr(mod, "apply_view_meta_sequence", None) is None:
        return None
    seq: list[Any] = list(getter(t))
    if any(getattr(vm, "has_symbolic_inputs", True) for vm in seq):
        return None
    return seq


def apply_view_meta_sequence(base: torch.Tensor, seq: list[Any]) -> torch.Tensor:
    """Replay a ``view_meta_sequence`` on ``base``: real view ops, so the result is a view
    of ``base`` with eager's size, stride and storage offset."""
    out: torch.Tensor = torch._C._functionalization.apply_view_meta_sequence(base, seq)
    return out

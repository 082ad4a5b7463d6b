"""Moving tensors into and out of functionalization, and asking what happened to them.

The query helpers take a FunctionalTensor produced by ``to_functional`` inside an active
``FunctionalTensorMode`` (see ``functionalized``) or a native wrapper produced by
``to_native_functional`` (See Note [Native functionalization]).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch.utils._python_dispatch import _detect_infra_mode, is_traceable_wrapper_subclass

from aotkit_functional import _bindings

from ._eager_layouts import EagerLayoutMode


@contextlib.contextmanager
def functionalized(
    *, keep_input_mutations: bool = False, allow_token_discovery: bool = False
) -> Iterator[FunctionalTensorMode]:
    """Run the body under a fresh FunctionalTensorMode.

    ``allow_token_discovery``: an effectful op with no token for its effect creates one
    (the metadata pass, and a joint's backward); otherwise it raises. See Note [Effect
    tokens] in aotkit_tracing.

    The C++ Functionalize key is excluded above the mode so that only the Python mode
    functionalizes (the same arrangement make_fx tracing needs).
    """
    exclude = torch._C._ExcludeDispatchKeyGuard(
        torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)
    )
    mode = EagerLayoutMode(  # See Note [Views see eager's layouts]
        _allow_token_discovery=allow_token_discovery,
        _keep_input_mutations=keep_input_mutations,
    )
    with exclude, mode:
        yield mode


def to_functional(value: Any, *, leaf: bool = False) -> Any:
    """Wrap a tensor in a FunctionalTensor; other values pass through unchanged.

    See Note [Functionalization runs below subclasses]. With ``leaf``, a plain tensor that
    requires grad is wrapped as an autograd leaf (See Note [Input wrappers that are
    autograd leaves]).
    """
    if isinstance(value, torch.Tensor):
        if leaf and value.requires_grad and not is_traceable_wrapper_subclass(value):
            return _leaf_functional(value)
        if is_traceable_wrapper_subclass(value):
            attrs, ctx = value.__tensor_flatten__()
            inner = {a: to_functional(getattr(value, a)) for a in attrs}
            out = type(value).__tensor_unflatten__(inner, ctx, value.size(), value.stride())
            torch._mirror_autograd_meta_to(value, out)  # type: ignore[attr-defined]
            return out
        return FunctionalTensor.to_functional(value)
    return value


# Note [Input wrappers that are autograd leaves]
# torch wraps a traced input that requires grad with ``_mirror_autograd_meta_to``, which
# gives the wrapper an ``Error`` grad_fn: it is never a leaf, so the engine lets the traced
# program write it in place. An input the user passed as a leaf (a weight) is a leaf in
# eager, and one piece of eager behaviour depends on it: autocast caches its casts of
# leaves only (See Note [Autocast's cast cache in the trace] in aotkit_tracing). With
# ``leaf=True`` the wrapper is made without mirroring (requires_grad False), then
# ``requires_grad_()`` makes it a leaf that requires grad; ``torch.autograd.grad`` with
# respect to it reads the gradient at its accumulator, as for any leaf. The inner
# functional tensor keeps the mirrored metadata (autograd never sees it).
#
# Which inputs: a wrapper is a leaf only where the graph may assume the input is one on
# every call. aot_function and aot_module key each input's leafness (their compile key,
# and the on-disk key, hold ``is_leaf`` and ``_is_view``) and trace inside
# ``leaf_inputs("leaves")``: every leaf input that requires grad. torch.compile's graphs
# (through aot_module_simplified) are not re-checked for leafness on a later call (dynamo
# guards the type ``nn.Parameter``, not ``is_leaf``), so by default only parameters are,
# which are leaves by construction; a plain tensor is wrapped as torch wraps it. Export
# traces use "none": they reject input mutations with torch's own errors, which a leaf
# would preempt with autograd's.


_LEAF_POLICY: contextvars.ContextVar[str] = contextvars.ContextVar(
    "aotkit_leaf_policy", default="parameters"
)


@contextlib.contextmanager
def leaf_inputs(policy: str) -> Iterator[None]:
    """Inside, ``is_leaf_input`` accepts the leaf inputs of ``policy``: "leaves" (every
    one: the caller's compile key holds each input's leafness), "parameters" (the default)
    or "none" (See Note [Input wrappers that are autograd leaves])."""
    if policy not in ("leaves", "parameters", "none"):
        raise ValueError(f"unknown leaf input policy {policy!r}")
    token = _LEAF_POLICY.set(policy)
    try:
        yield
    finally:
        _LEAF_POLICY.reset(token)


def leaf_policy() -> str:
    """The policy ``is_leaf_input`` follows now, for cache keys."""
    return _LEAF_POLICY.get()


def is_leaf_input(value: Any) -> bool:
    """Whether ``value`` is an input to wrap with ``leaf=True``: a plain tensor that
    requires grad, is an autograd leaf and is not a view, and that the current
    ``leaf_inputs`` policy accepts (See Note [Input wrappers that are autograd leaves])."""
    return (
        isinstance(value, torch.Tensor)
        and value.requires_grad
        and value.is_leaf
        and not value._is_view()
        and not is_traceable_wrapper_subclass(value)
        and _accepted(value)
    )


def _accepted(value: torch.Tensor) -> bool:
    policy = _LEAF_POLICY.get()
    return policy == "leaves" or (policy == "parameters" and isinstance(value, torch.nn.Parameter))


def _leaf_functional(value: torch.Tensor) -> FunctionalTensor:
    """A FunctionalTensor of ``value`` that is an autograd leaf requiring grad."""
    inner = torch._to_functional_tensor(value)  # type: ignore[attr-defined]
    mode = _detect_infra_mode(torch._C._TorchDispatchModeKey.FUNCTIONAL)  # type: ignore[no-untyped-call]
    if mode is None:
        raise AssertionError("to_functional(leaf=True) runs inside a FunctionalTensorMode")
    with mode:  # size queries reach the mode, not the proxy mode (as in torch's wrapping)
        torch._mirror_autograd_meta_to(value, inner)  # type: ignore[attr-defined]
        out = FunctionalTensor(inner, mode)
    out.requires_grad_(True)
    return out


# Note [Functionalization runs below subclasses]
# A traceable wrapper subclass (TwoTensor, DTensor) is functionalized through its inner
# tensors, as torch does ("functionalization always runs last"): ``to_functional`` rebuilds
# the subclass around FunctionalTensors, so its ``__torch_dispatch__`` runs first and the
# ops it issues on its inner tensors are the ones functionalized (and traced: make_fx
# tracks the inner tensors, never a subclass built during the trace). What happened to a
# subclass input is what happened to any of its inner tensors: the queries below
# (``has_data_mutation``, ...) combine their answers over the inner tensors, and
# ``from_functional`` rebuilds the subclass around the plain results.


def _inner_tensors(value: Any) -> list[Any] | None:
    """The inner tensors of a traceable wrapper subclass (None for anything else)."""
    if isinstance(value, torch.Tensor) and is_traceable_wrapper_subclass(value):
        attrs, _ = value.__tensor_flatten__()
        # non-tensor inner values (DTensor's device mesh) are not functionalized
        return [t for t in (getattr(value, a) for a in attrs) if isinstance(t, torch.Tensor)]
    return None


def from_functional(value: Any) -> Any:
    """Sync pending updates and return the plain tensor inside a FunctionalTensor.

    A tensor subclass built inside the functionalized code (``TwoTensor(x * 2, x)``) holds
    FunctionalTensors as inner tensors: it is rebuilt around their plain tensors, so no
    functional wrapper leaks out of the trace.
    """
    if isinstance(value, FunctionalTensor):
        _bindings.sync(value)
        return _bindings.unwrap_functional(value.elem)
    if isinstance(value, torch.Tensor) and is_traceable_wrapper_subclass(value):
        attrs, ctx = value.__tensor_flatten__()
        inner = {a: getattr(value, a) for a in attrs}
        plain = {a: from_functional(t) for a, t in inner.items()}
        if all(plain[a] is inner[a] for a in attrs):
            return value
        return type(value).__tensor_unflatten__(plain, ctx, value.size(), value.stride())
    return value


def recorded_view_chain(value: Any) -> list[Any] | None:
    """The view chain functionalization recorded from ``value``'s base to ``value`` (a
    FunctionalTensor, or a native functional wrapper), for replay on a runtime base; None
    when there is none to replay. See Note [View replay]."""
    if isinstance(value, FunctionalTensor):
        inner: Any = value.elem
    elif isinstance(value, torch.Tensor) and _bindings.is_functional_wrapper(value):
        inner = value
    else:
        return None
    if not _bindings.is_functional_wrapper(inner):
        return None
    return _bindings.view_meta_sequence(inner)


def is_functional(value: Any) -> bool:
    return isinstance(value, FunctionalTensor)


def storage_ref(t: torch.Tensor) -> int:
    """A hashable handle on a tensor's storage (functional tensors share it with aliases).

    Valid while the tensor is alive; two tensors alias iff their handles are equal.
    """
    handle: int = t.untyped_storage()._cdata
    return handle


def _wrapper_of(f_arg: Any) -> torch.Tensor | None:
    """The C++ FunctionalTensorWrapper behind a functional tensor of either kind (torch's
    Python FunctionalTensor or a native wrapper, See Note [Native functionalization])."""
    if isinstance(f_arg, FunctionalTensor):
        return f_arg.elem
    if isinstance(f_arg, torch.Tensor) and _bindings.is_functional_wrapper(f_arg):
        return f_arg
    return None


def has_data_mutation(f_arg: Any) -> bool:
    if (inner := _inner_tensors(f_arg)) is not None:
        return any(has_data_mutation(t) for t in inner)
    w = _wrapper_of(f_arg)
    if w is None:
        return False
    _bindings.sync(w)
    return bool(_bindings.has_data_mutation(w))


def mutation_count(f_arg: Any) -> int:
    """How many data mutations the functional wrapper of ``f_arg`` has seen so far (0 for a
    tensor that is not functional): compare two readings to see whether code in between
    wrote to it."""
    if (inner := _inner_tensors(f_arg)) is not None:
        return sum(mutation_count(t) for t in inner)
    w = _wrapper_of(f_arg)
    if w is None:
        return 0
    _bindings.sync(w)
    return int(_bindings.mutation_counter(w))


def mutations_hidden_from_autograd(f_arg: Any) -> bool:
    """True when every mutation of the input happened under ``.data`` or similar."""
    if (inner := _inner_tensors(f_arg)) is not None:
        return all(mutations_hidden_from_autograd(t) for t in inner)
    w = _wrapper_of(f_arg)
    return w is not None and bool(_bindings.all_mutations_hidden_from_autograd(w))


def mutations_under_no_grad_or_inference_mode(f_arg: Any) -> bool:
    if (inner := _inner_tensors(f_arg)) is not None:
        return all(mutations_under_no_grad_or_inference_mode(t) for t in inner)
    w = _wrapper_of(f_arg)
    return w is not None and bool(_bindings.all_mutations_under_no_grad_or_inference_mode(w))


def has_storage_mutation(f_arg: Any, arg: Any) -> bool:
    """True when ``set_`` left the input pointing at another storage."""
    if (inner := _inner_tensors(f_arg)) is not None:
        before = _inner_tensors(arg)
        return before is not None and any(
            has_storage_mutation(t, a) for t, a in zip(inner, before, strict=True)
        )
    w = _wrapper_of(f_arg)
    if w is None or not isinstance(arg, torch.Tensor):
        return False
    _bindings.sync(w)
    if not _bindings.was_storage_changed(w):
        return False
    after = _bindings.unwrap_functional(w)
    return bool(storage_ref(arg) != storage_ref(after))


def has_metadata_mutation(f_arg: Any, arg: Any) -> bool:
    """True when size, stride or storage offset of the input changed (or its storage).

    Metadata mutations that cancel out (``x.t_(); x.t_()``) do not count.
    """
    if (inner := _inner_tensors(f_arg)) is not None:
        before = _inner_tensors(arg)
        return before is not None and any(
            has_metadata_mutation(t, a) for t, a in zip(inner, before, strict=True)
        )
    w = _wrapper_of(f_arg)
    if w is None or not isinstance(arg, torch.Tensor):
        return False
    if has_storage_mutation(f_arg, arg):
        return True
    if not _bindings.has_metadata_mutation(w):
        return False
    after = _bindings.unwrap_functional(w)
    return not (
        arg.shape == after.shape
        and arg.stride() == after.stride()
        and arg.storage_offset() == after.storage_offset()
    )


def is_multi_output_view(t: Any) -> bool:
    if (inner := _inner_tensors(t)) is not None:
        return any(is_multi_output_view(i) for i in inner)
    w = _wrapper_of(t)
    return w is not None and bool(_bindings.is_multi_output_view(w))


def storage_was_changed(t: Any) -> bool:
    if (inner := _inner_tensors(t)) is not None:
        return any(storage_was_changed(i) for i in inner)
    w = _wrapper_of(t)
    return w is not None and bool(_bindings.was_storage_changed(w))


# Note [Native functionalization]
# ``functionalized`` runs torch's Python FunctionalTensorMode: every op crosses a Python
# __torch_dispatch__ that unwraps, re-dispatches to the C++ Functionalize kernel and
# re-wraps. ``natively_functionalized`` turns on the C++ Functionalize key directly (the
# inputs become C++ FunctionalTensorWrappers): the same functionalization kernels, no
# Python layer, 1.4-3x faster under make_fx. The Python mode adds what the C++ key lacks:
# auto_functionalize for custom ops that mutate, effect tokens, TorchBind objects and
# pre_dispatch tracing, and it decomposes the few ops whose Python CompositeImplicit
# kernel differs from the C++ one (native_batch_norm, whose schema hides that it writes the
# running stats, would otherwise stay in the graph as a mutation). So the native path is
# taken only for programs made of native ATen ops without such kernels, on plain tensors:
# the metadata pass (which runs under the Python mode) tells which
# (``ViewAndMutationMeta.native_functionalization_ok``), and aotkit_frontends also keeps
# the Python mode for programs that mutate inputs or return aliases and for exports, where
# torch's exact graph text matters most (view replay numbers nodes differently). On the
# programs it takes, the native joint is op for op the Python mode's, except for the no-op
# ``aten.detach`` nodes the Python mode records where autograd saves an output (the C++ key
# does not dispatch them; aotkit_frontends adds them back, See Note [Detach nodes of saved
# outputs]). A native trace that fails or leaves such an op is redone in the Python mode.


@contextlib.contextmanager
def natively_functionalized() -> Iterator[None]:
    """Run the body with the C++ Functionalize key enabled (See Note [Native
    functionalization]). Wrap inputs with ``to_native_functional``."""
    _bindings.enable_functionalization(reapply_views=True)
    try:
        yield
    finally:
        _bindings.disable_functionalization()


def to_native_functional(value: Any, *, leaf: bool = False) -> Any:
    """Wrap a tensor in a C++ FunctionalTensorWrapper with the same autograd metadata;
    with ``leaf``, one that requires grad as an autograd leaf (See Note [Input wrappers
    that are autograd leaves])."""
    if not isinstance(value, torch.Tensor):
        return value
    wrapped = _bindings.wrap_functional(value)
    if leaf and value.requires_grad:
        wrapped.requires_grad_(True)
    else:
        _bindings.mirror_autograd_meta(value, wrapped)
    return wrapped


def from_native_functional(value: Any) -> Any:
    """Sync pending updates and return the tensor inside a C++ FunctionalTensorWrapper."""
    if isinstance(value, torch.Tensor) and _bindings.is_functional_wrapper(value):
        _bindings.sync(value)
        return _bindings.unwrap_functional(value)
    return value


def input_was_changed(f_arg: Any, arg: Any) -> bool:
    """Whether the functional wrapper ``f_arg`` of input ``arg`` saw a data, metadata or
    storage mutation (metadata changes that cancel out do not count)."""
    return has_data_mutation(f_arg) or has_metadata_mutation(f_arg, arg)

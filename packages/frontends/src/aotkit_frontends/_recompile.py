"""Why a call compiled again, in words: a part-by-part diff of two cache keys.

# Note [Recompile reasons]
# When a call misses every compiled entry (Note [Compile cache keys]), the ``recompiles``
# logger (``AOTKIT_LOGS=recompiles`` or ``TORCH_LOGS=recompiles``) says why, as torch's
# dynamo does for its own guards:
#     input 1: requires_grad changed from False to True
#     grad mode changed from enabled to disabled
#     shape guard failed: 2 <= input0.size(0) <= 8 (input0.size(0) = 16)
# The explanation is computed only on a miss that follows an earlier compilation, and only
# when the logger is on: a cache hit pays nothing. It is generic: a key is ``(in_spec,
# parts)`` and the parts are compared one by one. Parts before the per-input parts are
# ambient state (grad mode first, then whatever else the key holds), the per-input parts
# follow in flat-input order, and the aliasing pattern comes last when there are two or
# more inputs. A part this module has no words for is shown as ``old -> new``, so a new
# kind of key part is reported without changes here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
from aotkit_capture import AMBIENT_FIELDS, SubclassKey
from aotkit_schemas import artifact_enabled, log_artifact

from aotkit_frontends.module_state._module_attrs import explain_attr_change

# field names of a per-input tensor part, by its length (see input_key in _guards)
_TENSOR_FIELDS: dict[int, tuple[str, ...]] = {
    8: ("dtype", "device", "layout", "sizes", "strides", "requires_grad",
        "leaf that requires grad", "storage_offset"),
    6: ("dtype", "device", "layout", "ndim", "requires_grad", "leaf that requires grad"),
}
# a tensor that is not a plain tensor adds its type or subclass key (See Note [Subclass
# inputs in the compile key] in aotkit_capture)
_TENSOR_FIELDS.update({n + 1: (*f, "tensor type") for n, f in list(_TENSOR_FIELDS.items())})
# words for ambient parts, by position from the start of the key
_AMBIENT_NAMES: dict[int, str] = {0: "grad mode"}


def _show(value: Any) -> str:
    if isinstance(value, torch.Size):
        return str(tuple(value))
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], type):
        return repr(value[1])  # a baked-in constant: (type, value)
    if isinstance(value, type):
        return value.__name__
    return repr(value) if isinstance(value, str) else str(value)


def _ambient(index: int, old: Any, new: Any) -> list[str]:
    if index == 0 and isinstance(old, tuple) and isinstance(new, tuple):
        # the ambient_key() tuple: See Note [Ambient state in the compile key]
        if len(old) == len(new) == len(AMBIENT_FIELDS):
            return [
                _state_change(name, a, b)
                for name, a, b in zip(AMBIENT_FIELDS, old, new, strict=True)
                if a != b
            ]
    name = _AMBIENT_NAMES.get(index, f"ambient state #{index}")
    return [_state_change(name, old, new)]


def _state_change(name: str, old: Any, new: Any) -> str:
    if isinstance(old, bool) and isinstance(new, bool):
        return f"{name} changed from {'enabled' if old else 'disabled'} to " + (
            "enabled" if new else "disabled"
        )
    if name == "autocast":
        return f"autocast changed from {_autocast_words(old)} to {_autocast_words(new)}"
    return f"{name} changed from {_show(old)} to {_show(new)}"


def _autocast_words(state: Any) -> str:
    """``None`` (no autocast on) or ``(cache, (device, enabled, dtype), ...)``."""
    if not isinstance(state, tuple):
        return "off"
    on = [f"{d} {str(dt).removeprefix('torch.')}" for d, en, dt in state[1:] if en]
    return "on for " + ", ".join(on) if on else "off"


def _with_type(old: Any, new: Any, lengths: dict[int, tuple[str, ...]]) -> tuple[Any, Any]:
    """Two tensor parts of one length: a plain tensor's gets its type (See Note [Subclass
    inputs in the compile key] in aotkit_capture) when the other has one."""
    if isinstance(old, tuple) and isinstance(new, tuple) and old and new:
        plain = ("type", torch.Tensor)
        if len(old) + 1 == len(new) and len(new) in lengths and len(old) in lengths:
            return (*old, plain), new
        if len(new) + 1 == len(old) and len(old) in lengths and len(new) in lengths:
            return old, (*new, plain)
    return old, new


def _input(i: int, old: Any, new: Any) -> list[str]:
    if _is_tensor_part(old) and _is_tensor_part(new):
        old, new = _with_type(old, new, _TENSOR_FIELDS)
    if isinstance(old, tuple) and isinstance(new, tuple) and len(old) == len(new):
        fields = _TENSOR_FIELDS.get(len(old))
        if fields is not None and isinstance(old[0], torch.dtype):
            return [
                reason
                for name, a, b in zip(fields, old, new, strict=True)
                if a != b
                for reason in _field_change(f"input {i}", name, a, b)
            ]
    if _is_tensor_part(old) != _is_tensor_part(new):
        kind = {True: "a tensor", False: "not a tensor"}
        return [f"input {i}: was {kind[_is_tensor_part(old)]}, now {kind[_is_tensor_part(new)]}"]
    if isinstance(old, tuple) and isinstance(new, tuple) and len(old) == len(new) == 2:
        if old[0] is not new[0]:
            return [f"input {i}: type changed from {_show(old[0])} to {_show(new[0])}"]
        return [
            f"input {i}: value changed from {old[1]!r} to {new[1]!r} (it was baked into "
            "the graph as a constant)"
        ]
    return [f"input {i}: changed from {_show(old)} to {_show(new)}"]


def _field_change(where: str, name: str, old: Any, new: Any) -> list[str]:
    if name != "tensor type":
        return [f"{where}: {name} changed from {_show(old)} to {_show(new)}"]
    return _kind_change(where, old, new)


def _kind_change(where: str, old: Any, new: Any) -> list[str]:
    """A tensor's type or subclass key changed (See Note [Subclass inputs in the compile
    key] in aotkit_capture): the type, the flatten context, or an inner attribute."""
    old_cls = old.cls if isinstance(old, SubclassKey) else old[1]
    new_cls = new.cls if isinstance(new, SubclassKey) else new[1]
    if old_cls is not new_cls or not isinstance(old, SubclassKey):
        return [f"{where}: type changed from {_show(old_cls)} to {_show(new_cls)}"]
    assert isinstance(new, SubclassKey)
    name = old_cls.__name__
    reasons = []
    if old.context != new.context:
        reasons.append(
            f"{where}: the __tensor_flatten__ context of {name} changed from {old.shown} to "
            f"{new.shown} (it was baked into the graph)"
        )
    old_inner, new_inner = dict(old.inner), dict(new.inner)
    if list(old_inner) != list(new_inner):
        reasons.append(f"{where}: the inner attributes of {name} changed from "
                       f"{list(old_inner)} to {list(new_inner)}")
        return reasons
    for attr, a in old_inner.items():
        b = new_inner[attr]
        if a == b:
            continue
        inner = f"{where}.{attr}"
        a, b = _with_type(a, b, _INNER_FIELDS)
        if isinstance(a, tuple) and isinstance(b, tuple) and a and a[0] == "value":
            reasons.append(f"{inner}: value changed from {a[1]} to {b[1]}")
            continue
        fields = _INNER_FIELDS.get(len(a)) if isinstance(a, tuple) else None
        if fields is None or not isinstance(b, tuple) or len(b) != len(a):
            reasons.append(f"{inner}: changed from {_show(a)} to {_show(b)}")
            continue
        for field, x, y in zip(fields, a, b, strict=True):
            if x != y:
                reasons.extend(_field_change(inner, field, x, y))
    return reasons or [f"{where}: the {name} changed"]


# an inner tensor's part (``tensor_part`` in aotkit_capture), by its length
_INNER_FIELDS: dict[int, tuple[str, ...]] = {
    7: ("dtype", "device", "layout", "requires_grad", "sizes", "strides", "storage_offset"),
    5: ("dtype", "device", "layout", "requires_grad", "ndim"),
}
_INNER_FIELDS.update({n + 1: (*f, "tensor type") for n, f in list(_INNER_FIELDS.items())})


def _is_tensor_part(part: Any) -> bool:
    return isinstance(part, tuple) and len(part) in _TENSOR_FIELDS and isinstance(
        part[0], torch.dtype
    )


def _aliasing(old: Any, new: Any) -> str:
    def words(key: Any) -> str:
        items = []
        for item in key:
            if item and item[0] == "dup":
                items.append(f"input {item[1]} is input {item[2]}")
            elif item and item[0] == "alias":
                items.append(f"input {item[1]} shares storage with input {item[2]}")
        return "; ".join(items) or "no inputs alias"

    return f"input aliasing changed from [{words(old)}] to [{words(new)}]"


def explain_key_change(
    old_key: tuple[Any, ...],
    new_key: tuple[Any, ...],
    num_inputs: int,
    attr_names: Sequence[str] = (),
) -> list[str]:
    """The differences between two cache keys ``(in_spec, parts)`` (aot_module's add
    ``(training flags, plain attribute values)`` of its submodules, named by
    ``attr_names``), one sentence each. See Note [Recompile reasons]."""
    (old_spec, old, *old_modes), (new_spec, new, *new_modes) = old_key, new_key
    if old_modes != new_modes:
        (old_flags, old_attrs), (new_flags, new_attrs) = old_modes[0], new_modes[0]
        mode_reasons: list[str] = []
        if old_flags != new_flags:
            # See Note [Training flags in aot_module's key]
            flips = sum(a != b for a, b in zip(old_flags, new_flags, strict=True))
            mode_reasons.append(
                f"the train/eval mode of {flips} of the module's {len(new_flags)} "
                "submodules changed (module.train() / module.eval())"
            )
        if old_attrs != new_attrs:
            # See Note [Plain module attributes in aot_module's key]
            mode_reasons.extend(explain_attr_change(list(attr_names), old_attrs, new_attrs))
        return mode_reasons
    if old_spec != new_spec:
        return [f"the structure of the arguments changed from {old_spec} to {new_spec}"]
    if len(old) != len(new):
        return [f"the key changed shape ({len(old)} parts, now {len(new)}): {old} -> {new}"]
    trailing = 1 if num_inputs > 1 else 0
    first_input = len(new) - num_inputs - trailing
    reasons: list[str] = []
    for index, (a, b) in enumerate(zip(old, new, strict=True)):
        if a == b:
            continue
        if index < first_input:
            reasons.extend(_ambient(index, a, b))
        elif index < first_input + num_inputs:
            reasons.extend(_input(index - first_input, a, b))
        else:
            reasons.append(_aliasing(a, b))
    return reasons or ["the key is unchanged (an entry for it was evicted)"]


_GUARD_TERM = re.compile(r"L\['t(\d+)'\]\.(size|stride)\(\)\[(\d+)\]|L\['t(\d+)'\]\.storage_offset\(\)")


def explain_guard_failures(
    failed: Sequence[str], positions: Sequence[int], compiled_args: Sequence[Any]
) -> list[str]:
    """Failed ShapeEnv guard expressions (over ``L['t<k>']``, see Note [Shape guards]) in
    terms of input numbers, with the new value of every size, stride or offset they read.
    ``compiled_args[positions[k]]`` is the tensor ``t<k>``."""
    reasons = []
    for expr in failed:
        values: dict[str, Any] = {}

        def term(m: re.Match[str], values: dict[str, Any] = values) -> str:
            if m.group(1) is not None:
                k, what, dim = int(m.group(1)), m.group(2), int(m.group(3))
                name = f"input{positions[k]}.{what}({dim})"
                t = compiled_args[positions[k]]
                values[name] = t.size(dim) if what == "size" else t.stride(dim)
            else:
                k = int(m.group(4))
                name = f"input{positions[k]}.storage_offset()"
                values[name] = compiled_args[positions[k]].storage_offset()
            return name

        text = _GUARD_TERM.sub(term, expr)
        # "2 <= a and a <= 8" reads better as "2 <= a <= 8"
        text = re.sub(r"(\S+) <= (\S+) and \2 <= (\S+)", r"\1 <= \2 <= \3", text)
        now = ", ".join(f"{k} = {v}" for k, v in values.items())
        reasons.append(f"shape guard failed: {text}" + (f" ({now})" if now else ""))
    return reasons


def log_recompile(
    fn: Any,
    last_key: tuple[Any, ...] | None,
    key: tuple[Any, ...],
    guard: Any,
    flat_args: Sequence[Any],
    num_compiled: int,
    *,
    attr_names: Sequence[str] = (),
) -> None:
    """Log why ``fn`` compiles again, on the ``recompiles`` artifact. ``guard`` is the
    ShapeGuard of the newest entry for ``key`` when one exists (its guards failed),
    else None (the key is new: it is compared with ``last_key``, the previous call's).
    Call only on a miss. See Note [Recompile reasons]."""
    if num_compiled == 0 or not artifact_enabled("recompiles"):
        return
    if guard is not None:
        layout = guard.layout
        compiled = flat_args if layout.is_trivial else layout.compiled_args(flat_args)
        reasons = explain_guard_failures(guard.failures(flat_args), guard.positions, compiled)
        reasons = reasons or ["the newest entry's shape guards failed"]
    elif last_key is not None:
        reasons = explain_key_change(last_key, key, len(flat_args), attr_names)
    else:
        reasons = ["no compiled entry matches"]
    name = getattr(fn, "__qualname__", None) or repr(fn)
    log_artifact(
        "recompiles",
        "Recompiling function %s (compilation %d) because:\n%s",
        name, num_compiled + 1, "\n".join(f"    {r}" for r in reasons),
    )

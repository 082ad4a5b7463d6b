"""Detecting tensors assigned to module attributes while a module is exported.

A forward that does ``self.cache = x * 2`` stores a *tracing* tensor (fake, functional or a
proxy) on the module: the exported graph does not contain that state change, and the
module is left holding a tensor that cannot be used afterwards. Export therefore snapshots
every plain attribute of every submodule, restores the snapshot afterwards, and reports
each tensor that was assigned (state that must change belongs in a registered buffer,
whose mutations export does capture).

# Note [Tensors assigned to module attributes by aot_module]
# aot_module traces the forward once; a tensor it assigns to a plain attribute
# (``self.last = y.detach()``, ``self.history.append(y)``) is a tracing tensor (a
# FunctionalTensor over a fake) that stays in the user's module, and later calls never
# update it. Eager updates it on every call. aot_module therefore traces under the same
# guard as export: the attributes are restored and the assignment is reported with the
# fixes (a buffer updated in place is captured as an input mutation; dynamo replays
# attribute assignments).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn

from ._module_effects import MISSING, Change, ForwardEffects, changed, copy_plain
from ._module_values import _DERIVED_CACHES, _MODULE_INTERNALS, is_plain, is_tracing_tensor

ASSIGNED_TENSOR_MESSAGE = (
    "aotkit export: the tensor {noun} {names} {verb} assigned during export. The exported "
    "graph cannot represent assigning a tensor to a module attribute, so the assignment "
    "was undone. Register such state as a buffer with `self.register_buffer(name, tensor)` "
    "and update it in place (`self.name.copy_(...)`): buffer mutations are exported as "
    "extra graph outputs."
)
# See Note [Tensors assigned to module attributes by aot_module]
AOT_MODULE_ASSIGNED_TENSOR_MESSAGE = (
    "aot_module: the forward assigned a tensor to the module {noun} {names} while it was "
    "traced. A compiled graph cannot assign module attributes, so the attribute would hold "
    "a tracing tensor once and never the values of later calls; the assignment was undone. "
    "Register such state as a buffer with `self.register_buffer(name, tensor)` and update "
    "it in place (`self.name.copy_(...)`), return the tensor instead, or compile with "
    "`torch.compile(module, backend=\"aotkit_eager\")`, which replays attribute assignments."
)


class TensorAttributeAssignedError(RuntimeError, ValueError):
    """A forward assigned a tensor to a plain module attribute during export.

    A RuntimeError like every aotkit export restriction, and a ValueError like torch's."""


def _copy_containers(value: Any) -> Any:
    """Copy dicts, lists and tuples (recursively) so later in-place edits show up."""
    if type(value) is dict:
        return {k: _copy_containers(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_copy_containers(v) for v in value)
    return value


_ABSENT = object()


def _restore(sub: nn.Module, attr: str, original: Any, copy: Any) -> None:
    """Put ``original`` back under ``attr``; a list or dict with its contents of before
    (``copy``), in place, so references to it stay valid."""
    if type(original) is list:
        original[:] = copy
    elif type(original) is dict:
        original.clear()
        original.update(copy)
    sub.__dict__[attr] = original


def _record_change(
    sub: nn.Module, name: str, attr: str, old: Any, original: Any, new: Any,
    out: list[Change],
) -> None:
    """Record what the trace left in a plain attribute, if it changed it. See Note [Plain
    attributes a forward changes]."""
    if new is _ABSENT:
        if old is not _ABSENT and is_plain(old):
            out.append(Change(sub, attr, name, MISSING, False))
        return
    if not is_plain(new) or (old is not _ABSENT and not changed(old, new)):
        return
    in_place = new is original and type(new) in (list, dict)
    out.append(Change(sub, attr, name, copy_plain(new), in_place))


def _attributes(mod: nn.Module) -> dict[str, dict[str, Any]]:
    return {
        name: {k: v for k, v in sub.__dict__.items() if k not in _MODULE_INTERNALS}
        for name, sub in mod.named_modules()
    }


def _assigned_tensors(
    path: str, old: Any, new: Any, found: list[str], only_tracing: bool = False
) -> None:
    if old is new:
        return
    if isinstance(new, torch.Tensor):
        if not only_tracing or is_tracing_tensor(new):
            found.append(path)
    elif type(old) is dict and type(new) is dict:
        for key in old.keys() | new.keys():
            _assigned_tensors(
                f"{path}[{key!r}]", old.get(key), new.get(key), found, only_tracing
            )
    elif type(old) in (list, tuple) and type(new) in (list, tuple):
        for i in range(max(len(old), len(new))):
            _assigned_tensors(
                f"{path}[{i}]",
                old[i] if i < len(old) else None,
                new[i] if i < len(new) else None,
                found,
                only_tracing,
            )


@contextlib.contextmanager
def detect_attribute_assignment(
    mod: nn.Module,
    message: str = ASSIGNED_TENSOR_MESSAGE,
    *,
    only_tracing: bool = False,
    effects: ForwardEffects | None = None,
) -> Iterator[None]:
    """Restore ``mod``'s plain attributes on exit; raise if a tensor was assigned to one.

    Raises TensorAttributeAssignedError naming every assigned attribute, e.g.
    ``self.block.cache`` or ``self.history[0]``. Attributes of other types are restored
    silently. With ``only_tracing``, only tensors a trace created (fake,
    functional, meta) are reported; real tensors are restored silently. With ``effects``,
    the plain values the body left are recorded there (See Note [Plain attributes a forward
    changes]); a list or dict changed in place gets its contents back in place.
    """
    originals = _attributes(mod)
    before = _copy_containers(originals)
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        after = _attributes(mod)
        found: list[str] = []
        changes: list[Change] = []
        for name, sub in mod.named_modules():
            old_attrs, new_attrs = before.get(name, {}), after.get(name, {})
            orig_attrs = originals.get(name, {})
            prefix = f"self.{name}." if name else "self."
            for attr in sorted(old_attrs.keys() | new_attrs.keys()):
                if attr not in _DERIVED_CACHES:
                    _assigned_tensors(
                        prefix + attr, old_attrs.get(attr), new_attrs.get(attr), found, only_tracing
                    )
                    if effects is not None:
                        _record_change(
                            sub, f"{name}.{attr}" if name else attr, attr,
                            old_attrs.get(attr, _ABSENT), orig_attrs.get(attr, _ABSENT),
                            new_attrs.get(attr, _ABSENT), changes,
                        )
                if attr in old_attrs:
                    _restore(sub, attr, orig_attrs[attr], old_attrs[attr])
                else:
                    del sub.__dict__[attr]
        if effects is not None and not failed:
            effects.recording = changes
        if effects is not None:  # returned by the traced function instead: See Note
            # [Tensors a forward assigns to module attributes]
            returned = {path for _, _, path in effects.targets}
            found = [path for path in found if path not in returned]
        if found and not failed:
            many = len(found) > 1
            raise TensorAttributeAssignedError(
                message.format(
                    noun="attributes" if many else "attribute",
                    names=", ".join(found),
                    verb="were" if many else "was",
                )
            )

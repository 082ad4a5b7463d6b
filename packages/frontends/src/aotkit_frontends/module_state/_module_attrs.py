"""The plain attributes of a module that aot_module's graphs read, checked per call.

# Note [Plain module attributes in aot_module's key]
# A forward reads plain Python attributes of its submodules while it is traced
# (``x * self.scale``, ``if self.use_relu:``, ``self.eps`` of a norm layer); their values
# are baked into the graph as constants or as the branch taken. Changing one afterwards
# (``model.block.scale = 3.0``) changes what eager computes, but torch's aot_module keeps
# running its first graph: a silently wrong result. aotkit's key for aot_module therefore
# holds, besides the training flags (See Note [Training flags in aot_module's key]), the
# current value of every plain attribute that a trace READ. The candidates ("slots") are
# the attributes of every submodule registered when aot_module was called that hold a
# plain value then: bool, int, float, complex, str, None, torch.dtype/device/layout/
# memory_format, numpy scalars, enum members, and tuples, lists and dicts of those
# (recursively); nn.Module's bookkeeping (hooks, tables, ``training``) and torch's derived
# caches (``_flat_weights``) are not. See Note [Module attributes added or mutated later]
# for slots made after aot_module was called.
#
# Reads are recorded while aot_module's function is traced (See Note [Recording module
# attribute reads]); the slots read by any compilation so far are "watched", and only
# watched slots are in the key. An attribute no trace read (``model.step += 1`` in a
# training loop) never recompiles. When a compilation reads a slot not watched before, the
# watched set grows and every entry is re-keyed from the values it was compiled with (a
# snapshot of every slot, taken when its compilation started), so no entry is lost and the
# next call finds its graph. A changed watched value misses the cache and compiles again
# (the ``recompiles`` log names the attribute); a restored value finds its old graph.
# Watching the union over compilations can recompile for a slot one entry did not read
# (a branch flag that selects which attributes are read): never a wrong result.
#
# Values are read straight from each submodule's ``__dict__``; when every watched slot
# holds the same object as on the previous call (compared with ``is``, in C) the previous
# key part is reused. Types are part of the key (``x * 2`` and ``x * 2.0`` differ on
# integer tensors). A numpy scalar is keyed by its type and ``item()``. Any other value
# in a watched slot is keyed by its type only (no identity, nothing kept alive): the
# next compilation then traces it, and a tensor there raises the captured-tensor error,
# while a trace that read an arbitrary object raises ``UnsupportedInputError``, as torch
# does for opaque inputs: aotkit cannot check what the graph baked in from it.
# On disk (See Note [On-disk compile cache] in aotkit_cache), an entry is stored under
# the program's fingerprint extended with the values of every slot (read or not: what was
# read is not stored), and not at all when a slot holds a value that is not plain; a
# compilation restored from it ran no trace, so it watches every slot. Before, a second
# process with ``self.scale = 3.0`` restored the graph traced with 2.0.
# Attributes that are not slots (callables, user objects) are not checked.
#
# Note [Module attributes added or mutated later]
# Three ways an attribute escapes a key built once at aot_module time, each a stale graph
# before (checked with differential tests in tests/test_module_attrs_later.py):
#   * added after aot_module was called, before a compilation: every compilation first
#     rescans the submodules' ``__dict__`` and makes slots of new plain attributes;
#   * read while missing (``getattr(self, "scale", 1.0)``) and added after the graph was
#     compiled: a read of a name that the module does not have (not in its ``__dict__``,
#     class, parameters, buffers or submodules) makes a slot whose value is "missing";
#     setting the attribute changes the key;
#   * a list or dict (of plain values) mutated in place: its key is its contents, and a
#     watched slot holding one is re-read on every call (the identity shortcut of
#     ``values()`` would miss ``self.scales[1] = 5.0``).
# A compilation's snapshot holds the slots that existed when it started; a slot made later
# is keyed, for older entries, with the value it had when it was made (an older entry did
# not read it, or it would already be a slot): at worst one more compilation.
# A tensor stored as a plain attribute (not a parameter or buffer) cannot be a constant of
# the graph: a trace that reads it raises ``CapturedTensorError`` naming the attribute and
# the fix (register_buffer), where the generic captured-tensor error could not name it.
#
# Note [Recording module attribute reads]
# A plain attribute lives in the module's ``__dict__`` and is found by
# ``object.__getattribute__`` without calling any nn.Module method, so reads are seen by
# setting ``nn.Module.__getattribute__`` to a recording function while an aot_module
# function is traced (one swap for all nested or concurrent traces, under a lock that
# guards only the swap). Every read through attribute access is seen: inside ``forward``
# of nested submodules, in properties (their getter's ``self._x``), in forward hooks and
# pre-hooks. Reads through ``self.__dict__[...]`` or ``vars(self)`` are not; and a module
# whose class defines its own ``__getattribute__`` may bypass the recorder, so its slots
# are always watched. Dynamo (which ``torch.cond`` and other higher-order operators run on
# their branches inside the trace) treats a Python ``__getattribute__`` on nn.Module as
# custom and fails on it, so the recorder is taken off while dynamo compiles (its
# compile-start/end callbacks) and put back after; reads made meanwhile are not seen, so a
# compilation during which dynamo ran watches every slot.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import operator
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn
from aotkit_capture import UnsupportedInputError

from ._module_values import _DERIVED_CACHES, _MODULE_INTERNALS, _SCALAR_TYPES, is_plain

_MISSING = ("<aotkit: attribute deleted>",)
_NOT_PLAIN = "<aotkit: not a plain value>"
NOT_PLAIN_READ_MESSAGE = (
    "aot_module: the traced forward read self.{name}, which holds a {type} (a plain "
    "value when aot_module was called). The graph bakes in what the trace read from it, "
    "and aot_module checks on each call only plain values (bool, int, float, complex, "
    "str, None, torch.dtype/device/layout/memory_format, numpy scalars, enum members, "
    "and tuples, lists and dicts of those), so a later change to the object would run a stale graph. Store a plain value "
    "in self.{name}, register a tensor with register_buffer, or pass the value to forward "
    "as an argument."
)


TENSOR_ATTRIBUTE_MESSAGE = (
    "aot_module: the traced forward read {names}, a tensor stored as a plain module "
    "attribute (not a parameter or a buffer). aot_module passes only parameters and "
    "buffers to the graph as inputs; a graph cannot keep another tensor as a constant and "
    "still see its later values. Remedy: register it with self.register_buffer(name, "
    "tensor) (or make it an nn.Parameter), or pass it to forward as an argument. See Note "
    "[Module attributes added or mutated later]."
)
_CONTAINERS = (list, dict)


def _numpy_scalar(v: Any) -> Any:
    """``v.item()`` for a numeric numpy scalar, else None."""
    np = sys.modules.get("numpy")
    if np is None or not isinstance(v, np.generic) or v.dtype.kind not in "biufc":
        return None
    return v.item()


def _key_value(v: Any) -> Any:
    """The part of the key for one slot's value (with its type next to it)."""
    t = type(v)
    if t in _SCALAR_TYPES or v is _MISSING or isinstance(v, enum.Enum):
        return v
    if (t is tuple or t is list) and is_plain(v):
        return tuple((type(x), _key_value(x)) for x in v)
    if t is dict and is_plain(v):
        return tuple((type(k), k, type(x), _key_value(x)) for k, x in v.items())
    item = _numpy_scalar(v)
    if item is not None:
        return item
    return (_NOT_PLAIN, t)


def _is_not_plain(k: Any) -> bool:
    return type(k) is tuple and len(k) == 2 and k[0] == _NOT_PLAIN


KeyPart = tuple[tuple[Any, ...], tuple[type, ...]]


# Note [Class attributes read by forward]
# ``class Block(nn.Module): scale = 2.0`` with ``x * self.scale`` in forward reads the class
# attribute through the instance; ``Block.scale = 3.0`` later changes what eager computes
# without touching the instance. A slot for a name read while the instance's ``__dict__``
# lacks it (a class attribute, or nothing: ``getattr(self, "scale", 1.0)``), or for an
# instance attribute whose class also defines a plain value of that name, therefore reads
# the instance's ``__dict__`` first and then the class (``_InstanceThenClass``), as
# attribute lookup does for plain values: a changed class value, or one added to the class
# later, changes the key and recompiles. Other slots read the ``__dict__`` directly (the
# common, faster case).


class _InstanceThenClass:
    """A slot table reading ``module.__dict__``, then the module's class."""

    __slots__ = ("_cls", "_dict")

    def __init__(self, module: nn.Module) -> None:
        self._dict = module.__dict__
        self._cls = type(module)

    def get(self, attr: str, default: Any) -> Any:
        value = self._dict.get(attr, _UNSET)
        if value is _UNSET:
            value = getattr(self._cls, attr, default)
            if not is_plain(value) and _numpy_scalar(value) is None:
                return default  # a method or descriptor: not a value the trace baked in
        return value


_UNSET = object()


class ModuleAttrs:
    """The plain attribute slots of ``mod``'s submodules, the ones traces read, and the
    key part holding their current values. See Note [Plain module attributes in
    aot_module's key]."""

    def __init__(self, mod: nn.Module) -> None:
        self.names: list[str] = []
        self._slots: list[tuple[dict[str, Any], str]] = []
        self._owners: list[int] = []  # id of each slot's submodule
        # id(submodule) -> {attribute: slot}; the submodules are kept alive by ``mod``
        self._index: dict[int, dict[str, int]] = {}
        self._subs: dict[int, tuple[str, nn.Module]] = {}
        # the value a slot had when it was made after aot_module (See Note [Module
        # attributes added or mutated later]), for the entries compiled before
        self._made_later: dict[int, tuple[Any, type]] = {}
        self._always: list[int] = []
        for prefix, sub in mod.named_modules():
            self._subs[id(sub)] = (prefix, sub)
            self._index.setdefault(id(sub), {})
        self._rescan()
        self.watched_names: list[str] = []  # the key's attributes, named for the log
        # the previous call's raw values, the positions among them holding a list or dict,
        # and their key: one tuple, replaced whole (a call on another thread never reads
        # one call's values with another's key)
        self._last: tuple[list[Any], list[int], KeyPart] = ([], [], ((), ()))
        self._watched: list[int] = []
        self._watched_slots: list[tuple[dict[str, Any], str]] = []
        self._watch(self._always)
        self._reads: set[int] | None = None  # while a compilation runs
        self._unknown_reads: set[tuple[int, str]] = set()
        self._pending: KeyPart | None = None
        self._snapshots: dict[int, KeyPart] = {}  # id(artifacts) -> every slot's key value
        # slots passed to the graph as inputs: See Note [Tensor attributes of aot_module's
        # modules] in _tensor_attrs
        self.tensor_inputs: list[int] = []

    def _add_slot(self, sub_id: int, attr: str, *, with_class: bool = False) -> int:
        prefix, sub = self._subs[sub_id]
        slot = self._index[sub_id][attr] = len(self._slots)
        if _defines_getattribute(type(sub)):  # See Note [Recording module attribute reads]
            self._always.append(slot)
        self.names.append(f"{prefix}.{attr}" if prefix else attr)
        # See Note [Class attributes read by forward]
        table: Any = _InstanceThenClass(sub) if with_class else sub.__dict__
        self._slots.append((table, attr))
        self._owners.append(sub_id)
        return slot

    def _rescan(self) -> list[int]:
        """Make slots of the plain attributes not slots yet; the new slots."""
        new = []
        for sub_id, (_, sub) in self._subs.items():
            own = self._index[sub_id]
            for attr, value in sub.__dict__.items():
                if attr in own or attr in _MODULE_INTERNALS or attr in _DERIVED_CACHES:
                    continue
                if is_plain(value):
                    # a class attribute of the name shows through once this one is deleted
                    with_class = is_plain(getattr(type(sub), attr, None))
                    new.append(self._add_slot(sub_id, attr, with_class=with_class))
        return new

    def _watch(self, slots: Any) -> bool:
        new = set(slots) - set(self._watched)
        if not new:
            return False
        self._watched = sorted({*self._watched, *new})
        self._watched_slots = [self._slots[i] for i in self._watched]
        self.watched_names[:] = [self.names[i] for i in self._watched]
        self._last = ([], [], ((), ()))
        return True

    def values(self) -> KeyPart:
        """The current values of the watched slots and their types, in ``watched_names``
        order (types too, so ``2`` and ``2.0`` or ``1`` and ``True`` differ)."""
        raw = [d.get(k, _MISSING) for d, k in self._watched_slots]
        # the common case: every attribute holds the very objects of the previous call
        last_raw, mutable, last_key = self._last
        if len(raw) == len(last_raw) and all(map(operator.is_, raw, last_raw)):
            # a list or dict can change in place: its contents are compared (See Note
            # [Module attributes added or mutated later])
            vals = last_key[0]
            if all(_key_value(raw[i]) == vals[i] for i in mutable):
                return last_key
        key = (tuple(map(_key_value, raw)), tuple(map(type, raw)))
        self._last = (raw, [i for i, v in enumerate(raw) if type(v) in _CONTAINERS], key)
        return key

    def begin_compile(self) -> None:
        """Start recording reads and take the snapshot of every slot (after making slots of
        the plain attributes added since: See Note [Module attributes added or mutated
        later])."""
        for slot in self._rescan():
            d, k = self._slots[slot]
            value = d.get(k, _MISSING)
            self._made_later[slot] = (_key_value(value), type(value))
        raw = [d.get(k, _MISSING) for d, k in self._slots]
        self._pending = (tuple(map(_key_value, raw)), tuple(map(type, raw)))
        self._reads = set()
        self._unknown_reads = set()

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Record the slots read in the body, when a compilation runs (the traced function
        of aot_module enters this). See Note [Recording module attribute reads]."""
        if self._reads is None:
            yield
            return
        reads, index, unknown = self._reads, self._index, self._unknown_reads

        def saw(module: Any, name: str) -> None:
            own = index.get(id(module))
            if own is not None:
                slot = own.get(name)
                if slot is not None:
                    reads.add(slot)
                else:
                    unknown.add((id(module), name))

        runs = _DYNAMO_RUNS[0]
        with recording_reads(saw):
            yield
        if _DYNAMO_RUNS[0] != runs:  # See Note [Recording module attribute reads]
            reads.update(range(len(self._slots)))

    def end_compile(self, artifacts: Any, restored: bool) -> bool:
        """After a compilation made ``artifacts``: keep its snapshot, watch what it read
        (every slot if ``restored`` from the disk cache). True if the watched set grew
        (the entries must be re-keyed with ``key_of``). Raises if the trace read a slot
        holding a value that is not plain."""
        reads, pending = self._reads, self._pending
        self._reads = self._pending = None
        assert reads is not None and pending is not None, "begin_compile first"
        missing = self._missing_reads()
        if missing:  # See Note [Module attributes added or mutated later]
            vals, types = pending
            made = []
            for sub_id, attr in missing:
                # See Note [Class attributes read by forward]
                slot = self._add_slot(sub_id, attr, with_class=True)
                table, _ = self._slots[slot]
                value = table.get(attr, _MISSING)
                made.append((_key_value(value), tuple if value is _MISSING else type(value)))
                self._made_later[slot] = made[-1]
                reads.add(slot)
            pending = (
                (*vals, *(v for v, _ in made)),
                (*types, *(t for _, t in made)),
            )
        reads.update(self._always)
        reads.update(self.tensor_inputs)
        if restored:
            reads = set(range(len(self._slots)))
        tensor_inputs = set(self.tensor_inputs)
        for i in sorted(reads):
            if i in tensor_inputs and issubclass(pending[1][i], torch.Tensor):
                continue  # passed as an input (See Note [Tensor attributes of aot_module's modules])
            if _is_not_plain(pending[0][i]):
                raise UnsupportedInputError(NOT_PLAIN_READ_MESSAGE.format(
                    name=self.names[i], type=pending[1][i].__name__
                ))
        self._snapshots[id(artifacts)] = pending
        return self._watch(reads)

    def _missing_reads(self) -> list[tuple[int, str]]:
        """The reads of this compilation of names the module does not have."""
        found = []
        for sub_id, attr in sorted(self._unknown_reads):
            _, sub = self._subs[sub_id]
            if attr in sub.__dict__ or hasattr(nn.Module, attr):  # nn.Module's own
                continue
            # a plain class attribute read is a slot too: an instance attribute of that
            # name set later shadows it
            if hasattr(type(sub), attr) and not is_plain(getattr(type(sub), attr)):
                continue
            tables = [sub.__dict__.get(t, {}) for t in ("_parameters", "_buffers", "_modules")]
            if any(attr in t for t in tables):
                continue
            found.append((sub_id, attr))
        self._unknown_reads = set()
        return found

    def take_tensor_reads(self) -> bool:
        """Make the attributes holding a tensor that the running compilation read
        (watched slots, or names that are not slots) inputs of later compilations; True if
        there were new ones. See Note [Tensor attributes of aot_module's modules]."""
        reads = self._reads or set()
        new = [
            i for i in sorted(reads)
            if i not in self.tensor_inputs
            and isinstance(self._slots[i][0].get(self._slots[i][1], None), torch.Tensor)
        ]
        for sub_id, attr in sorted(self._unknown_reads):
            _, sub = self._subs[sub_id]
            value = sub.__dict__.get(attr)
            if not isinstance(value, torch.Tensor) or attr in self._index[sub_id]:
                continue
            slot = self._add_slot(sub_id, attr)
            self._made_later[slot] = (_key_value(value), type(value))
            new.append(slot)
        self.tensor_inputs.extend(new)
        return bool(new)

    def tensor_input_values(self) -> tuple[Any, ...]:
        """The current values of the tensor-input slots: a tensor, or None when the
        attribute holds something else now (its key part then differs)."""
        values = []
        for i in self.tensor_inputs:
            table, attr = self._slots[i]
            value = table.get(attr, None)
            values.append(value if isinstance(value, torch.Tensor) else None)
        return tuple(values)

    def tensor_input_places(self) -> list[tuple[dict[str, Any], str, str]]:
        """``(module.__dict__, attribute, name)`` of each tensor-input slot."""
        subs = [self._subs[self._owners[i]][1] for i in self.tensor_inputs]
        return [
            (sub.__dict__, self._slots[i][1], self.names[i])
            for sub, i in zip(subs, self.tensor_inputs, strict=True)
        ]

    def tensor_attribute_reads(self) -> list[str]:
        """The names of the plain tensor attributes (not parameters or buffers) the failed
        compilation read. See Note [Module attributes added or mutated later]."""
        names = []
        for sub_id, attr in sorted(self._unknown_reads):
            prefix, sub = self._subs[sub_id]
            if isinstance(sub.__dict__.get(attr), torch.Tensor):
                names.append(f"self.{prefix}.{attr}" if prefix else f"self.{attr}")
        return names

    def disk_identity(self, identity: str) -> str | None:
        """``identity`` (the program's fingerprint for the on-disk cache) extended with the
        values of every slot at the start of this compilation, or None (not cached) when a
        slot holds a value that is not plain. See Note [Plain module attributes in
        aot_module's key]."""
        assert self._pending is not None, "begin_compile first"
        vals, types = self._pending
        if any(map(_is_not_plain, vals)):
            return None
        # a tensor attribute may be read by a trace that a restored entry never runs (See
        # Note [Tensor attributes of aot_module's modules] in _tensor_attrs): not stored
        for _, sub in self._subs.values():
            if any(isinstance(v, torch.Tensor) for v in sub.__dict__.values()):
                return None
        typed = repr([
            (name, t.__module__, t.__qualname__, v)
            for name, v, t in zip(self.names, vals, types, strict=True)
        ])
        return f"{identity}|module attributes {hashlib.sha256(typed.encode()).hexdigest()}"

    def key_of(self, artifacts: Any) -> KeyPart:
        """The key part of the entry that made ``artifacts``, for today's watched slots."""
        vals, types = self._snapshots[id(artifacts)]
        n = len(vals)
        later = self._made_later
        return (
            tuple(vals[i] if i < n else later[i][0] for i in self._watched),
            tuple(types[i] if i < n else later[i][1] for i in self._watched),
        )


def rekeyed(
    by_key: dict[tuple[Any, ...], list[Any]], entries: list[Any], attrs: ModuleAttrs
) -> dict[tuple[Any, ...], list[Any]]:
    """aot_module's entries under keys whose attribute part holds today's watched slots
    (each entry's values from its snapshot), in compilation order. The key's last part is
    ``(training flags, attribute values)``."""
    old_key = {id(e): k for k, group in by_key.items() for e in group}
    result: dict[tuple[Any, ...], list[Any]] = {}
    for e in entries:
        k = old_key[id(e)]
        result.setdefault((*k[:-1], (k[-1][0], attrs.key_of(e[2]))), []).append(e)
    return result


def _defines_getattribute(cls: type) -> bool:
    for c in cls.__mro__:
        if c is nn.Module:
            return False
        if "__getattribute__" in c.__dict__:
            return True
    return True


# See Note [Recording module attribute reads]
_LOCK = threading.Lock()
_ACTIVE: tuple[Callable[[Any, str], None], ...] = ()
_BASE: list[Any] = [object.__getattribute__]


def _recording_getattribute(self: Any, name: str) -> Any:
    for saw in _ACTIVE:
        saw(self, name)
    return _BASE[0](self, name)


_DYNAMO_RUNS = [0]  # dynamo compilations started while a recording was active
_INSTALLED = [False]


def _install() -> None:
    if not _INSTALLED[0]:
        _BASE[0] = nn.Module.__dict__.get("__getattribute__", object.__getattribute__)
        nn.Module.__getattribute__ = _recording_getattribute  # type: ignore[method-assign]
        _INSTALLED[0] = True


def _uninstall() -> None:
    if _INSTALLED[0]:
        if _BASE[0] is object.__getattribute__:
            del nn.Module.__getattribute__
        else:
            nn.Module.__getattribute__ = _BASE[0]  # type: ignore[method-assign]
        _INSTALLED[0] = False


def _dynamo_started(args: Any) -> None:
    with _LOCK:
        if _ACTIVE:
            _DYNAMO_RUNS[0] += 1
            _uninstall()


def _dynamo_ended(args: Any) -> None:
    with _LOCK:
        if _ACTIVE:
            _install()


def _hook_dynamo() -> None:
    """Take the recorder off while dynamo compiles (See Note [Recording module attribute
    reads]); dynamo is imported by every trace anyway. Checked on every recording:
    ``torch._dynamo.reset()`` clears dynamo's callbacks."""
    from torch._dynamo.callback import callback_handler

    if _dynamo_started not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(_dynamo_started)
    if _dynamo_ended not in callback_handler.end_callbacks:
        callback_handler.register_end_callback(_dynamo_ended)


@contextlib.contextmanager
def recording_reads(saw: Callable[[Any, str], None]) -> Iterator[None]:
    """Call ``saw(module, name)`` for every attribute read of any nn.Module in the body.
    See Note [Recording module attribute reads]."""
    global _ACTIVE
    _hook_dynamo()
    with _LOCK:
        if not _ACTIVE:
            _install()
        _ACTIVE = (*_ACTIVE, saw)
    try:
        yield
    finally:
        with _LOCK:
            rest = list(_ACTIVE)
            rest.remove(saw)
            _ACTIVE = tuple(rest)
            if not _ACTIVE:
                _uninstall()


def explain_attr_change(
    names: list[str], old: KeyPart, new: KeyPart
) -> list[str]:
    """One sentence per changed attribute, for the ``recompiles`` log (``old``/``new`` are
    ``ModuleAttrs.values()`` results)."""

    def show(v: Any, t: type) -> str:
        if v is _MISSING:
            return "<deleted>"
        if _is_not_plain(v):
            return f"a {t.__name__}"
        if t is tuple or t is list:
            return repr(t(_plain_of(x) for x in v))
        if t is dict:
            return repr({k: _plain_of((tx, x)) for _, k, tx, x in v})
        return repr(v)

    reasons = []
    (old_vals, old_types), (new_vals, new_types) = old, new
    if len(old_vals) != len(new_vals):  # the watched slots changed in between
        return ["the module attributes the graphs read changed"]
    for i, (a, b, ta, tb) in enumerate(zip(old_vals, new_vals, old_types, new_types, strict=True)):
        if a == b and ta is tb:
            continue
        name = names[i] if i < len(names) else f"#{i}"
        reasons.append(
            f"module attribute self.{name} changed from {show(a, ta)} to {show(b, tb)} "
            "(its value was baked into the graph)"
        )
    return reasons or ["a module attribute changed"]


def _plain_of(typed: Any) -> Any:
    t, v = typed
    if t is tuple or t is list:
        return t(_plain_of(x) for x in v)
    if t is dict:
        return {k: _plain_of((tx, x)) for _, k, tx, x in v}
    return v

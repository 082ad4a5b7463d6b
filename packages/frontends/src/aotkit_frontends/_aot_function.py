"""aot_function and aot_module: the drop-in entry points.

See Note [Compile cache keys] for when a new compilation happens.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from aotkit_capture import (
    COMPILATIONS_IN_PROGRESS,
    COMPILE_LOCK,
    CapturedTensorError,
    CompiledArtifacts,
    GeneratorStateError,
    Runner,
    captured_tensor_error,
    check_input_kinds,
    compile_flat,
    entered_until_backward_traced,
    inside_a_trace,
    is_captured_tensor_error,
)
from aotkit_functional import leaf_inputs
from aotkit_partitioners import default_partition
from aotkit_schemas import AOTConfig, BufferAOTInput, ParamAOTInput, disk_cache_enabled

from aotkit_frontends.module_state._attribute_guard import (
    AOT_MODULE_ASSIGNED_TENSOR_MESSAGE,
    detect_attribute_assignment,
)
from aotkit_frontends.module_state._module_attrs import (
    TENSOR_ATTRIBUTE_MESSAGE,
    ModuleAttrs,
    rekeyed,
)
from aotkit_frontends.module_state._module_effects import ForwardEffects
from aotkit_frontends.module_state._module_structure import Rebuilding
from aotkit_frontends.module_state._reparametrize import (
    distinct_positions,
    read_module_state,
    reparametrized,
)
from aotkit_frontends.module_state._tensor_attrs import (
    RETRY_LIMIT,
    TENSOR_ATTRIBUTES,
    RetryWithTensorAttributes,
    swapped_tensor_attributes,
)

from ._disk_cache import disk_cache, disk_identity
from ._guards import describe_flat_input, input_key
from ._lifted_globals import SlotsChanged, TensorSlot, lifted, read_slots, tensor_slots
from ._outputs import OutputLayout, flatten_function
from ._recompile import log_recompile

log = logging.getLogger(__name__)
_AOT_COUNTER = itertools.count()
# argument types that torch's pytree treats as leaves (None is not: it is an empty node)
_FLAT_LEAF_TYPES = (torch.Tensor, int, float, bool, str)


def _resolve_partitioner(partition_fn: Any) -> Callable[..., Any]:
    if isinstance(partition_fn, str):
        import aotkit_partitioners as parts

        getter = getattr(parts, "get_partitioner", None)
        if getter is None:
            raise ValueError(f"unknown partitioner {partition_fn!r}")
        resolved: Callable[..., Any] = getter(partition_fn)
        return resolved
    if not callable(partition_fn):
        raise TypeError(f"partition_fn must be a callable or a registered name, got {partition_fn!r}")
    fn: Callable[..., Any] = partition_fn
    return fn


def make_config(
    fw_compiler: Callable[..., Any],
    bw_compiler: Callable[..., Any] | None,
    partition_fn: Any,
    decompositions: dict[Any, Callable[..., Any]] | None,
    num_params_buffers: int,
    keep_inference_input_mutations: bool,
    inference_compiler: Callable[..., Any] | None,
    *,
    dynamic: bool = False,
    enable_log: bool = True,
    is_export: bool = False,
    **extra: Any,
) -> AOTConfig:
    return AOTConfig(
        fw_compiler=fw_compiler,
        bw_compiler=bw_compiler if bw_compiler is not None else fw_compiler,
        inference_compiler=inference_compiler if inference_compiler is not None else fw_compiler,
        partition_fn=_resolve_partitioner(partition_fn),
        decompositions=dict(decompositions or {}),
        num_params_buffers=num_params_buffers,
        aot_id=next(_AOT_COUNTER),
        keep_inference_input_mutations=keep_inference_input_mutations,
        dynamic_shapes=dynamic,
        enable_log=enable_log,
        is_export=is_export,
        **extra,
    )


Entry = tuple[Runner, OutputLayout, CompiledArtifacts]


class _RetryWithSlots(Exception):
    """The trace reached global or closure tensors, now lifted: call again with them.
    See Note [Global tensors lifted as inputs]."""


class CompiledCache:
    """Compiled entries of one function, keyed as in Note [Compile cache keys].

    With dynamic shapes several entries may share a key; each is valid under its
    ShapeEnv guards (See Note [Shape guards]).
    """

    def __init__(self, fn: Callable[..., Any], cfg: AOTConfig) -> None:
        self.fn = fn
        self.cfg = cfg
        # every compilation, oldest first (len(entries) == number of compilations)
        self.entries: list[Entry] = []
        self._by_key: dict[tuple[Any, ...], list[Entry]] = {}
        # the last call's key and entry, one tuple: read without a lock (See Note
        # [Concurrent first calls] in aotkit_capture)
        self._last: tuple[tuple[Any, ...], Entry] | None = None
        self._flat_specs: dict[int, pytree.TreeSpec] = {}
        self._dynamic = cfg.dynamic_shapes
        self._num_static = cfg.num_params_buffers
        # what an error about captured tensors walks, and what it skips (aot_module's
        # module, whose tensors are inputs): See Note [Tensors captured by closure or global]
        self.user_fn: tuple[Callable[..., Any], tuple[Any, ...]] = (fn, ())
        # what the on-disk cache key fingerprints as the program (aot_module: the module,
        # not the aotkit wrapper that calls it): See Note [The program in aot_function's
        # disk key]
        self.cache_program: Any = fn
        # aot_module: the train/eval flags of every submodule, part of the key (See Note
        # [Training flags in aot_module's key])
        # and the values of their plain attributes (See Note [Plain module attributes in
        # aot_module's key]), named by ``attr_names``
        self.module_modes: Callable[[], tuple[Any, ...]] | None = None
        self.attr_names: list[str] = []
        self.module_attrs: ModuleAttrs | None = None
        # aot_module: attribute changes replayed after a call (See Note [Plain attributes a
        # forward changes])
        self.effects: ForwardEffects | None = None
        # aot_function: the global and closure tensors lifted as inputs, and the program
        # that takes them (See Note [Global tensors lifted as inputs])
        self.slots: list[TensorSlot] = []
        self._program: Callable[..., Any] = fn
        self._slots_checked = False
        # the error of the first trace with lifted slots: set, the function runs with its
        # tensors captured as before (See Note [Global tensors lifted as inputs])
        self._lift_error: Exception | None = None

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if COMPILATIONS_IN_PROGRESS[0] and inside_a_trace():
            # See Note [Compiled functions called while aotkit traces] in aotkit_tracing
            return self.fn(*args, **kwargs)
        if not self.slots:
            try:
                return self._call(args, kwargs)
            except _RetryWithSlots:
                pass
        while True:  # See Note [Global tensors lifted as inputs]
            try:
                extra = read_slots(self.slots, checked=True)
            except SlotsChanged:
                self._found_again()
                continue
            try:
                return self._call((*args, *extra), kwargs)
            except _RetryWithSlots:
                continue

    def _found_again(self) -> None:
        """A function on the way to a slot was rebound: find the slots again, and compile
        again. See Note [Global tensors lifted as inputs]."""
        with COMPILE_LOCK:
            self.slots = tensor_slots(self.user_fn[0])
            self._program = lifted(self.fn, self.slots)
            self._by_key.clear()
            self._last = None

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        flat = not kwargs
        if flat:
            for a in args:
                if not isinstance(a, _FLAT_LEAF_TYPES):
                    flat = False
                    break
        if flat:
            # Fast path: positional tensors/scalars flatten to themselves.
            flat_args = list(args)
            in_spec = self._flat_specs.get(len(args))
            if in_spec is None:
                in_spec = self._flat_specs[len(args)] = pytree.tree_flatten((args, {}))[1]
        else:
            flat_args, in_spec = pytree.tree_flatten((args, kwargs))
        key: tuple[Any, ...] = (
            in_spec, input_key(flat_args, dynamic=self._dynamic, num_static=self._num_static)
        )
        if self.module_modes is not None:
            key = (*key, self.module_modes())
        last = self._last
        if (
            last is None
            or key != last[0]
            or (last[1][2].guard is not None and not last[1][2].guard(flat_args))
        ):
            with COMPILE_LOCK:  # a miss: See Note [Concurrent first calls] in aotkit_capture
                key, entry = self._lookup(key, flat_args, in_spec)
                self._last = (key, entry)
        else:
            entry = last[1]
        if self.effects is not None:  # See Note [Plain attributes a forward changes]
            return self.effects.after_call(entry[2], entry[1].unflatten(entry[0](flat_args)))
        return entry[1].unflatten(entry[0](flat_args))

    def _lookup(
        self, key: tuple[Any, ...], flat_args: list[Any], in_spec: pytree.TreeSpec
    ) -> tuple[tuple[Any, ...], Entry]:
        """The newest entry for ``key`` whose guards pass, else a new compilation (and
        its key: a compilation that reads new module attributes re-keys the entries)."""
        candidates = self._by_key.setdefault(key, [])
        for entry in reversed(candidates):
            guard = entry[2].guard
            if guard is None or guard(flat_args):
                return key, entry
        log_recompile(
            self.fn, self._last[0] if self._last is not None else None, key, candidates[-1][2].guard if candidates else None,
            flat_args, len(self.entries), attr_names=self.attr_names,
        )
        attrs = self.module_attrs
        if attrs is not None:  # See Note [Plain module attributes in aot_module's key]
            attrs.begin_compile()
        entry = self._compile(flat_args, in_spec)
        grew = attrs is not None and attrs.end_compile(entry[2], entry[2].from_cache)
        if self.effects is not None and attrs is not None:
            self.effects.compiled(entry[2], attrs.watched_names)
        candidates.append(entry)
        self.entries.append(entry)
        if grew:
            assert attrs is not None
            self._by_key = rekeyed(self._by_key, self.entries, attrs)
            key = (*key[:-1], (key[-1][0], attrs.key_of(entry[2])))
        return key, entry

    def _lift(self) -> bool:
        """Whether the function reaches global or closure tensors not lifted yet, now
        lifted. See Note [Global tensors lifted as inputs]."""
        user_fn, skip = self.user_fn
        if skip or self.module_attrs is not None or self._lift_error is not None:
            return False
        known = {(id(s.holder), id(s.cell), s.name) for s in self.slots}
        new = [s for s in tensor_slots(user_fn) if (id(s.holder), id(s.cell), s.name) not in known]
        if not new:
            return False
        self.slots = [*self.slots, *new]
        self._program = lifted(self.fn, self.slots)
        return True

    def _compile(self, flat_args: list[Any], in_spec: pytree.TreeSpec) -> Entry:
        if not self._slots_checked:
            self._slots_checked = True
            if self._lift():  # before any trace: See Note [Global tensors lifted as inputs]
                raise _RetryWithSlots()
        check_input_kinds(flat_args, functools.partial(
            describe_flat_input, in_spec, self.cfg.num_params_buffers
        ))
        outputs = OutputLayout()
        flat_fn = flatten_function(self._program, in_spec, outputs)
        # See Note [On-disk compile cache] in aotkit_cache: off unless AOTKIT_CACHE=1 or
        # disk_cache_config says so, and then only with compilers that offer cache keys
        identity = (
            disk_identity(self.cache_program, in_spec) if disk_cache_enabled(default=False) else None
        )
        if identity is not None and self.module_attrs is not None:
            # See Note [Plain module attributes in aot_module's key]: on disk, every slot
            identity = self.module_attrs.disk_identity(identity)
        try:
            # See Note [Generators created while tracing] in aotkit_capture
            # the key holds each input's leafness: See Note [Input wrappers that are
            # autograd leaves] in aotkit_functional
            with leaf_inputs("leaves"):
                sidecar = outputs if self.effects is None else self.effects.sidecar(outputs)
                runner, artifacts = compile_flat(
                    flat_fn, flat_args, self.cfg, cache=disk_cache(identity, sidecar)
                )
        except Exception as e:
            if (
                self.slots
                and self._lift_error is None
                # a refusal the lifted generators made visible stands
                and not isinstance(e, (_RetryWithSlots, GeneratorStateError))
            ):
                # See Note [Global tensors lifted as inputs]: traced again, unlifted
                self._lift_error = e
                self.slots, self._program = [], self.fn
                raise _RetryWithSlots() from e
            attrs = self.module_attrs
            # See Note [Tensor attributes of aot_module's modules]
            if attrs is not None and attrs.take_tensor_reads():
                raise RetryWithTensorAttributes() from e
            if not isinstance(e, (AssertionError, RuntimeError)) or not is_captured_tensor_error(e):
                raise
            # See Note [Module attributes added or mutated later]
            tensor_attrs = attrs.tensor_attribute_reads() if attrs is not None else []
            if tensor_attrs:
                message = TENSOR_ATTRIBUTE_MESSAGE.format(names=", ".join(tensor_attrs))
                raise CapturedTensorError(message) from e
            # See Note [Tensors captured by closure or global]
            if self._lift():  # a global rebound to a tensor since: lifted too
                raise _RetryWithSlots() from e
            user_fn, skip = self.user_fn
            raise captured_tensor_error(user_fn, e, skip) from e
        # a trace that read a tensor attribute only for its metadata: See Note [Tensor
        # attributes of aot_module's modules]
        if self.module_attrs is not None and self.module_attrs.take_tensor_reads():
            raise RetryWithTensorAttributes()
        return runner, outputs, artifacts

    @property
    def artifacts(self) -> list[CompiledArtifacts]:
        return [e[2] for e in self.entries]


def aot_function(
    fn: Callable[..., Any],
    fw_compiler: Callable[..., Any],
    bw_compiler: Callable[..., Any] | None = None,
    partition_fn: Callable[..., Any] = default_partition,
    decompositions: dict[Any, Callable[..., Any]] | None = None,
    num_params_buffers: int = 0,
    keep_inference_input_mutations: bool = False,
    inference_compiler: Callable[..., Any] | None = None,
    *,
    dynamic: bool = False,
    enable_log: bool = True,
    disable_functionalization: bool = False,
    _disable_torch_fn_metadata_mode: bool = False,
    joint_pass: Callable[..., Any] | None = None,
    _input_descs: Sequence[Any] | None = None,
) -> Callable[..., Any]:
    """Trace ``fn``'s forward and backward ahead of time and compile them.

    Same signature and calling conventions as ``torch._functorch.aot_autograd.aot_function``.
    The graphs are traced on the first call (and again for inputs that need a different
    specialization, see Note [Compile cache keys]); ``fw_compiler``/``bw_compiler`` receive
    the partitioned forward and backward graphs, ``inference_compiler`` (default
    ``fw_compiler``) the single graph traced when no gradient is needed.

    ``disable_functionalization=True`` traces as torch does then: in-place ops stay in the
    graphs where they ran (See Note [Tracing without functionalization] in aotkit_tracing).
    ``_disable_torch_fn_metadata_mode`` is accepted for signature compatibility with torch.
    ``joint_pass(joint, joint_inputs) -> joint`` edits the joint graph before partitioning
    (See Note [Joint graph passes] in aotkit_schemas).
    """
    cfg = make_config(
        fw_compiler, bw_compiler, partition_fn, decompositions, num_params_buffers,
        keep_inference_input_mutations, inference_compiler, dynamic=dynamic,
        enable_log=enable_log, disable_functionalization=disable_functionalization,
        joint_pass=joint_pass, input_descs=_input_descs,
    )
    cache = CompiledCache(fn, cfg)

    @functools.wraps(fn)
    def returned_function(*args: Any, **kwargs: Any) -> Any:
        return cache(args, kwargs)

    returned_function._aotkit_cache = cache  # type: ignore[attr-defined]
    return returned_function


compiled_function = aot_function


class _StateSlots:
    """Where each lifted parameter and buffer lives, so a call reads the module's current
    tensors with two dict lookups each (no ``named_parameters()`` walk, no pytree)."""

    def __init__(self, mod: nn.Module) -> None:
        # the names and order of ``named_parameters``/``named_buffers`` with
        # ``remove_duplicate=False`` (every path to a submodule, None entries skipped), in
        # one walk that keeps each entry's dict
        params: list[tuple[dict[str, Any], str, str]] = []
        buffers: list[tuple[dict[str, Any], str, str]] = []
        for prefix, sub in mod.named_modules(remove_duplicate=False):
            dot = f"{prefix}." if prefix else ""
            for slots, owner in ((params, sub._parameters), (buffers, sub._buffers)):
                slots.extend((owner, leaf, dot + leaf) for leaf, v in owner.items() if v is not None)
        self.param_names = [name for _, _, name in params]
        self.buffer_names = [name for _, _, name in buffers]
        self.slots = params + buffers
        # See Note [A submodule reachable under two names]
        self.distinct = distinct_positions((owner, leaf) for owner, leaf, _ in self.slots)

    def __aotkit_fingerprint__(self) -> Any:
        """The slots' names; the module itself is fingerprinted separately."""
        return (self.param_names, self.buffer_names)

    def current(self) -> list[Any]:
        values = []
        for owner, leaf, name in self.slots:
            value = owner.get(leaf)
            if value is None:
                raise RuntimeError(
                    f"aot_module: the module's {name} was removed or set to None after "
                    "aot_module() was called; compile the module again after changing its "
                    "parameters or buffers."
                )
            values.append(value)
        return values


# Note [Training flags in aot_module's key]
# A forward reads ``self.training`` (dropout, batch norm's batch statistics and running
# stat updates, user branches) while it is traced, so a graph traced in train mode is
# wrong in eval mode and the reverse. torch's aot_module keeps running its first graph
# after ``model.eval()``: dropout stays on and batch norm keeps updating its running
# stats, silently. aotkit's key holds the ``training`` flag of every submodule (those
# registered when aot_module was called), so ``eval()``/``train()`` on the module or any
# submodule selects (or compiles) the graph traced in that mode.


class AOTModule(nn.Module):
    """The module returned by ``aot_module``: calls the compiled functional form of
    ``orig_module`` with its current parameters and buffers (read on every call, so
    reassigned parameters are seen), compiled for its current tree of submodules (See Note
    [Submodules, parameters and buffers added or removed later])."""

    def __init__(self, orig_module: nn.Module, tree: Rebuilding) -> None:
        super().__init__()
        self.orig_module = orig_module
        self._tree = tree
        self._compiled, self._state, self._effects, self._attrs = tree.compiled

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if COMPILATIONS_IN_PROGRESS[0] and inside_a_trace():
            # See Note [Compiled functions called while aotkit traces] in aotkit_tracing
            return self.orig_module(*args, **kwargs)
        compiled, state, effects, attrs = self._tree.current()
        if compiled is not self._compiled:
            self._compiled, self._state, self._effects, self._attrs = (
                compiled, state, effects, attrs
            )
        if effects.eager:  # See Note [Plain attributes a forward changes]
            return self.orig_module(*args, **kwargs)
        # See Note [Tensor attributes of aot_module's modules]
        for _ in range(RETRY_LIMIT):
            # See Note [Module state read while another thread traces]
            tensors, extra = read_module_state(lambda: self._module_state(state, attrs))
            try:
                return compiled(*tensors, *args, **kwargs, **extra)
            except RetryWithTensorAttributes:
                continue
        raise RuntimeError(
            f"aot_module: the forward read new tensors held in plain module attributes on "
            f"each of {RETRY_LIMIT} traces in a row, so aotkit could not settle which of "
            f"them are graph inputs. Register them as buffers (module.register_buffer) "
            f"or pass them to forward as arguments. See Note [Tensor attributes of "
            f"aot_module's modules]."
        )


    @staticmethod
    def _module_state(state: _StateSlots, attrs: ModuleAttrs) -> tuple[list[Any], dict[str, Any]]:
        """The module's current parameters and buffers, and the tensor attributes the
        graphs take as inputs (as keyword arguments). See Note [Tensor attributes of
        aot_module's modules]."""
        extra: dict[str, Any] = {}
        if attrs.tensor_inputs:
            values = attrs.tensor_input_values()
            if any(v is not None for v in values):
                extra = {TENSOR_ATTRIBUTES: values}
        return state.current(), extra


def aot_module(mod: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
    """Compile ``mod`` with ``aot_function``, lifting parameters and buffers as inputs.

    Takes the same arguments as ``aot_function`` after the module. Parameters and buffers
    (``named_parameters``/``named_buffers`` with ``remove_duplicate=False``) are the first
    ``num_params_buffers`` flat inputs.
    """
    if "num_params_buffers" in kwargs:
        raise TypeError("aot_module computes num_params_buffers itself; do not pass it")
    # See Note [Submodules, parameters and buffers added or removed later]
    tree = Rebuilding(mod, lambda: _compile_module(mod, args, dict(kwargs)))
    return AOTModule(mod, tree)


def _compile_module(
    mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Callable[..., Any], _StateSlots, ForwardEffects, ModuleAttrs]:
    """aot_function over ``mod``'s functional form for its current tree: the compiled
    function, the slots of its lifted parameters and buffers, and the attribute changes
    its entries replay (See Note [Plain attributes a forward changes])."""
    state = _StateSlots(mod)
    effects = ForwardEffects()
    n_state = len(state.slots)
    names = [name for _, _, name in state.slots]

    def functional_call(*flat: Any, **kw: Any) -> Any:
        tensors = {names[i]: flat[i] for i in state.distinct}
        tensor_attrs = kw.pop(TENSOR_ATTRIBUTES, ())
        # See Note [Parameters and buffers reassigned in forward]
        # See Note [Tensors assigned to module attributes by aot_module]
        # See Note [Contexts that span the backward trace]
        with entered_until_backward_traced(
            detect_attribute_assignment(
                mod, AOT_MODULE_ASSIGNED_TENSOR_MESSAGE, only_tracing=True, effects=effects
            ),
            reparametrized(mod, tensors, who="aot_module"),
            attrs.recording(),  # See Note [Recording module attribute reads]
        ):
            # See Note [Tensor attributes of aot_module's modules]
            with swapped_tensor_attributes(mod, attrs, tensor_attrs):
                out = mod(*flat[n_state:], **kw)
            # See Note [Tensors a forward assigns to module attributes]
            assigned = effects.take_assigned_tensors(mod)
            return (out, assigned) if assigned else out

    kwargs["num_params_buffers"] = n_state
    # See Note [Graph descriptors]: the graphs name the lifted state by FQN
    kwargs["_input_descs"] = [ParamAOTInput(n) for n in state.param_names] + [
        BufferAOTInput(n) for n in state.buffer_names
    ]
    compiled = aot_function(functional_call, *args, **kwargs)
    cache = compiled._aotkit_cache  # type: ignore[attr-defined]
    cache.user_fn = (mod.forward, (mod,))
    cache.cache_program = mod  # See Note [The program in aot_function's disk key]
    # See Note [Training flags in aot_module's key]
    # See Note [Plain module attributes in aot_module's key]
    submodules = list(mod.modules())
    attrs = ModuleAttrs(mod)
    cache.module_modes = lambda: (tuple([m.training for m in submodules]), attrs.values())
    cache.attr_names = attrs.watched_names
    cache.module_attrs = attrs
    cache.effects = effects
    return compiled, state, effects, attrs


compiled_module = aot_module

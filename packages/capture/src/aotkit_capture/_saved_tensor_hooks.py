"""Saved-tensors hooks that are GraphModules, inlined into the forward and backward graphs.

# Note [Inlined saved-tensors hooks]
# ``torch.autograd.graph.saved_tensors_hooks(pack, unpack)`` makes autograd call ``pack``
# on every tensor it saves and ``unpack`` when the backward reads it (activation
# quantization, offloading). As torch's AOTAutograd does, when the innermost default hooks
# at compile time are both ``torch.fx.GraphModule``s (and no compiled autograd region is
# active), the hooks become part of the compiled graphs after partitioning:
#   * the pack hook is traced (make_fx, functionalized, the compile's decompositions) once
#     per selected saved tensor, on its fake value, and copied to the end of the forward;
#     each tensor or SymInt it returns becomes a forward output named
#     ``f"{saved}_hook_{i}"`` (``i``: the leaf's position in what pack returned), unless it
#     is a forward input or a user output, which keeps its name. Other leaves (a dtype, a
#     Python number) are constants;
#   * the unpack hook is traced on what pack returned and copied to the start of the
#     backward, right after its placeholders: the saved placeholder is replaced by one
#     placeholder per returned tensor (where the saved one was) and per SymInt (first),
#     constants are written into the graph, and the saved value's users read unpack's
#     result. The last selected saved tensor's prologue comes first, as in torch. Packed
#     SymInts' placeholders go before the first placeholder that is not one: torch's
#     anchor (the backward's original first placeholder) while it exists; where torch's
#     anchor was a saved tensor already replaced (no saved SymInts), torch fails its own
#     order check, and aotkit keeps the calling convention instead;
#   * the forward returns ``(*user outputs, *saved tensors and packed tensors in the saved
#     order, *packed SymInts, *saved SymInts)``, the backward's placeholders follow, and the
#     names on both sides agree (checked).
# Which saved tensors get the hooks: ``torch._functorch.config.
# saved_tensors_hooks_filtering_mode``: ``"donated"`` (the default) only the donated
# buffers of the partitioned graphs (See Note [Donated buffers]: intermediates nothing else
# holds, whose memory packing can actually free; none means no inlining at all),
# ``"no_static"`` all but the static inputs (parameters), ``"all"`` all. Saved SymInts
# never get hooks. A hook that writes to its input is refused, and a pack hook that returns
# a tensor subclass raises NotImplementedError naming the workaround, with torch's texts.
# While a hook is traced, ``get_saved_tensor_hook_context()`` returns the forward graph,
# the backward graph and the saved node (torch's private
# ``_get_saved_tensor_hook_context()``), so a hook can decide per saved value; hooks that
# call torch's own function see the same context (See Note [Hooks and logs written
# against torch]).
# Donated buffers and the ``bw_donated_idxs`` line are computed on the graphs after
# inlining, so packed values count as the fresh intermediates they are. At run time the
# hooks are disabled around the compiled call (See Note [Inlined saved-tensors hooks at
# run time] in aotkit_runtime); the compile key holds the hooks' identity and the filtering
# mode (See Note [Ambient state in the compile key]); the on-disk cache refuses such
# compilations, since it cannot compare GraphModule hooks across processes.
#
# Hooks of any other kind (plain Python functions) are applied by autograd at run time to
# the real saved tensors, as in eager. While aotkit compiles, the caller's hooks are taken
# off autograd's stack and put back afterwards: autograd would otherwise call them on fake
# tensors and record their ops into the joint graph. Not torch's way (it makes autograd
# ignore every default hook while tracing): hooks the traced function pushes itself, such
# as a non-reentrant checkpoint's, keep working, so the joint traces the checkpoint's
# recomputation as eager runs it.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from aotkit_functional import from_functional, functionalized, has_data_mutation, to_functional
from aotkit_runtime import with_inlined_saved_tensors_hooks
from aotkit_schemas import DecompositionTable, ViewAndMutationMeta, is_sym_node
from torch._dispatch.python import enable_python_dispatcher
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.immutable_collections import immutable_dict, immutable_list
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from aotkit_capture.compile._donated_buffers import bw_donated_idxs

_autograd: Any = torch._C._autograd
_FILTERING_MODES = ("donated", "no_static", "all")

SUBCLASS_PACK_ERROR = (
    "Tensor subclasses in GraphModule saved tensors hooks are not supported"
    "You can workaround it by manually returning subclass's inner tensors"
    " in the pack hook, and reconstructing the subclass in the unpack hook"
)
MUTATING_HOOK_ERROR = "Saved tensors hooks with inputs mutations are not allowed"


@dataclass(frozen=True)
class SavedTensorHookContext:
    """What a GraphModule hook being traced may read about the saved value: the forward
    graph, the backward graph and the forward node saved for backward (its ``meta`` holds
    ``val``, ``stack_trace``, ...). ``ctx["_fw_graph"]``, ``ctx["_bw_graph"]`` and
    ``ctx["_node"]`` read them as torch's dict does. See Note [Inlined saved-tensors hooks].
    """

    fw_graph: torch.fx.Graph
    bw_graph: torch.fx.Graph
    node: torch.fx.Node

    def __getitem__(self, key: str) -> Any:
        fields = {"_fw_graph": self.fw_graph, "_bw_graph": self.bw_graph, "_node": self.node}
        return fields[key]

    def keys(self) -> tuple[str, ...]:
        return ("_fw_graph", "_bw_graph", "_node")


_state = threading.local()


def get_saved_tensor_hook_context() -> SavedTensorHookContext | None:
    """The graph context of the saved value whose GraphModule hook aotkit is tracing, or
    None outside such a trace (aotkit's ``_get_saved_tensor_hook_context()``). See Note
    [Inlined saved-tensors hooks]."""
    return getattr(_state, "context", None)


# Note [Hooks and logs written against torch]
# Saved-tensors hooks written for torch's AOTAutograd read their graph context through
# torch's private ``torch._functorch._aot_autograd.graph_compile.
# _get_saved_tensor_hook_context()``, which returns the dict in that module's thread-local
# ``_thread_local.state`` (``{"_fw_graph", "_bw_graph", "_node"}``), and tests or log
# scrapers listen for the ``bw_donated_idxs=[...]`` line on that module's loggers. For such
# hooks to run unchanged under aotkit (drop-in), while aotkit traces a hook, and only if
# ``sys.modules`` already holds torch's module (a hook that calls it has imported it), the
# same context is mirrored into that slot, in torch's dict shape, and the previous value
# is put back afterwards (deleted when there was none, as torch does). aotkit never
# imports the module (package code must not depend on torch's AOTAutograd): when the
# module is not loaded, no hook can be reading its slot. The metadata line, with
# ``bw_donated_idxs``, is logged on torch's logger name by ``logging.getLogger`` (See
# Note [torch's aot_graphs metadata line] in _logs.py).
_TORCH_GRAPH_COMPILE = "torch._functorch._aot_autograd.graph_compile"


@contextlib.contextmanager
def _torch_hook_context(context: SavedTensorHookContext) -> Iterator[None]:
    """Mirror ``context`` into torch's hook-context slot for the body, if torch's module
    is loaded. See Note [Hooks and logs written against torch]."""
    module = sys.modules.get(_TORCH_GRAPH_COMPILE)
    slot = getattr(module, "_thread_local", None)
    if slot is None:
        yield
        return
    missing = object()
    previous = getattr(slot, "state", missing)
    slot.state = {"_fw_graph": context.fw_graph, "_bw_graph": context.bw_graph, "_node": context.node}
    try:
        yield
    finally:
        if previous is missing:
            if hasattr(slot, "state"):
                del slot.state
        else:
            slot.state = previous


@contextlib.contextmanager
def _hook_context(context: SavedTensorHookContext) -> Iterator[None]:
    previous = getattr(_state, "context", None)
    _state.context = context
    try:
        with _torch_hook_context(context):
            yield
    finally:
        _state.context = previous


def inlineable_hooks() -> tuple[torch.fx.GraphModule, torch.fx.GraphModule] | None:
    """The innermost default saved-tensors hooks when aotkit inlines them (both
    GraphModules, outside compiled autograd), else None."""
    hooks = _autograd._top_saved_tensors_default_hooks(True)
    if hooks is None:
        return None
    pack, unpack = hooks
    if not (isinstance(pack, torch.fx.GraphModule) and isinstance(unpack, torch.fx.GraphModule)):
        return None
    if _in_compiled_autograd():
        return None
    return pack, unpack


def _in_compiled_autograd() -> bool:
    module = sys.modules.get("torch._dynamo.compiled_autograd")
    return bool(getattr(module, "in_compiled_autograd_region", False))


def filtering_mode() -> str:
    mode = str(torch._functorch.config.saved_tensors_hooks_filtering_mode)
    if mode not in _FILTERING_MODES:
        raise ValueError(
            f"aotkit: unknown torch._functorch.config.saved_tensors_hooks_filtering_mode "
            f"{mode!r}; use one of {', '.join(map(repr, _FILTERING_MODES))}"
        )
    return mode


def saved_tensors_hooks_key() -> tuple[Any, ...] | None:
    """The part of the compile key for inlined hooks: ``(pack, unpack, filtering mode)``
    (the hook objects, compared by identity), or None when no hooks would be inlined."""
    inline = inlineable_hooks()
    if inline is None:
        return None
    return (*inline, str(torch._functorch.config.saved_tensors_hooks_filtering_mode))


@contextlib.contextmanager
def hooks_hidden_while_tracing() -> Iterator[None]:
    """Take the caller's default saved-tensors hooks off autograd's stack for the body
    (the compilation: its traces run on fake tensors), and put them back after; the
    innermost inlineable hooks are what ``compile_hooks()`` returns meanwhile. Hooks
    pushed inside the body (a non-reentrant checkpoint in the traced function) work as
    usual. See Note [Inlined saved-tensors hooks]."""
    previous = getattr(_state, "compile_hooks", None)
    _state.compile_hooks = inlineable_hooks()
    hidden: list[tuple[Any, Any]] = []
    # while hooks are disabled no hook runs, and pushing them back would raise
    if _autograd._saved_tensors_hooks_get_disabled_error_message() is None:
        while (top := _autograd._top_saved_tensors_default_hooks(True)) is not None:
            hidden.append(top)
            _autograd._pop_saved_tensors_default_hooks()
    try:
        yield
    finally:
        for pack, unpack in reversed(hidden):
            _autograd._push_saved_tensors_default_hooks(pack, unpack)
        _state.compile_hooks = previous


def compile_hooks() -> tuple[torch.fx.GraphModule, torch.fx.GraphModule] | None:
    """The inlineable hooks in force when the running compilation started (None outside
    ``hooks_hidden_while_tracing``)."""
    return getattr(_state, "compile_hooks", None)


def _plain_containers(x: Any) -> Any:
    """FX keeps an output's lists and dicts as immutable_list/immutable_dict; the unpack
    hook gets the plain containers eager's pack would have returned."""
    if type(x) in (immutable_list, list):
        return [_plain_containers(v) for v in x]
    if type(x) in (immutable_dict, dict):
        return {k: _plain_containers(v) for k, v in x.items()}
    if type(x) is tuple:
        return tuple(_plain_containers(v) for v in x)
    return x


def _trace_hook(
    hook: Callable[..., Any], arg: Any, decompositions: DecompositionTable
) -> torch.fx.GraphModule:
    """The functional ATen graph of ``hook(arg)``, one placeholder per leaf of ``arg``."""

    def functional_hook(value: Any) -> Any:
        with functionalized():
            f_value = pytree.tree_map(to_functional, value)
            out = hook(f_value)
            for leaf in pytree.tree_leaves(f_value):
                if isinstance(leaf, torch.Tensor) and has_data_mutation(leaf):
                    raise AssertionError(MUTATING_HOOK_ERROR)
            return pytree.tree_map(from_functional, out)

    with enable_python_dispatcher():
        return make_fx(
            functional_hook, decomposition_table=decompositions, record_module_stack=True
        )(arg)


def inline_after_partition(
    fw_module: torch.fx.GraphModule,
    bw_module: torch.fx.GraphModule,
    num_fwd_outputs: int,
    meta: ViewAndMutationMeta,
    decompositions: DecompositionTable,
) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule] | None:
    """Inline the hooks of ``compile_hooks()`` (the innermost default hooks when the
    compilation started, if GraphModules) into the partitioned graphs; the hooks (None:
    nothing done). See Note [Inlined saved-tensors hooks]."""
    hooks = compile_hooks()
    if hooks is not None:
        with torch.no_grad():
            inline_saved_tensors_hooks(
                fw_module, bw_module, num_fwd_outputs, meta, hooks, decompositions
            )
    return hooks


def with_hooks_runtime(
    call: Callable[[list[Any]], Sequence[Any]],
    hooks: tuple[torch.fx.GraphModule, torch.fx.GraphModule] | None,
) -> Callable[[list[Any]], Sequence[Any]]:
    """The runner of a training compilation made under ``hooks`` (unchanged for None):
    the whole call, epilogue included, runs with the hooks disabled, as torch's runtime
    wrapper. See Note [Inlined saved-tensors hooks at run time] in aotkit_runtime."""
    if hooks is None:
        return call
    return with_inlined_saved_tensors_hooks(call, *hooks)


def inline_saved_tensors_hooks(
    fw_module: torch.fx.GraphModule,
    bw_module: torch.fx.GraphModule,
    num_fwd_outputs: int,
    meta: ViewAndMutationMeta,
    hooks: tuple[torch.fx.GraphModule, torch.fx.GraphModule],
    decompositions: DecompositionTable,
) -> None:
    """Inline ``hooks`` into the partitioned graphs in place. See Note [Inlined
    saved-tensors hooks]."""
    _Inliner(fw_module, bw_module, num_fwd_outputs, hooks, decompositions).run(meta)


class _Inliner:
    def __init__(
        self,
        fw_module: torch.fx.GraphModule,
        bw_module: torch.fx.GraphModule,
        num_fwd_outputs: int,
        hooks: tuple[torch.fx.GraphModule, torch.fx.GraphModule],
        decompositions: DecompositionTable,
    ) -> None:
        self.fw_module, self.bw_module = fw_module, bw_module
        self.fw, self.bw = fw_module.graph, bw_module.graph
        self.pack, self.unpack = hooks
        self.decompositions = decompositions
        self.n_out = num_fwd_outputs
        self.names = {n.name for n in self.fw.nodes} | {n.name for n in self.bw.nodes}
        self.bw_inputs = list(self.bw.find_nodes(op="placeholder"))
        self.fw_output = self.fw.output_node()
        outs = list(self.fw_output.args[0])  # type: ignore[arg-type]
        self.user_outs = outs[:num_fwd_outputs]
        self.user_out_set = set(self.user_outs)
        self.saved: list[torch.fx.Node] = outs[num_fwd_outputs:]
        self.packed_tensors: list[torch.fx.Node] = []
        self.packed_syms: list[torch.fx.Node] = []
        self.sym_placeholders: set[torch.fx.Node] = set()

    def _selected(self, meta: ViewAndMutationMeta) -> Callable[[torch.fx.Node], bool] | None:
        mode = filtering_mode()
        if mode == "donated":
            n_syms = sum(1 for n in self.saved if is_sym_node(n))
            n_tensors = len(self.saved) - n_syms
            donated = bw_donated_idxs(self.fw_module, self.bw_module, self.n_out, n_tensors, n_syms)
            allowed = {self.saved[i - n_syms].name for i in donated}
            if not allowed:
                return None
            return lambda n: n.name in allowed
        if mode == "no_static":
            inputs = list(self.fw.find_nodes(op="placeholder"))
            static = {inputs[i].name for i in meta.static_input_indices if i < len(inputs)}
            return lambda n: n.name not in static
        return lambda n: True

    def run(self, meta: ViewAndMutationMeta) -> None:
        selected = self._selected(meta)
        if selected is None:  # "donated" with no donated buffer: nothing to inline
            return
        for saved in self.saved:
            val = saved.meta.get("val")
            if not selected(saved):
                if isinstance(val, torch.Tensor):
                    self.packed_tensors.append(saved)
                continue
            if not isinstance(val, torch.Tensor):
                continue  # saved SymInts keep their place at the end
            self._inline_one(saved, val)
        saved_syms = [n for n in self.saved if is_sym_node(n)]
        new_outs = [*self.user_outs, *self.packed_tensors, *self.packed_syms, *saved_syms]
        self.fw_output.args = (tuple(new_outs),)
        self._check_names(len(self.packed_tensors), len(self.packed_syms) + len(saved_syms))
        self.fw.lint()
        self.bw.lint()
        self.fw_module.recompile()
        self.bw_module.recompile()

    def _unused_name(self, candidate: str) -> str:
        name, i = candidate, 0
        while name in self.names:
            name, i = f"{candidate}_{i}", i + 1
        return name

    def _inline_one(self, saved: torch.fx.Node, val: torch.Tensor) -> None:
        context = SavedTensorHookContext(self.fw, self.bw, saved)
        with _hook_context(context):
            pack_g = _trace_hook(self.pack, val, self.decompositions).graph
            pack_out = _plain_containers(pack_g.output_node().args[0])
            packed_val = pytree.tree_map_only(torch.fx.Node, lambda n: n.meta["val"], pack_out)
        if any(is_traceable_wrapper_subclass(v) for v in pytree.tree_leaves(packed_val)):
            raise NotImplementedError(SUBCLASS_PACK_ERROR)
        leaves = pytree.tree_leaves(self._copy_pack(pack_g, saved))
        names = self._name_pack_outputs(saved, leaves)
        with _hook_context(context):
            unpack_g = _trace_hook(self.unpack, packed_val, self.decompositions).graph
        self._copy_unpack(unpack_g, saved, leaves, names, pytree.tree_leaves(packed_val))

    def _copy_pack(self, pack_g: torch.fx.Graph, saved: torch.fx.Node) -> Any:
        """Copy the pack graph before the forward's output; its (remapped) return value."""
        placeholders = list(pack_g.find_nodes(op="placeholder"))
        if len(placeholders) != 1:
            raise AssertionError(f"expected exactly 1 pack_g_input, got {len(placeholders)}")
        env: dict[torch.fx.Node, Any] = {placeholders[0]: saved}
        returned: Any = None
        with self.fw.inserting_before(self.fw_output):
            for node in pack_g.nodes:
                if node.op == "placeholder":
                    continue
                copied = self.fw.node_copy(node, lambda n: env[n])
                self.names.add(copied.name)
                env[node] = copied
                if node.op == "output":
                    returned = copied.args[0]
                    self.fw.erase_node(copied)
        if not returned:
            raise AssertionError("fw_pack_out_args must not be empty")
        return returned

    def _name_pack_outputs(self, saved: torch.fx.Node, leaves: list[Any]) -> list[str]:
        """Rename the pack's returned nodes ``{saved}_hook_{i}``; their names ("" for a
        constant)."""
        names: list[str] = []
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.fx.Node):
                names.append("")
                continue
            node = leaf
            if not (leaf.op == "placeholder" or leaf in self.user_out_set):
                name = self._unused_name(f"{saved.name}_hook_{i}")
                with self.fw.inserting_before(leaf):
                    node = self.fw.create_node(leaf.op, leaf.target, leaf.args, leaf.kwargs, name=name)
                if node.name != name:
                    raise AssertionError(f"expected n.name == {name}, got {node.name}")
                node.meta = copy.copy(leaf.meta)
                leaf.replace_all_uses_with(node)
                self.fw.erase_node(leaf)
            names.append(node.name)
            if isinstance(node.meta.get("val"), torch.Tensor):
                self.packed_tensors.append(node)
            elif is_sym_node(node):
                self.packed_syms.append(node)
        return names

    def _copy_unpack(
        self,
        unpack_g: torch.fx.Graph,
        saved: torch.fx.Node,
        fw_leaves: list[Any],
        names: list[str],
        values: list[Any],
    ) -> None:
        bw_saved = next((n for n in self.bw_inputs if n.name == saved.name), None)
        if bw_saved is None:
            raise AssertionError(f"could not find saved tensor {saved.name} in bw_g_inputs")
        users = list(bw_saved.users)
        used_directly = False
        env: dict[torch.fx.Node, Any] = {}
        placeholders = list(unpack_g.find_nodes(op="placeholder"))
        for i, (ph, fw_leaf, value) in enumerate(zip(placeholders, fw_leaves, values, strict=False)):
            is_sym = isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))
            if not (isinstance(value, torch.Tensor) or is_sym):
                env[ph] = value  # a constant: written into the graph
                continue
            if bw_saved.name == names[i]:
                env[ph] = bw_saved
                used_directly = True
                continue
            anchor = self._sym_anchor() if is_sym else bw_saved
            with self.bw.inserting_before(anchor):
                new = self.bw.placeholder(names[i])
            if new.name != names[i]:
                raise AssertionError(f"expected new_n.name == {names[i]}, got {new.name}")
            new.meta = copy.copy(fw_leaf.meta)
            if is_sym:
                self.sym_placeholders.add(new)
            env[ph] = new
        returned: torch.fx.Node | None = None
        with self.bw.inserting_before(self.bw_inputs[-1].next):
            for node in unpack_g.nodes:
                if node.op == "placeholder":
                    continue
                copied = self.bw.node_copy(node, lambda n: env[n])
                self.names.add(copied.name)
                env[node] = copied
                if node.op == "output":
                    returned = copied
        if returned is None:
            raise AssertionError("bw_unpack_out_n must not be None")
        result = pytree.tree_leaves(returned.args)
        if len(result) != 1:
            raise AssertionError(f"expected exactly 1 leaf, got {len(result)}")
        if used_directly:
            for user in users:
                user._replace_input_with(bw_saved, result[0])
        else:
            bw_saved.replace_all_uses_with(result[0])
            self.bw.erase_node(bw_saved)
        self.bw.erase_node(returned)

    def _sym_anchor(self) -> torch.fx.Node:
        """Where a packed SymInt's placeholder goes: before the first placeholder that is
        not one (the backward takes the saved SymInts first). torch inserts before the
        backward's original first placeholder, the same node while it exists; when that
        was a saved tensor already replaced (no saved SymInts), torch's order check fails,
        and this keeps the calling convention."""
        placeholders: list[torch.fx.Node] = list(self.bw.find_nodes(op="placeholder"))
        for node in placeholders:
            if node not in self.sym_placeholders:
                return node
        raise AssertionError("the backward graph has no placeholder left")

    def _check_names(self, n_tensors: int, n_syms: int) -> None:
        outs = list(self.fw_output.args[0])  # type: ignore[arg-type]
        fw_t = [n.name for n in outs[self.n_out : self.n_out + n_tensors]]
        fw_s = [n.name for n in outs[self.n_out + n_tensors :]]
        bw_in = list(self.bw.find_nodes(op="placeholder"))
        bw_s = [n.name for n in bw_in[:n_syms]]
        bw_t = [n.name for n in bw_in[n_syms : n_syms + n_tensors]]
        if fw_t != bw_t:
            raise AssertionError(f"expected fw_t_names == bw_t_names, got {fw_t} != {bw_t}")
        if fw_s != bw_s:
            raise AssertionError(f"expected fw_s_names == bw_s_names, got {fw_s} != {bw_s}")


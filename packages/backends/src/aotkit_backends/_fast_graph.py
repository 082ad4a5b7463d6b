"""Run an FX graph of ATen ops through the cheapest Python call per op.

# Note [Graph functions]
# A GraphModule's generated ``forward`` spells every op as ``torch.ops.aten.sin.default(x)``:
# four attribute lookups, the ``OpOverload.__call__`` frame, and then the generic
# schema-driven argument parsing of the operator handle. On small tensors that costs more than
# the kernels (``x.sin() + 1`` on 10 elements: 3.3 us eager, 4.8 us through the raw handles,
# about 6.5 us through ``gm.forward``). ``graph_function(gm)`` generates an equivalent Python
# function that runs the same ops, in the same order, with the same arguments:
#   * each ATen overload listed in ``_VARIABLE_FUNCTIONS``, ``_NN`` or ``_TENSOR_METHODS`` is called through torch's generated Python binding
#     for it (``torch.sin`` for ``aten.sin.default``), which parses arguments much faster.
#     An entry is listed only if the binding dispatches to exactly that overload; the test
#     ``test_graph_function`` checks every entry, and ``tests/test_graph_function_corpus.py``
#     checks on every graph of the corpus that the dispatched overloads are the same. A node
#     whose arguments could make the binding pick another overload (a Python number where
#     the schema has a Tensor, a ``self=`` keyword) uses the raw handle instead;
#   * every other ``OpOverload`` is called through its raw handle ``op._op``, which is what
#     ``OpOverload.__call__`` calls (ops with a Python dispatcher or TorchBind arguments keep
#     ``OpOverload.__call__``);
#   * anything else (``operator.getitem``, SymInt arithmetic, higher-order ops) is called as
#     the graph calls it;
#   * a value is dropped after its last use, as FX's code does, so memory is freed as early
#     (an input only with ``steal_args``: otherwise the caller's arguments hold every
#     input until the call returns, and dropping the local frees nothing). The op whose
#     call is that last use stores its result in the dying value's local (``_v3 =
#     f(_v3, _v5); _v5 = None``): the store drops the old value right after the call, as
#     ``= None`` would, with one statement less. ``compile()`` is most of the cost of
#     making a graph function, and it grows with the statements (a warm start from the
#     on-disk cache pays it on every graph);
#   * a list or tuple argument of constants (``[1, 1]``, ``[True, True, False]``) that an
#     ATen overload gets through its binding or raw handle is built once, when the
#     function is made, and passed on every call (as a global of the function): the
#     binding and the dispatcher read such an argument into their own array and never
#     keep or change the Python object, and the literal's tokens were a tenth of
#     ``compile()``'s work on a convolution's graphs. (A ``__torch_function__`` override
#     of an input's type is handed the shared object; one that changed an argument list in
#     place would change it for later calls. torch's own overrides never write to their
#     arguments; a ``__torch_dispatch__`` one gets a fresh list from the dispatcher.) Any
#     other callee (a Python kernel
#     behind ``OpOverload.__call__``, ``operator.getitem``, a higher-order op) gets a
#     fresh literal per call, as FX's code does;
#   * with grad mode off, an addition that may write into its first operand does (See
#     Note [In-place accumulation in graph functions]); that is the one change of op.
# Graphs with features the generator does not handle (``call_module``/``call_method`` nodes,
# pytree codegen, placeholder defaults) get ``None`` and the caller keeps ``gm.forward``.
"""

from __future__ import annotations

import itertools
import linecache
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch.fx.immutable_collections import immutable_dict, immutable_list

from ._buffer_reuse import _ADD_IN_PLACE, add_reusing, in_place_adds, sole_owner

# Overloads whose Python binding dispatches to exactly that overload
# (See Note [Graph functions]). Grouped by where the binding lives.
_VARIABLE_FUNCTIONS = """
    _log_softmax.default _log_softmax_backward_data.default _softmax.default
    _softmax_backward_data.default _native_batch_norm_legit_no_training.default
    _scaled_dot_product_flash_attention_for_cpu.default abs.default add.Tensor addmm.default
    amax.default as_strided.default atan2.default bitwise_and.Tensor bitwise_not.default
    bmm.default cat.default clamp.default clone.default convolution.default cos.default
    cumprod.default cumsum.default detach.default diagonal.default diagonal_scatter.default
    div.Tensor embedding.default eq.Scalar eq.Tensor exp.default flip.default gather.default
    gt.Scalar gt.Tensor hypot.default index_add.default index_select.default log1p.default
    logical_and.default logsumexp.default lt.Scalar lt.Tensor masked_fill.Scalar max.dim
    maximum.default mean.default mean.dim mm.default mul.Tensor native_group_norm.default
    native_layer_norm.default ne.Scalar neg.default permute.default pow.Tensor_Scalar
    prod.dim_int reciprocal.default relu.default select.int select_scatter.default
    sgn.default sigmoid.default sin.default slice_scatter.default split.Tensor sqrt.default
    squeeze.default squeeze.dim stack.default sub.Tensor sum.default sum.dim_IntList t.default
    tanh.default transpose.int tril.default unbind.int unsqueeze.default where.self
"""
_NN = "avg_pool2d.default elu.default gelu.default leaky_relu.default silu.default softplus.default"
_TENSOR_METHODS = "expand.default view.default view.dtype"

# Overloads whose binding turns a Python number in a Tensor position into the same wrapped
# number tensor the overload gets (``torch.add(x, 1)`` runs ``add.Tensor``).
_NUMBER_AS_TENSOR_OK = frozenset({"add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor"})

# "name.overload" (an aten overload's ``__name__``) -> the namespace holding its binding,
# looked up per overload at its first use: resolving every listed OpOverload up front cost
# each process (a warm start from the on-disk cache too) about 0.3 ms, more in a process
# that had not touched those operators yet
_BINDING_NAMESPACES: dict[str, Any] = {
    qualified: namespace
    for namespace, names in (
        (torch._C._VariableFunctions, _VARIABLE_FUNCTIONS),
        (torch._C._nn, _NN),
        (torch._C.TensorBase, _TENSOR_METHODS),
    )
    for qualified in names.split()
}
_bindings: dict[torch._ops.OpOverload, Callable[..., Any] | None] = {}


def binding_for(op: torch._ops.OpOverload) -> Callable[..., Any] | None:
    """The Python binding that dispatches to exactly ``op``, if aotkit knows one."""
    try:
        return _bindings[op]
    except KeyError:
        pass
    namespace = _BINDING_NAMESPACES.get(op.__name__) if op._name.startswith("aten::") else None
    binding = None if namespace is None else getattr(namespace, op.__name__.split(".")[0], None)
    _bindings[op] = binding
    return binding


def _is_tensor_type(t: Any) -> bool:
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    return isinstance(t, torch.TensorType)


# per overload: (position, name) of its Tensor arguments, or None when numbers are fine there
_tensor_args: dict[torch._ops.OpOverload, tuple[tuple[int, str], ...] | None] = {}


def _binding_fits(op: torch._ops.OpOverload, node: torch.fx.Node) -> bool:
    """Whether the binding is sure to pick ``op`` for ``node``'s arguments."""
    kwargs = node.kwargs
    if "self" in kwargs:
        return False
    # only a value other than a graph value or None can make the binding pick another
    # overload: without one, the schema is not read (costly the first time per process)
    if all(a is None or isinstance(a, torch.fx.Node) for a in (*node.args, *kwargs.values())):
        return True
    try:
        tensor_args = _tensor_args[op]
    except KeyError:
        tensor_args = _tensor_args[op] = (
            None
            if f"{op._opname}.{op._overloadname}" in _NUMBER_AS_TENSOR_OK
            else tuple(
                (i, a.name) for i, a in enumerate(op._schema.arguments) if _is_tensor_type(a.type)
            )
        )
    if tensor_args is None:
        return True
    args = node.args
    for i, name in tensor_args:
        value = args[i] if i < len(args) else kwargs.get(name)
        if not (value is None or isinstance(value, torch.fx.Node)):
            return False
    return True


def _callee(node: torch.fx.Node) -> Any:
    target = node.target
    if type(target) is not torch._ops.OpOverload or target._pyobj_dispatcher is not None:
        return target
    binding = binding_for(target)
    if binding is not None and _binding_fits(target, node):
        return binding
    return target._op


_CONSTANT_ITEMS = frozenset({bool, int, float})


class _Unsupported(Exception):
    pass


class _Emitter:
    """Python source for one graph, with the objects it refers to bound as globals."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.globals: dict[str, Any] = {"_gm": gm}
        self.names: dict[torch.fx.Node, str] = {}
        self._callees: dict[int, str] = {}
        self._constants: dict[tuple[Any, ...], str] = {}

    def bind(self, value: Any, prefix: str = "_c") -> str:
        name = f"{prefix}{len(self.globals)}"
        self.globals[name] = value
        return name

    def callee(self, fn: Any) -> str:
        name = self._callees.get(id(fn))
        if name is None:
            name = self._callees[id(fn)] = self.bind(fn, "_f")
        return name

    def constant(self, kind: type, items: Any) -> str | None:
        """A global holding ``kind(items)`` when every item is a bool, int or finite
        float, else None; one per distinct value (types included: ``[1]`` is not
        ``[True]``). See Note [Graph functions]."""
        typed = [(type(x), x) for x in items]
        if not all(t in _CONSTANT_ITEMS and (t is not float or math.isfinite(x)) for t, x in typed):
            return None
        key = (kind, *typed)
        name = self._constants.get(key)
        if name is None:
            name = self._constants[key] = self.bind(kind(items), "_k")
        return name

    def arg(self, a: Any, shared: bool = False) -> str:
        if isinstance(a, torch.fx.Node):
            return self.names[a]
        kind = type(a)
        if kind is tuple:
            return (shared and self.constant(tuple, a)) or (
                "(" + "".join(self.arg(x) + ", " for x in a) + ")"
            )
        if kind is list or kind is immutable_list:
            return (shared and self.constant(list, a)) or (
                "[" + ", ".join(self.arg(x) for x in a) + "]"
            )
        if kind is dict or kind is immutable_dict:
            return "{" + ", ".join(f"{k!r}: {self.arg(v)}" for k, v in a.items()) + "}"
        if kind is slice:
            return f"slice({self.arg(a.start)}, {self.arg(a.stop)}, {self.arg(a.step)})"
        if a is None or kind in (bool, int, str) or (kind is float and math.isfinite(a)):
            return repr(a)
        inside: list[torch.fx.Node] = []
        torch.fx.node.map_arg(a, inside.append)
        if inside:
            raise _Unsupported(f"graph values inside a {kind.__name__}")
        return self.bind(a)

    def call(self, node: torch.fx.Node, callee: Any = None) -> str:
        fn = callee or _callee(node)
        # an ATen binding or raw handle: constant lists are shared (See Note [Graph functions])
        shared = fn is not node.target
        args = [self.arg(a, shared) for a in node.args]
        args += [f"{k}={self.arg(v, shared)}" for k, v in node.kwargs.items()]
        return f"{self.callee(fn)}({', '.join(args)})"


_counter = itertools.count()


def graph_function(
    gm: torch.fx.GraphModule, *, steal_args: bool = False
) -> Callable[..., Any] | None:
    """``f(*args) == gm.forward(*args)``, running each op through its cheapest Python call.

    With ``steal_args``, ``f(args)`` takes the inputs as one list and clears it once it has
    read them, so that each input is dropped at its last use (See Note [Boxed calling
    convention] in aotkit_schemas). See Note [Graph functions]. Returns None for graphs
    it does not handle.
    """
    graph = gm.graph
    if type(graph._codegen) is not torch.fx.graph.CodeGen:
        return None
    nodes = list(graph.nodes)
    last_use: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in reversed(nodes):
        for inp in node.all_input_nodes:
            last_use.setdefault(inp, node)
    freed_after: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for value, user in last_use.items():
        freed_after.setdefault(user, []).append(value)

    emit = _Emitter(gm)
    params: list[str] = []
    body: list[str] = []
    # See Note [In-place accumulation in graph functions]: line -> its grad-free variant
    in_place = in_place_adds(nodes)
    reuses = False
    try:
        for i, node in enumerate(nodes):
            dead = [
                emit.names[v] for v in freed_after.get(node, ())
                if steal_args or v.op != "placeholder"
            ]
            # See Note [Graph functions]: a value made where another dies takes its local
            name = dead.pop(0) if dead and node.op == "call_function" else f"_v{i}"
            if node.op == "placeholder":
                if node.args or str(node.target).startswith("*"):
                    return None
                params.append(name)
            elif node.op == "get_attr":
                if not all(part.isidentifier() for part in str(node.target).split(".")):
                    return None
                body.append(f"{name} = _gm.{node.target}")
            elif node.op == "call_function":
                body.append(f"{name} = {emit.call(node)}")
                if node in in_place:
                    # See Note [In-place accumulation in graph functions]
                    if len(node.args) == 2 and not node.kwargs:
                        args = ", ".join(emit.arg(a) for a in node.args)
                        plain = emit.callee(_callee(node))
                        body[-1] = f"{name} = _add_reusing({plain}, {args}, _no_grad)"
                    else:
                        body[-1] = (
                            f"{name} = {emit.call(node, _ADD_IN_PLACE)} if _no_grad and "
                            f"_sole_owner({emit.arg(node.args[0])}) else {emit.call(node)}"
                        )
                    reuses = True
            elif node.op == "output":
                body.append(f"return {emit.arg(node.args[0])}")
                break
            else:
                return None
            emit.names[node] = name  # after its own line: its arguments keep their names
            if dead:
                body[-1] += "; " + " = ".join(dead) + " = None"
    except _Unsupported:
        return None
    filename = f"<aotkit graph function {next(_counter)}>"
    if reuses:
        emit.globals["_grad_enabled"] = torch.is_grad_enabled
        emit.globals["_sole_owner"] = sole_owner
        emit.globals["_add_reusing"] = add_reusing
        body.insert(0, "_no_grad = not _grad_enabled()")
    if steal_args:
        unpack = f"{', '.join(params)}, = args; " if params else ""
        body.insert(0, unpack + "args.clear()")
        params = ["args"]
    source = f"def forward({', '.join(params)}):\n" + "".join(f"    {line}\n" for line in body)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), emit.globals)
    fn: Callable[..., Any] = emit.globals["forward"]
    fn.__qualname__ = fn.__name__ = "aotkit_graph_function"
    fn._aotkit_source = source  # type: ignore[attr-defined]
    return fn

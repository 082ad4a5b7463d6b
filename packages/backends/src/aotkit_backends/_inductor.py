"""Compile graphs with TorchInductor (C++ on CPU, Triton on GPU) through ``compile_fx_inner``.

TorchInductor's ``compile_fx_inner`` is the compiler torch's own ``torch.compile`` hands
the forward and backward graphs to, after AOTAutograd traced them with Inductor's
decomposition table. A graph that reaches ``inductor_compiler`` may come from anywhere, so
it is first re-traced with that table (see Note [Why inductor_compiler re-traces]).

# Note [Why inductor_compiler re-traces]
# Inductor lowers a fixed set of ATen ops and expects every op in its decomposition table
# to be decomposed already: given ``aten.t`` it fails with "both a fallback and a decomp for
# same op". It also only accepts graphs that return a flat tuple or list. So
# ``inductor_compiler`` re-traces the graph with ``make_fx`` and Inductor's table, on fake
# copies of the example inputs, into a graph that returns the flattened outputs; the
# compiled callable rebuilds the original output structure. The caller's GraphModule is
# left untouched. Re-tracing a graph that was already decomposed with the same table gives
# the same graph back. Whether a graph was decomposed with the table cannot be read off it
# cheaply (the table holds ops such as ``aten.mm`` whose decomposition declines most
# inputs), so a caller that traced it so says ``retrace=False`` (aotkit_inductor: its
# traces use Inductor's table); such a graph, when its outputs are a flat list or tuple and
# its nodes ATen ops, getitem or higher-order ops with ``val`` metadata, is copied instead
# of re-traced (the re-trace cost a fifth of Inductor's compile time on real models). If
# Inductor still refuses the copy, the graph is re-traced after all.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from aotkit_schemas import get_logger, mark_cache_key, mark_uses_donated_inputs
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode, is_fake
from torch.fx.experimental.proxy_tensor import make_fx

from aotkit_backends import _inductor_cache

from ._boxing import BoxedCallable
from ._inductor_donation import Donation, inductor_donation
from ._inductor_passes import (
    USER_VISIBLE_OUTPUTS_KEY,
    GraphRole,
    compile_kwargs_for_role,
    joint_graph_passes,
    role_kwargs,
)
from ._inductor_settings import inductor_settings_key
from ._tokens import unlift_tokens

_log = get_logger("compile")


class InductorUnavailableError(RuntimeError):
    """TorchInductor cannot compile here (it does not import, or no C++ compiler is found)."""


@functools.cache
def _inductor_import_problem() -> str | None:
    try:
        import torch._inductor.compile_fx  # noqa: F401
        import torch._inductor.decomposition  # noqa: F401
    except Exception as e:  # any failure to import means "unavailable", whatever its type
        return f"torch._inductor cannot be imported: {type(e).__name__}: {e}"
    return None


@functools.cache
def _cpu_toolchain_problem() -> str | None:
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as e:
        return f"Inductor's CPU backend needs a C++ compiler and found none: {e}"
    return None


def inductor_unavailable_reason(device: str = "cpu") -> str | None:
    """Why ``inductor_compiler`` cannot compile graphs for ``device`` here, or None if it can.

    Importing TorchInductor takes a few seconds the first time; the answer is cached.
    """
    problem = _inductor_import_problem()
    if problem is None and torch.device(device).type == "cpu":
        problem = _cpu_toolchain_problem()
    return problem


def inductor_available(device: str = "cpu") -> bool:
    """Whether ``inductor_compiler`` can compile graphs for ``device`` here."""
    return inductor_unavailable_reason(device) is None


def inductor_compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> BoxedCallable:
    """Compile ``gm`` with TorchInductor; return a boxed callable.

    ``example_inputs`` may be real or fake tensors (and SymInts); only their metadata is
    used. The result follows Note [Boxed calling convention] and, like Inductor's own
    compiled graphs, clears the argument list it is given. It returns outputs in the same
    structure as ``gm`` (a list for AOTAutograd-style graphs).

    Raises InductorUnavailableError when TorchInductor cannot compile for the inputs'
    devices here.
    """
    return _compile(gm, example_inputs, retrace=True)


# Inductor compiles the graph again on an on-disk cache hit, and its own FX graph cache
# (keyed on the graph, the inputs and Inductor's config) serves the compiled artifact, so
# the key names the recipe only. See Note [Compiler cache keys] in aotkit_schemas.
# Its inference graphs get Inductor's joint-graph passes (in place, before aotkit stores
# them): See Note [Inductor settings in the on-disk cache key].
mark_cache_key(inductor_compiler, "aotkit.inductor/1", settings=inductor_settings_key)


def make_inductor_compiler(
    *, retrace: bool = True, role: GraphRole | None = None
) -> Callable[..., BoxedCallable]:
    """``inductor_compiler``, or with ``retrace=False`` its twin for graphs traced with
    Inductor's decomposition table, which are not re-traced (See Note [Why
    inductor_compiler re-traces]).

    ``role`` (``"forward"``, ``"backward"`` or ``"inference"``) compiles every graph as
    torch's ``inductor`` backend compiles a graph of that role: an inference graph gets
    Inductor's joint-graph passes first, and Inductor is told the role, the backward's
    static inputs and the outputs whose strides are observed (See Note [Inductor's graph
    roles]).
    """
    if retrace and role is None:
        return inductor_compiler

    def inductor_compiler_for_role(
        gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
    ) -> BoxedCallable:
        return _compile(gm, example_inputs, retrace=retrace, role=role)

    # See Note [Compiler cache keys] in aotkit_schemas
    key = "aotkit.inductor" + ("" if retrace else ".decomposed") + (f".{role}" if role else "")
    inductor_compiler_for_role.__name__ = (
        "inductor_compiler" if retrace else "inductor_compiler_for_decomposed_graphs"
    ) + (f"_{role}" if role else "")
    mark_cache_key(inductor_compiler_for_role, key + "/1", settings=inductor_settings_key)
    return inductor_compiler_for_role


def _compile(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    retrace: bool,
    role: GraphRole | None = None,
) -> BoxedCallable:
    devices = {x.device.type for x in example_inputs if isinstance(x, torch.Tensor)} or {"cpu"}
    for device in sorted(devices):
        problem = inductor_unavailable_reason(device)
        if problem is not None:
            raise InductorUnavailableError(problem)

    # See Note [Unlifted tokens for Inductor]
    unlifted = unlift_tokens(gm)
    if unlifted is not None:
        inner = _compile(
            unlifted.gm, unlifted.example_inputs(example_inputs), retrace=retrace, role=role
        )
        return unlifted.lifted_call(inner)  # type: ignore[return-value]
    with inductor_donation(gm) as donation:
        compiled = _compile_flat(gm, example_inputs, retrace, role, donation)
    if donation.used:
        mark_uses_donated_inputs(compiled)
    return compiled


def inductor_decompositions() -> dict[Any, Callable[..., Any]]:
    """Inductor's decomposition table (``select_decomp_table()``), for tracing graphs that
    Inductor compiles. Imports ``torch._inductor.lowering`` first: some of Inductor's
    decompositions (``max_pool2d_with_indices``) read it as an attribute, which Inductor's
    own path has imported by then; a fresh process tracing for aotkit_inductor first had
    not ("module 'torch._inductor' has no attribute 'lowering'"). Imported when called:
    importing Inductor takes seconds."""
    import torch._inductor.lowering  # noqa: F401
    from torch._inductor.decomposition import select_decomp_table

    table: dict[Any, Callable[..., Any]] = select_decomp_table()
    return table


def _compile_flat(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    retrace: bool,
    role: GraphRole | None,
    donation: Donation,
) -> BoxedCallable:
    # Imported here, not at the top: importing Inductor costs seconds, and a missing or
    # broken Inductor must not break ``import aotkit_backends`` (checked in ``_compile``).
    from torch._inductor.compile_fx import compile_fx_inner

    fake_mode, fake_inputs = _fakify(example_inputs)
    with _allow_non_fake_inputs(fake_mode):
        spec = None if retrace else _flat_spec(gm)
        if spec is not None and not donation.withheld:
            # See Note [Inductor artifact keys]: a graph restored from aotkit's disk cache
            # may carry the key of Inductor's artifact
            loaded = _inductor_cache.load(gm, fake_inputs, compile_kwargs_for_role(gm, role))
            if loaded is not None:
                return _boxed_with_structure(loaded, spec)
        copied = None if spec is None else (_copy_flat(gm), spec)
        if copied is not None:
            try:
                kwargs = _prepare(copied[0], gm, fake_inputs, fake_mode, role)
                compiled = compile_fx_inner(copied[0], fake_inputs, **kwargs)
                if not donation.withheld:  # its key can't say it reuses no donated buffer
                    _inductor_cache.remember(gm, compiled, fake_inputs, kwargs)
                return _boxed_with_structure(compiled, copied[1])
            except Exception as e:  # re-traced below, where a real error raises again
                _log.debug("Inductor refused the graph as traced (%s); re-tracing it", e)
        flat_gm, out_spec = _retrace_flat(gm, fake_inputs, inductor_decompositions())
        kwargs = _prepare(flat_gm, gm, fake_inputs, fake_mode, role)
        compiled = compile_fx_inner(flat_gm, fake_inputs, **kwargs)
    return _boxed_with_structure(compiled, out_spec)


def _prepare(
    flat_gm: torch.fx.GraphModule,
    gm: torch.fx.GraphModule,
    fake_inputs: list[Any],
    fake_mode: FakeTensorMode,
    role: GraphRole | None,
) -> dict[str, Any]:
    """Ready ``flat_gm`` (Inductor's flat copy of ``gm``) for ``compile_fx_inner`` as a graph
    of ``role``; return the call's keyword arguments. See Note [Inductor's graph roles]."""
    if role == "inference":
        joint_graph_passes(flat_gm, fake_inputs)  # also rewrites random ops
    else:
        _inductor_random(flat_gm, fake_mode)
    output = gm.graph.find_nodes(op="output")[0]
    marked = output.meta.get(USER_VISIBLE_OUTPUTS_KEY)
    flat_output = flat_gm.graph.find_nodes(op="output")[0]
    outs, flat_outs = output.args[0], flat_output.args[0]
    if (
        role == "forward"
        and marked is not None
        and isinstance(outs, list | tuple)
        and isinstance(flat_outs, list | tuple)
        and len(outs) == len(flat_outs)  # the same positions (no None flattened away)
    ):
        flat_output.meta[USER_VISIBLE_OUTPUTS_KEY] = list(marked)
    return role_kwargs(flat_gm, fake_inputs, role)


def _inductor_random(gm: torch.fx.GraphModule, fake_mode: FakeTensorMode) -> None:
    """Rewrite ``aten.rand``-family nodes into Inductor's seeded random ops, the pass
    torch's own Inductor flow runs on the joint graph before partitioning (Inductor cannot
    lower the ATen ops themselves unless ``fallback_random`` is set; then nothing changes).
    Without it a graph with ``rrelu`` or ``dropout`` fails to compile."""
    from torch._inductor.fx_passes.replace_random import replace_random_passes
    from torch._inductor.virtualized import V

    with V.set_fake_mode(fake_mode):
        if replace_random_passes(gm):
            gm.recompile()


def _fakify(example_inputs: Sequence[Any]) -> tuple[FakeTensorMode, list[Any]]:
    """Fake copies of the inputs, in the fake mode they already use if they are fake."""
    fake_mode = detect_fake_mode(example_inputs)
    if fake_mode is None:
        fake_mode = FakeTensorMode()
    fakes = [
        fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) and not is_fake(x) else x
        for x in example_inputs
    ]
    return fake_mode, fakes


@contextlib.contextmanager
def _allow_non_fake_inputs(fake_mode: FakeTensorMode) -> Iterator[None]:
    # Constants stored on the graph (get_attr) are real tensors; Inductor's compile_fx
    # lets them meet fake inputs the same way.
    saved = fake_mode.allow_non_fake_inputs
    fake_mode.allow_non_fake_inputs = True
    try:
        yield
    finally:
        fake_mode.allow_non_fake_inputs = saved


def _retrace_flat(
    gm: torch.fx.GraphModule, fake_inputs: list[Any], decompositions: dict[Any, Any]
) -> tuple[torch.fx.GraphModule, pytree.TreeSpec]:
    """See Note [Why inductor_compiler re-traces]."""
    specs: list[pytree.TreeSpec] = []

    def flat_forward(*args: Any) -> list[Any]:
        flat, spec = pytree.tree_flatten(gm(*args))
        specs.append(spec)
        return flat

    fake_mode = detect_fake_mode(fake_inputs)
    with fake_mode if fake_mode is not None else contextlib.nullcontext(), torch.no_grad():
        flat_gm = make_fx(flat_forward, decomposition_table=decompositions)(*fake_inputs)
    return flat_gm, specs[-1]


def _flat_spec(gm: torch.fx.GraphModule) -> pytree.TreeSpec | None:
    """The output structure of ``gm`` when Inductor takes the graph as it is (its copy);
    else None. See Note [Why inductor_compiler re-traces]."""
    output = None
    for node in gm.graph.nodes:
        if node.op == "output":
            output = node
        elif node.op == "call_function":
            target = node.target
            if target is operator.getitem:
                continue
            if not isinstance(target, torch._ops.OpOverload | torch._ops.HigherOrderOperator):
                return None
        elif node.op == "get_attr" and isinstance(
            getattr(gm, str(node.target), None), torch.fx.GraphModule
        ):
            continue  # a higher-order operator's subgraph (See Note [Higher-order operators])
        elif node.op != "placeholder":  # get_attr constants, call_module: re-trace
            return None
        if node.op != "output" and "val" not in node.meta:
            return None
    if output is None:
        return None
    outs = output.args[0]
    if not isinstance(outs, list | tuple) or not all(
        o is None or isinstance(o, torch.fx.Node) for o in outs
    ):
        return None
    leaves = [o is not None for o in outs]  # Nones stay graph outputs; See _boxed_with_structure
    return pytree.tree_structure(leaves if isinstance(outs, list) else tuple(leaves))


def _copy_flat(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` (Inductor's passes rewrite the graph they get) that returns a list,
    for a graph ``_flat_spec`` accepts."""
    graph = torch.fx.Graph()
    copied_outs = graph.graph_copy(gm.graph, {})
    graph.output(list(copied_outs) if isinstance(copied_outs, list | tuple) else copied_outs)
    _drop_detaches(graph)
    flat_gm = torch.fx.GraphModule(gm, graph)
    if any(n.op == "get_attr" for n in graph.nodes):
        # Inductor's post-grad passes rewrite a HOP's subgraphs in place too (an addmm
        # fused into a region's backward): it gets copies, the caller keeps its graphs
        _copy_subgraphs(flat_gm)
        # Inductor lowers a HOP to fewer outputs than its fake kernel returns (flex_attention
        # on CPU): unused getitems of it must not reach the lowering.
        flat_gm.graph.eliminate_dead_code()
        flat_gm.recompile()
    return flat_gm


def _copy_subgraphs(gm: torch.fx.GraphModule) -> None:
    """Replace every GraphModule child of ``gm`` (HOP subgraphs, nested ones too) by a
    copy, one per child, so that passes on ``gm`` leave the original subgraphs alone."""
    for name, child in list(gm.named_children()):
        if isinstance(child, torch.fx.GraphModule):
            graph = torch.fx.Graph()
            graph.output(graph.graph_copy(child.graph, {}))
            copied = torch.fx.GraphModule(child, graph)
            copied.meta = dict(child.meta)
            _copy_subgraphs(copied)
            setattr(gm, name, copied)


# Note [Inductor's copy has no detach nodes]
# aotkit's joint traces carry autograd's ``aten.detach`` nodes for saved outputs (See Note
# [Detach nodes of saved outputs] in aotkit_capture), so its backward graphs
# hold one or two per saved activation (36 of resnet18's 903 backward nodes) where the
# graphs torch's ``inductor`` backend compiles have none. Inductor lowers ``aten.detach``
# to its input unchanged (a no-op lowering: the same buffer, no copy), so the copy Inductor
# compiles reads each detach's input directly: the compiled code is the same, and
# Inductor's graph passes (pattern matching, fake propagation, re-inplacing) walk fewer
# nodes. Only the copy changes; the caller's graph keeps its nodes and names.
_DETACH = torch.ops.aten.detach.default


def _drop_detaches(graph: torch.fx.Graph) -> None:
    """See Note [Inductor's copy has no detach nodes]."""
    for node in graph.find_nodes(op="call_function", target=_DETACH):
        source = node.args[0] if len(node.args) == 1 and not node.kwargs else None
        if isinstance(source, torch.fx.Node):
            node.replace_all_uses_with(source)
            graph.erase_node(node)


def _boxed_with_structure(
    compiled: Callable[[list[Any]], Any], out_spec: pytree.TreeSpec
) -> BoxedCallable:
    """Box ``compiled`` (itself boxed and flat-output) so it returns ``out_spec``'s structure."""
    if out_spec.type is list and all(child.is_leaf() for child in out_spec.children()):

        def run(args: list[Any]) -> Any:
            return list(compiled(args))

    else:

        def run(args: list[Any]) -> Any:
            return pytree.tree_unflatten(list(compiled(args)), out_spec)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run

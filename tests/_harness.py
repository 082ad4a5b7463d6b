"""Run a program eagerly, through aotkit and through torch's AOTAutograd; compare everything.

# Note [What the differential harness compares]
# Every run calls the program ``case.calls`` times on fresh inputs from the seeded factory
# and records, per call, an ``Observation``:
#   * whether the call raised, and the grad mode right after it;
#   * the output pytree: its structure (a tuple stays a tuple, namedtuples keep their type),
#     the non-tensor leaves, and per tensor leaf its values, shape, stride, storage offset,
#     dtype, requires_grad, is_leaf and ``_is_view()`` (See Note [unsafe_view_alias
#     outputs are plain tensors] for when ``_is_view()`` is not observable);
#   * aliasing: for every tensor output, which inputs and earlier outputs it *is* and which
#     it shares an untyped storage with;
#   * every tensor input after the call (and after the case's ``after`` hook): values,
#     shape, stride, storage offset, requires_grad, is_leaf, whether it still uses the
#     storage it came with, and which other inputs share its storage;
#   * the ``.grad`` of every autograd leaf reachable from the inputs (and module
#     parameters) after backward with a fixed random cotangent for each output that
#     requires grad (or the error backward raised; See Note [Gradients left by a backward
#     that raised]).
# Compiled runs also record which graphs their compilers received (training: one forward
# and at most one backward, compiled at the first backward through the compiled node;
# inference: one graph; later calls with the same shapes: nothing new) and check that
# none of them holds a mutable op, except ``copy_`` into an input when
# ``keep_inference_input_mutations`` asked for it.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aotkit_frontends
import torch
import torch.fx
import torch.utils._pytree as pytree
from _graph_function_check import checking_compiler
from aotkit_functional import mutable_ops_in_graph
from corpus import Call, Case
from torch._functorch import aot_autograd as torch_aot

OBSERVE_SEED = 1234
COTANGENT_SEED = 4321
MODEL_SEED = 99

# ---- compilers -------------------------------------------------------------------------


@dataclass
class CompileLog:
    """Which graphs a run's compilers received, in order."""

    keep_input_mutations: bool
    graphs: list[tuple[str, torch.fx.GraphModule]] = field(default_factory=list)
    impure: list[str] = field(default_factory=list)
    # "aotkit_graph_function" runs: how the graph function differed from the graph
    graph_function_problems: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out = {"fw": 0, "bw": 0, "inference": 0}
        for kind, _ in self.graphs:
            out[kind] += 1
        return out

    def compiler(self, kind: str, *, boxed: bool, checked: bool = False) -> Callable[..., Any]:
        def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
            self.graphs.append((kind, gm))
            bad = mutable_ops_in_graph(gm.graph, allow_input_copies=self.keep_input_mutations)
            self.impure.extend(f"{kind}: {b}" for b in bad)
            if checked:
                return checking_compiler(gm, self.graph_function_problems, kind)
            if not boxed:
                return gm  # the nop compiler

            def run_boxed(args: list[Any]) -> Any:
                own = list(args)
                args.clear()  # a boxed callee may free its inputs early
                return gm(*own)

            run_boxed._boxed_call = True  # type: ignore[attr-defined]
            return run_boxed

        return compile_graph


# ---- observations --------------------------------------------------------------------


@dataclass
class TensorState:
    values: torch.Tensor
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    dtype: torch.dtype
    requires_grad: bool
    is_view: bool
    is_leaf: bool | str


@dataclass
class Observation:
    """One call's observable behaviour. See Note [What the differential harness compares]."""

    raised: str | None = None
    # torch.is_grad_enabled() right after the call (a function may leave it changed)
    grad_mode_after: bool | None = None
    out_spec: Any = None
    out_leaf_types: list[type] = field(default_factory=list)
    out_constants: dict[int, Any] = field(default_factory=dict)
    outputs: list[TensorState] = field(default_factory=list)
    # per tensor output: (kind, index) relations, kind in is_input/shares_input/is_output/...
    out_aliasing: list[frozenset[tuple[str, int]]] = field(default_factory=list)
    inputs: list[TensorState] = field(default_factory=list)
    input_storage_kept: list[bool] = field(default_factory=list)
    input_aliasing: list[frozenset[int]] = field(default_factory=list)
    backward_raised: str | None = None
    grads: list[torch.Tensor | None] = field(default_factory=list)


def _state(t: torch.Tensor) -> TensorState:
    return TensorState(
        values=t.detach().clone(),
        shape=tuple(t.shape),
        stride=tuple(t.stride()),
        storage_offset=t.storage_offset(),
        dtype=t.dtype,
        requires_grad=t.requires_grad,
        is_view=t._is_view(),
        is_leaf=_is_leaf(t),
    )


def _is_leaf(t: torch.Tensor) -> bool | str:
    """``t.is_leaf``, or the error reading it raised: a view made under no_grad whose base
    was then modified in place with grad on raises on any grad_fn access, in eager too."""
    try:
        return t.is_leaf
    except RuntimeError as e:
        return f"raises: {str(e).splitlines()[0][:120]}"


def _storage(t: torch.Tensor) -> int | None:
    st = t.untyped_storage()
    return st.data_ptr() if st.nbytes() > 0 else None


def _grad_leaves(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Autograd leaves that receive gradients from ``tensors``, in a deterministic order."""
    leaves: list[torch.Tensor] = []
    seen_leaves: set[int] = set()
    seen_nodes: set[Any] = set()

    def add(t: torch.Tensor) -> None:
        if id(t) not in seen_leaves:
            seen_leaves.add(id(t))
            leaves.append(t)

    def walk(node: Any) -> None:
        stack = [node]
        while stack:
            n = stack.pop()
            if n is None or n in seen_nodes:
                continue
            seen_nodes.add(n)
            var = getattr(n, "variable", None)
            if isinstance(var, torch.Tensor):
                add(var)
            stack.extend(reversed([nxt for nxt, _ in n.next_functions]))

    for t in tensors:
        if t.requires_grad and t.is_leaf:
            add(t)
        elif t.grad_fn is not None:
            walk(t.grad_fn)
    return leaves


def _flat_inputs(call: Call, module: torch.nn.Module | None) -> list[torch.Tensor]:
    flat = [a for a in pytree.tree_leaves((call.args, call.kwargs)) if isinstance(a, torch.Tensor)]
    if module is not None:
        flat = [*module.parameters(), *module.buffers(), *flat]
    return flat


def _cotangents(outs: list[torch.Tensor]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(COTANGENT_SEED)
    return [
        torch.randn(o.shape, generator=g, dtype=o.dtype)
        if o.is_floating_point() or o.is_complex()
        else torch.zeros_like(o)
        for o in outs
    ]


def observe_call(
    fn: Callable[..., Any],
    call: Call,
    *,
    module: torch.nn.Module | None,
    grad_enabled: bool,
    after: Callable[[Any, tuple[Any, ...]], None] | None,
) -> Observation:
    inputs = _flat_inputs(call, module)
    storages_before = [_storage(t) for t in inputs]
    leaves = _grad_leaves(inputs)
    obs = Observation()
    try:
        with torch.set_grad_enabled(grad_enabled):
            out = fn(*call.args, **call.kwargs)
            obs.grad_mode_after = torch.is_grad_enabled()
            if after is not None:
                after(out, call.args)
    except Exception as e:  # noqa: BLE001 - any failure is an observation
        obs.raised = f"{type(e).__name__}: {e}"
        return obs

    leaves_out, obs.out_spec = pytree.tree_flatten(out)
    obs.out_leaf_types = [type(leaf) for leaf in leaves_out]
    tensors_out = [leaf for leaf in leaves_out if isinstance(leaf, torch.Tensor)]
    obs.out_constants = {
        i: leaf for i, leaf in enumerate(leaves_out) if not isinstance(leaf, torch.Tensor)
    }
    obs.outputs = [_state(t) for t in tensors_out]
    for j, o in enumerate(tensors_out):
        rel: set[tuple[str, int]] = set()
        st = _storage(o)
        for i, inp in enumerate(inputs):
            if o is inp:
                rel.add(("is_input", i))
            if st is not None and st == _storage(inp):
                rel.add(("shares_input", i))
        for k, other in enumerate(tensors_out[:j]):
            if o is other:
                rel.add(("is_output", k))
            if st is not None and st == _storage(other):
                rel.add(("shares_output", k))
        obs.out_aliasing.append(frozenset(rel))
    obs.inputs = [_state(t) for t in inputs]
    obs.input_storage_kept = [
        _storage(t) == before for t, before in zip(inputs, storages_before, strict=True)
    ]
    for i, t in enumerate(inputs):
        st = _storage(t)
        obs.input_aliasing.append(
            frozenset(k for k, u in enumerate(inputs) if k != i and st is not None and _storage(u) == st)
        )

    diff = [o for o in tensors_out if o.requires_grad]
    if diff:
        cots = _cotangents(tensors_out)
        pairs = [(o, c) for o, c in zip(tensors_out, cots, strict=True) if o.requires_grad]
        try:
            torch.autograd.backward([o for o, _ in pairs], [c for _, c in pairs])
        except Exception as e:  # noqa: BLE001
            obs.backward_raised = f"{type(e).__name__}: {e}"
    obs.grads = [None if t.grad is None else t.grad.detach().clone() for t in leaves]
    return obs


# ---- running a case ------------------------------------------------------------------


@dataclass
class Run:
    variant: str
    observations: list[Observation]
    log: CompileLog | None = None
    # compiler counts after each call
    counts: list[dict[str, int]] = field(default_factory=list)
    compiled: Any = None


def make_call(case: Case, k: int) -> Call:
    """The inputs of call ``k`` of a case: fresh tensors from its seeded factory."""
    torch.manual_seed(OBSERVE_SEED + k)
    made = case.inputs()
    return made if isinstance(made, Call) else Call(tuple(made))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def run_case(case: Case, variant: str) -> Run:
    """``variant`` is ``eager``, ``aotkit``, ``aotkit_boxed``, ``aotkit_graph_function``
    (nop's calling convention, each graph checked against aotkit's graph function, see
    ``_graph_function_check``) or ``torch``."""
    torch.manual_seed(MODEL_SEED)
    module: torch.nn.Module | None = case.program() if case.module else None
    program: Callable[..., Any] = module if module is not None else case.program
    log: CompileLog | None = None
    if variant == "eager":
        fn = program
    else:
        log = CompileLog(case.keep_inference_input_mutations)
        boxed = variant in ("aotkit_boxed", "torch")
        checked = variant == "aotkit_graph_function"
        compilers = dict(
            fw_compiler=log.compiler("fw", boxed=boxed, checked=checked),
            bw_compiler=log.compiler("bw", boxed=boxed, checked=checked),
            inference_compiler=log.compiler("inference", boxed=boxed, checked=checked),
            keep_inference_input_mutations=case.keep_inference_input_mutations,
        )
        if variant == "torch":
            aot_fn, aot_mod = torch_aot.aot_function, torch_aot.aot_module
        else:
            aot_fn, aot_mod = aotkit_frontends.aot_function, aotkit_frontends.aot_module
        fn = aot_mod(module, **compilers) if module is not None else aot_fn(program, **compilers)
    opt = case.optimizer(module.parameters()) if case.optimizer and module is not None else None
    run = Run(variant, [], log, compiled=fn)
    for k in range(case.calls):
        call = make_call(case, k)
        with _quiet():
            obs = observe_call(
                fn, call, module=module, grad_enabled=case.grad_enabled, after=case.after
            )
        run.observations.append(obs)
        if log is not None:
            run.counts.append(log.counts())
        if obs.raised is not None:
            break
        if opt is not None:
            opt.step()
            opt.zero_grad()
    return run


# ---- comparing -----------------------------------------------------------------------


def _close(a: torch.Tensor, b: torch.Tensor, case: Case) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return torch.allclose(a, b, rtol=case.rtol, atol=case.atol, equal_nan=True)
    return bool(torch.equal(a, b))


def _diff_state(
    where: str, ref: TensorState, got: TensorState, case: Case, *, unsafe_view: bool = False
) -> list[str]:
    problems = []
    for attr in ("shape", "stride", "storage_offset", "dtype", "requires_grad", "is_view", "is_leaf"):
        if attr == "is_view" and unsafe_view:
            continue  # See Note [unsafe_view_alias outputs are plain tensors]
        if getattr(ref, attr) != getattr(got, attr):
            problems.append(f"{where}.{attr}: expected {getattr(ref, attr)}, got {getattr(got, attr)}")
    if ref.shape == got.shape and not _close(ref.values, got.values, case):
        err = (ref.values.double() - got.values.double()).abs().max().item() if ref.values.numel() else 0
        problems.append(f"{where}: values differ (max abs diff {err:.3g})")
    return problems


def _same_modulo_tuple_list(a: Any, b: Any) -> bool:
    """Whether two TreeSpecs are equal when a plain tuple node may stand for a list node."""
    if a.is_leaf() or b.is_leaf():
        return bool(a.is_leaf() and b.is_leaf())
    if {a.type, b.type} <= {tuple, list}:
        pass
    elif a.type != b.type or a.context != b.context:
        return False
    return len(a.children_specs) == len(b.children_specs) and all(
        _same_modulo_tuple_list(x, y) for x, y in zip(a.children_specs, b.children_specs, strict=True)
    )


def _visible_aliases(rel: frozenset[tuple[str, int]]) -> set[tuple[str, int]]:
    """Aliasing relations of an output with tensors other than itself (an output returned
    twice is the same object, not another alias)."""
    same = {k for kind, k in rel if kind == "is_output"}
    return {(kind, k) for kind, k in rel if not (kind.endswith("_output") and k in same)}


def compare(
    ref: Observation,
    got: Observation,
    case: Case,
    *,
    tuples_may_be_lists: bool = False,
    unsafe_views: frozenset[int] = frozenset(),
) -> list[str]:
    """Every difference between two observations of one call, as readable lines.

    ``tuples_may_be_lists`` accepts a list where the reference has a tuple: see
    Note [torch returns lists for tuples].
    """
    if ref.raised is not None or got.raised is not None:
        if got.raised is not None and ref.raised is None and ref.backward_raised is not None:
            return []  # See Note [Raising earlier than eager]
        if (ref.raised is None) != (got.raised is None):
            return [f"raised: expected {ref.raised!r}, got {got.raised!r}"]
        return []
    problems: list[str] = []
    if ref.grad_mode_after != got.grad_mode_after:
        problems.append(f"grad mode after the call: expected {ref.grad_mode_after}, got {got.grad_mode_after}")
    if (
        ref.out_spec != got.out_spec
        and tuples_may_be_lists
        and _same_modulo_tuple_list(ref.out_spec, got.out_spec)
    ):
        pass
    elif ref.out_spec != got.out_spec:
        problems.append(f"output structure: expected {ref.out_spec}, got {got.out_spec}")
        return problems
    if ref.out_leaf_types != got.out_leaf_types:
        problems.append(f"output leaf types: expected {ref.out_leaf_types}, got {got.out_leaf_types}")
    if ref.out_constants != got.out_constants:
        problems.append(f"non-tensor outputs: expected {ref.out_constants}, got {got.out_constants}")
    for j, (r, g) in enumerate(zip(ref.outputs, got.outputs, strict=True)):
        # See Note [unsafe_view_alias outputs are plain tensors]
        private = not _visible_aliases(ref.out_aliasing[j]) and not _visible_aliases(
            got.out_aliasing[j]
        )
        problems += _diff_state(
            f"output[{j}]", r, g, case, unsafe_view=j in unsafe_views or private
        )
    for j, (r, g) in enumerate(zip(ref.out_aliasing, got.out_aliasing, strict=True)):
        if r != g:
            problems.append(f"output[{j}] aliasing: expected {sorted(r)}, got {sorted(g)}")
    for i, (r, g) in enumerate(zip(ref.inputs, got.inputs, strict=True)):
        problems += _diff_state(f"input[{i}] after the call", r, g, case)
    if ref.input_storage_kept != got.input_storage_kept:
        problems.append(
            f"inputs keeping their storage: expected {ref.input_storage_kept}, "
            f"got {got.input_storage_kept}"
        )
    if ref.input_aliasing != got.input_aliasing:
        problems.append(f"input aliasing after the call: expected {ref.input_aliasing}, got {got.input_aliasing}")
    if (ref.backward_raised is None) != (got.backward_raised is None):
        problems.append(f"backward raised: expected {ref.backward_raised!r}, got {got.backward_raised!r}")
    both_raised = ref.backward_raised is not None and got.backward_raised is not None
    if both_raised and _error_kind(ref.backward_raised) != _error_kind(got.backward_raised):
        problems.append(f"backward raised: expected {ref.backward_raised!r}, got {got.backward_raised!r}")
    if len(ref.grads) != len(got.grads):
        problems.append(f"number of autograd leaves: expected {len(ref.grads)}, got {len(got.grads)}")
    else:
        for i, (r, g) in enumerate(zip(ref.grads, got.grads, strict=True)):
            if both_raised and g is None:
                continue  # See Note [Gradients left by a backward that raised]
            if (r is None) != (g is None):
                problems.append(f"leaf[{i}].grad: expected {'None' if r is None else 'a tensor'}, got {g}")
            elif r is not None and g is not None and not _close(r, g, case):
                problems.append(f"leaf[{i}].grad: values differ")
    return problems


def _error_kind(raised: str) -> str:
    """An error's type and its first clause: ``RuntimeError: one of the variables needed
    for gradient computation has been modified by an inplace operation`` (what follows
    names autograd nodes, which differ between eager and a compiled function)."""
    kind, _, message = raised.partition(": ")
    return f"{kind}: {message.split(':')[0].split(';')[0]}"


# Note [Gradients left by a backward that raised]
# When eager's backward raises (say, a tensor saved for backward was modified in place),
# the leaves whose AccumulateGrad nodes the engine happened to run before the failing node
# already hold a ``.grad``; which ones depends on the engine's execution order over eager's
# many nodes. A compiled function is one autograd node whose backward computes every
# input's gradient at once, so the same failure can come before (or after) any of those
# accumulations: it may leave a ``.grad`` None that eager filled. When both backwards
# raise, the harness compares the errors (type and first clause, see ``_error_kind``) and,
# per leaf, only a ``.grad`` the compiled run did set: it must equal eager's (a gradient
# eager never produced, or a different value, is still a difference). Leaving a leaf
# untouched by a failed backward is never less correct than eager's partial state.


# Note [torch returns lists for tuples]
# torch's aot_function (2.15) returns a list where the function returned a plain tuple of
# tensors (``lambda x: (x * 2, x + 1)`` gives ``[...]``). That is a torch bug, not
# behaviour to match: aotkit must keep tuples, and the torch oracle is compared with eager
# modulo tuple-vs-list for every case rather than recording the same difference 100 times.


# Note [unsafe_view_alias outputs are plain tensors]
# An output that is the only alias of an intermediate (``return (x * 2).view(-1)``) is of
# kind unsafe_view_alias: AOTAutograd returns it through ``aten._unsafe_view`` in training,
# so ``_is_view()`` is False where eager says True. Nothing else can observe the
# difference (no other tensor shares the storage), and it is what lets the user mutate the
# output of the compiled autograd.Function. The harness skips ``is_view`` for those outputs
# (as classified by aotkit) and compares everything else, including backward errors after
# the user mutated such an output.
# More generally, whether an output that shares its storage with no input and no other
# output is a view of some tensor the caller never sees depends on the compiler: the nop
# compiler returns the graph's value, which may be a view of a graph intermediate (a
# non_alias output computed as ``view(add)`` after a mutation through a view), Inductor a
# fresh buffer. ``is_view`` is compared only for outputs that share storage with something
# the caller can see (in eager or in the compiled result).


# Note [Raising earlier than eager]
# When eager's backward raises (e.g. a tensor saved for backward was modified in place),
# a compiled call may raise already, while tracing the joint graph: the program is
# rejected either way, never silently run.


def compare_runs(
    ref: Run, got: Run, case: Case, *, unsafe_views: frozenset[int] = frozenset()
) -> list[str]:
    problems: list[str] = []
    lenient = got.variant == "torch"  # See Note [torch returns lists for tuples]
    early = (
        got.observations[-1].raised is not None
        and len(got.observations) <= len(ref.observations)
        and ref.observations[len(got.observations) - 1].backward_raised is not None
    )
    if len(ref.observations) != len(got.observations) and not early:
        problems.append(
            f"{got.variant}: {len(got.observations)} calls completed, eager completed "
            f"{len(ref.observations)} (last: {got.observations[-1].raised or ref.observations[-1].raised})"
        )
    for k, (r, g) in enumerate(zip(ref.observations, got.observations, strict=False)):
        problems += [
            f"{got.variant}, call {k}: {p}"
            for p in compare(
                r, g, case, tuples_may_be_lists=lenient, unsafe_views=unsafe_views
            )
        ]
    return problems


def compile_problems(run: Run, *, expect_train: bool | None = None) -> list[str]:
    """Compiler-side checks: functional graphs and compile counts (see the Note above)."""
    assert run.log is not None
    problems = [f"{run.variant}: mutable op handed to a compiler: {b}" for b in run.log.impure]
    if not run.counts or run.observations[0].raised is not None:
        return problems
    # The backward may be compiled lazily, at the first backward through the compiled node
    # (never, if no backward reaches it), so ``bw`` is 0 or 1 and compared apart.
    first = run.counts[0]
    fw_only = {k: v for k, v in first.items() if k != "bw"}
    if fw_only not in ({"fw": 1, "inference": 0}, {"fw": 0, "inference": 1}) or first["bw"] > first["fw"]:
        problems.append(f"{run.variant}: first call compiled {first}")
    if expect_train is not None and (first["fw"] == 1) != expect_train:
        problems.append(
            f"{run.variant}: compiled a {'training' if first['fw'] else 'inference'} graph, "
            f"expected {'training' if expect_train else 'inference'}"
        )
    for k, c in enumerate(run.counts[1:], start=1):
        if {n: v for n, v in c.items() if n != "bw"} != fw_only or c["bw"] > first["fw"]:
            problems.append(f"{run.variant}: call {k} with the same input shapes compiled again ({c})")
    return problems


def unsafe_view_outputs(run: Run) -> frozenset[int]:
    """Tensor-output positions aotkit classified unsafe_view_alias (empty if it raised)."""
    if not run.observations or run.observations[0].raised is not None:
        return frozenset()
    kinds = tensor_output_kinds(run)
    return frozenset(j for j, kind in enumerate(kinds) if kind.name == "unsafe_view_alias")


def _first_entry(run: Run) -> Any:
    fn = run.compiled
    if isinstance(fn, aotkit_frontends.AOTModule):
        fn = fn._compiled
    return fn._aotkit_cache.entries[0]


def aotkit_meta(run: Run) -> Any:
    """The ViewAndMutationMeta and InputLayout of aotkit's first compiled entry of a run."""
    _, _, artifacts = _first_entry(run)
    return artifacts.meta, artifacts.layout


def tensor_output_kinds(run: Run) -> list[Any]:
    """aotkit's OutputType of every tensor leaf of the output pytree, in leaf order (a
    tensor returned twice is one graph output; see Note [Output leaves])."""
    _, outputs, artifacts = _first_entry(run)
    by_leaf = {
        leaf: info for leaf, info in zip(outputs.graph_leaf_indices, artifacts.meta.output_info, strict=True)
    }
    for leaf, first in outputs.repeats.items():
        by_leaf[leaf] = by_leaf[first]
    return [by_leaf[i].output_type for i in sorted(by_leaf) if by_leaf[i].raw_type is torch.Tensor]


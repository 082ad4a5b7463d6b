"""The joint graph traced with the C++ Functionalize key computes what torch's Python mode
gives. See Note [Native functionalization] in aotkit_functional.

Every training program of the corpus is compiled twice, once as aotkit chooses (the native
path where the metadata pass allows it) and once with the Python FunctionalTensorMode
forced; the joint graphs must be the same op for op, and the forward and backward graphs
must read the same, detach nodes of saved outputs and names included (See Note [Detach
nodes of saved outputs] in aotkit_frontends). The native path must really be taken for many
programs. Values are compared by the corpus itself (tests/test_corpus.py), which runs with
the native path on.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import aotkit
import aotkit_capture.compile._compile as compile_module
import pytest
import torch
import torch.nn as nn
from _harness import MODEL_SEED, make_call
from corpus import Case, all_cases

TRAINING_CASES = [
    c for c in all_cases() if c.grad_enabled and not c.eager_raises and c.aotkit_bug is None
]


@contextlib.contextmanager
def _two_pass_only() -> Iterator[None]:
    """The two-pass flow, with native functionalization where it applies."""
    original_single = compile_module.single_pass_blocker
    compile_module.single_pass_blocker = lambda *args: "two passes forced"  # type: ignore[assignment]
    try:
        yield
    finally:
        compile_module.single_pass_blocker = original_single  # type: ignore[assignment]


@contextlib.contextmanager
def _python_mode_only() -> Iterator[None]:
    """The two-pass flow (Note [Single-pass joint trace]) with the Python mode."""
    original = compile_module.trace_joint

    def forced(*args: Any, native: bool, **kwargs: Any) -> Any:
        return original(*args, native=False, **kwargs)

    compile_module.trace_joint = forced  # type: ignore[assignment]
    try:
        with _two_pass_only():
            yield
    finally:
        compile_module.trace_joint = original


def _ops_modulo_detach(gm: torch.fx.GraphModule) -> list[tuple[Any, ...]]:
    """The graph's live nodes in order, with every detach replaced by what it detaches
    and keyword arguments that are None left out."""
    graph = torch.fx.Graph()
    output = graph.graph_copy(gm.graph, {})
    graph.output(output)
    # autograd's view replay can leave a dead view whose input differs between the paths
    graph.eliminate_dead_code()
    # live nodes are named by target and rank among live nodes of that target: the paths
    # may leave different dead nodes, which shifts make_fx's name counters
    root: dict[str, str] = {}
    seen: Counter[str] = Counter()
    ops: list[tuple[Any, ...]] = []

    def name(a: Any) -> Any:
        return root.get(a.name, a.name) if isinstance(a, torch.fx.Node) else a

    for n in graph.nodes:
        if n.target is torch.ops.aten.detach.default:
            root[n.name] = name(n.args[0])
            continue
        args = torch.fx.node.map_aggregate(n.args, name)
        # the native path spells out optional kwargs left at None (attn_mask=None)
        kwargs = {k: name(v) for k, v in n.kwargs.items() if v is not None}
        if n.op == "call_function":
            seen[str(n.target)] += 1
            root[n.name] = f"{n.target}#{seen[str(n.target)]}"
        ops.append((n.op, name(n), str(n.target), args, kwargs))
    return ops


@dataclasses.dataclass(frozen=True)
class _Compiled:
    """What the case's first call compiled for training: the first joint graph's live ops
    (None: nothing was traced for training) and the first training entry."""

    joint: list[tuple[Any, ...]] | None
    entry: Any


# each case compiled once per flow, shared by the tests below (they compare the same
# compilations: default against Python mode, default against two passes)
_COMPILED: dict[tuple[str, str], _Compiled] = {}


def _compiled(case: Case, flow: str = "default") -> _Compiled:
    key = (case.name, flow)
    if key not in _COMPILED:
        modes: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
            "default": contextlib.nullcontext,
            "python": _python_mode_only,
            "two_pass": _two_pass_only,
        }
        with modes[flow]():
            _COMPILED[key] = _compile_first_call(case)
    return _COMPILED[key]


def _compile_first_call(case: Case) -> _Compiled:
    joints: list[list[tuple[Any, ...]]] = []

    def recording_partition(joint: torch.fx.GraphModule, inputs: Any, **kw: Any) -> Any:
        joints.append(_ops_modulo_detach(joint))
        return aotkit.default_partition(joint, inputs, **kw)

    torch.manual_seed(MODEL_SEED)
    if case.module:
        compiled: Any = aotkit.aot_module(case.program(), aotkit.nop, partition_fn=recording_partition)
    else:
        compiled = aotkit.aot_function(case.program, aotkit.nop, partition_fn=recording_partition)
    call = make_call(case, 0)
    try:
        # restores grad mode afterwards (some programs leave it disabled)
        with torch.enable_grad():
            compiled(*call.args, **call.kwargs)
    except Exception:
        return _Compiled(None, None)
    trained = [a for a in _cache(compiled).artifacts if a.joint_module is not None]
    return _Compiled(joints[0] if joints and trained else None, trained[0] if trained else None)


def _joint_code(case: Case, flow: str = "default") -> tuple[list[tuple[Any, ...]] | None, bool]:
    """The first training joint graph of the case's first call, and whether its metadata
    allowed the native path (None: nothing was traced for training)."""
    c = _compiled(case, flow)
    if c.joint is None:
        return None, False
    return c.joint, bool(c.entry.meta.native_functionalization_ok)


def _cache(compiled: Any) -> Any:
    function = compiled._compiled if isinstance(compiled, nn.Module) else compiled
    return function._aotkit_cache


def test_native_joint_graphs_match_the_python_mode() -> None:
    compared = 0
    for case in TRAINING_CASES:
        code, native = _joint_code(case)
        if code is None or not native:
            continue
        reference, _ = _joint_code(case, "python")
        assert code == reference, f"{case.name}: native and Python-mode joint graphs differ"
        compared += 1
    assert compared >= 25, compared


# Programs whose native graphs still read differently from the Python mode's: nn.GRUCell's
# backward unpacks its saved outputs in a pattern of its own (two detach pairs per value,
# read off the original value instead of the forward's detach). A checkpointed region
# (checkpoint_dropout): the native trace keeps the recomputation's detach of a saved input
# as a dead node and orders the tangent scaling after it, so backward node names differ
# (mul_2 / mul_7); same ops, and the corpus checks the values.
# Recurrent layers with gates (nn.LSTM/GRU through the C++ composite kernels, Note [Recurrent
# layers under the Python dispatcher]): the cell's gates are saved outputs whose detach
# nodes the native trace places where the Python mode records none (or none where it
# does), the GRUCell pattern again; same ops and values (the corpus checks them).
_TEXT_DIFFERS = {
    "layernorm_gru_cell",
    "checkpoint_dropout",
    "lstm",
    "lstm_bidirectional_batch_first_two_layers",
    "lstm_two_layers_dropout_input_requires_grad",
    "gru_bidirectional_batch_first_two_layers_dropout",
}


def test_native_forward_and_backward_graphs_read_as_the_python_modes() -> None:
    # See Note [Detach nodes of saved outputs]: names, detach nodes and kwargs included
    compared = 0
    for case in TRAINING_CASES:
        art = _first_training_entry(case)
        if art is None or not (art.single_pass or art.meta.native_functionalization_ok):
            continue
        reference = _first_training_entry(case, "python")
        assert reference is not None
        if case.name in _TEXT_DIFFERS:
            ours = (art.fw_module.code, art.bw_module.code)
            assert ours != (reference.fw_module.code, reference.bw_module.code), (
                f"{case.name} matches now"
            )
            continue
        assert art.fw_module.code == reference.fw_module.code, case.name
        assert art.bw_module.code == reference.bw_module.code, case.name
        compared += 1
    assert compared >= 90, compared


def test_batch_norm_in_training_two_pass_takes_the_python_mode() -> None:
    # native_batch_norm hides its running-stat writes from its schema; in the two-pass
    # flow only the Python mode's decomposition functionalizes them
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    compiled = aotkit.aot_module(model, aotkit.nop)
    with _two_pass_only():
        compiled(torch.randn(2, 3, 6, 6)).sum().backward()
    (art,) = _cache(compiled).artifacts
    assert not art.meta.native_functionalization_ok
    assert art.joint_module is not None
    targets = {n.target for n in art.joint_module.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten._native_batch_norm_legit_functional.default in targets
    assert torch.ops.aten.native_batch_norm.default not in targets


def _bn_functional(training: bool, stats: bool) -> Any:
    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, rm: torch.Tensor, rv: torch.Tensor) -> Any:
        if not stats:
            return torch.nn.functional.batch_norm(x, None, None, w, b, training=training).sin()
        return torch.nn.functional.batch_norm(x, rm, rv, w, b, training, 0.3, 1e-3).sin()

    return f


@pytest.mark.parametrize(
    ("name", "make_program"),
    [
        ("module, training", lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()),
        ("module, eval", lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()),
        ("module, no running stats", lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, track_running_stats=False))),
        ("functional, training", lambda: _bn_functional(True, True)),
        ("functional, eval", lambda: _bn_functional(False, True)),
        ("functional, no stats", lambda: _bn_functional(True, False)),
    ],
)
def test_batch_norm_programs_are_traced_in_one_pass(name: str, make_program: Any) -> None:
    # See Note [Single-pass joint trace]: torch.batch_norm runs as _native_batch_norm_legit,
    # the running stats are mutated inputs; same metadata and live ops as the two-pass
    # flow, same values as eager
    def fresh() -> tuple[Any, list[torch.Tensor]]:
        torch.manual_seed(0)
        program = make_program()
        if isinstance(program, nn.Module):
            return program, [torch.randn(2, 3, 6, 6)]
        return program, [
            torch.randn(4, 3, 5), torch.randn(3, requires_grad=True),
            torch.randn(3, requires_grad=True), torch.rand(3), torch.rand(3) + 0.5,
        ]

    def run(compile_it: bool) -> tuple[Any, Any, list[Any], list[torch.Tensor]]:
        program, inputs = fresh()
        fn = (
            (aotkit.aot_module if isinstance(program, nn.Module) else aotkit.aot_function)(
                program, aotkit.nop
            )
            if compile_it
            else program
        )
        out = fn(*inputs)
        out.sum().backward()
        state = list(program.buffers()) if isinstance(program, nn.Module) else inputs[3:]
        leaves = list(program.parameters()) if isinstance(program, nn.Module) else inputs[1:3]
        return fn, out, [p.grad for p in leaves], [t.clone() for t in state]

    compiled, out, grads, state = run(True)
    _, ref_out, ref_grads, ref_state = run(False)
    (art,) = _cache(compiled).artifacts
    assert art.single_pass, name
    torch.testing.assert_close(out, ref_out)
    for g, r in zip([*grads, *state], [*ref_grads, *ref_state], strict=True):
        torch.testing.assert_close(g, r)
    with _two_pass_only():
        reference, *_ = run(True)
    (ref_art,) = _cache(reference).artifacts
    assert not ref_art.single_pass
    assert _meta_summary(art.meta) == _meta_summary(ref_art.meta), name
    assert _ops_modulo_detach(art.joint_module) == _ops_modulo_detach(ref_art.joint_module), name


def test_mlp_takes_the_native_path() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 2))
    compiled = aotkit.aot_module(model, aotkit.nop)
    compiled(torch.randn(4, 8)).sum().backward()
    (art,) = _cache(compiled).artifacts
    assert art.meta.native_functionalization_ok


@pytest.mark.parametrize("op", ["native_batch_norm", "upsample_nearest2d"])
def test_ops_the_python_mode_rewrites_are_recognised(op: str) -> None:
    from aotkit_functional import needs_python_functionalization

    overload = getattr(torch.ops.aten, op).default
    assert needs_python_functionalization(overload)
    assert not needs_python_functionalization(torch.ops.aten.mm.default)


def test_native_trace_that_keeps_a_rewritten_op_is_redone_in_the_python_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Force the native path past the metadata gate: the traced joint still holds
    # native_batch_norm (a hidden mutation of the running stats), so trace_joint must
    # throw it away and trace with the Python mode.
    monkeypatch.setattr(compile_module, "native_blocker", lambda *a: None)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    reference = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 6, 6)
    compiled = aotkit.aot_module(model, aotkit.nop)
    compiled(x).sum().backward()
    reference(x).sum().backward()
    (art,) = _cache(compiled).artifacts
    targets = {n.target for n in art.joint_module.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten._native_batch_norm_legit_functional.default in targets
    assert torch.ops.aten.native_batch_norm.default not in targets
    bn, ref_bn = model[1], reference[1]
    assert torch.allclose(bn.running_mean, ref_bn.running_mean)
    assert torch.allclose(bn.running_var, ref_bn.running_var)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        assert torch.allclose(p.grad, q.grad, atol=1e-5)


def test_dynamic_shapes_take_the_native_path() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * x.shape[0]).sin().sum(0)

    compiled = aotkit.aot_function(f, aotkit.nop, dynamic=True)
    for n in (4, 6):
        x = torch.randn(n, 3, requires_grad=True)
        compiled(x).sum().backward()
        x_ref = x.detach().clone().requires_grad_(True)
        f(x_ref).sum().backward()
        assert x.grad is not None and torch.allclose(x.grad, x_ref.grad)  # type: ignore[arg-type]
    (art,) = _cache(compiled).artifacts
    assert art.meta.native_functionalization_ok


def _first_training_entry(case: Case, flow: str = "default") -> Any:
    """The artifacts of the case's first training compilation (None: none)."""
    return _compiled(case, flow).entry


def _meta_summary(meta: Any) -> tuple[Any, ...]:
    return (
        tuple(meta.input_info),
        tuple(meta.output_info),
        meta.tangent_indices,
        tuple((t.shape, t.dtype, t.stride()) for t in meta.traced_tangents),
        meta.num_intermediate_bases,
        meta.grad_enabled_mutation,
    )


def test_single_pass_gives_the_two_pass_graphs_and_metadata() -> None:
    # See Note [Single-pass joint trace]: same joint, forward and backward code, same
    # metadata as the metadata pass followed by the joint trace.
    single = with_python_mode = 0
    for case in TRAINING_CASES:
        art = _first_training_entry(case)
        if art is None or not art.single_pass:
            continue
        reference = _first_training_entry(case, "two_pass")
        assert reference is not None and not reference.single_pass
        assert _meta_summary(art.meta) == _meta_summary(reference.meta), case.name
        single += 1
        if not reference.meta.native_functionalization_ok:
            with_python_mode += 1  # the two-pass flow used the Python mode (batch norm)
        if case.name in _TEXT_DIFFERS:
            continue
        assert art.joint_module.code == reference.joint_module.code, case.name
        assert art.fw_module.code == reference.fw_module.code, case.name
        assert art.bw_module.code == reference.bw_module.code, case.name
    assert single >= 20, single
    assert with_python_mode >= 1, "no batch-norm program of the corpus took the single pass"


@pytest.mark.parametrize(
    ("name", "program", "make_inputs"),
    [
        ("input mutation", lambda x: x.mul_(2).sin(), lambda: (torch.randn(3, requires_grad=True).clone(),)),
        ("two outputs view one intermediate", lambda x: (lambda y: (y.view(-1), y[0]))(x.sin()), lambda: (torch.randn(2, 3, requires_grad=True),)),
        ("returns an input", lambda x: (x, x.sin()), lambda: (torch.randn(3, requires_grad=True),)),
        ("detached twin", lambda x: (lambda y: (y, y.detach()))(x.sin()), lambda: (torch.randn(3, requires_grad=True),)),
        ("grad mode left off", lambda x: (x.sin(), torch.set_grad_enabled(False))[0], lambda: (torch.randn(3, requires_grad=True),)),
        ("no grad needed", lambda x: x.sin(), lambda: (torch.randn(3),)),
        ("buffer metadata mutation", lambda x, b: (b.t_(), x.sin())[1], lambda: (torch.randn(3, requires_grad=True), torch.zeros(2, 3))),
        ("mutated input sharing memory", lambda a, b, c: (a.mul_(2), b + 1, c + 1)[1:], lambda: (lambda x: (x.view(-1), x.view(-1), torch.ones(4, requires_grad=True)))(torch.ones(2, 2) + 1)),
    ],
)
def test_programs_outside_the_single_pass_take_the_general_flow(
    name: str, program: Any, make_inputs: Any
) -> None:
    compiled = aotkit.aot_function(program, aotkit.nop)
    try:
        with torch.enable_grad():
            compiled(*make_inputs())
    finally:
        torch.set_grad_enabled(True)
    (art,) = _cache(compiled).artifacts
    assert not art.single_pass, name


def test_in_place_write_to_an_expanded_intermediate_still_raises_like_eager() -> None:
    # eager refuses x.sum(0).expand(...).add_(1); the single pass must not hide it
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x.sum(0, keepdim=True).expand(3, 4)
        y.add_(1)
        return y.sum()

    x = torch.randn(3, 4, requires_grad=True)
    with pytest.raises(RuntimeError) as eager:
        f(x)
    with pytest.raises(RuntimeError) as ours:
        aotkit.aot_function(f, aotkit.nop)(x)
    assert str(ours.value) == str(eager.value)


def test_mlp_is_traced_in_one_pass() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 2))
    compiled = aotkit.aot_module(model, aotkit.nop)
    x = torch.randn(4, 8)
    compiled(x).sum().backward()
    (art,) = _cache(compiled).artifacts
    assert art.single_pass
    placeholders = [n.name for n in art.joint_module.graph.nodes if n.op == "placeholder"]
    assert placeholders == [f"primals_{i}" for i in range(1, 6)] + ["tangents_1"]
    reference = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 2))
    reference.load_state_dict(model.state_dict())
    grads = [p.grad for p in model.parameters()]
    reference(x).sum().backward()
    for g, p in zip(grads, reference.parameters(), strict=True):
        assert g is not None and p.grad is not None and torch.allclose(g, p.grad, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "program"),
    [
        ("a detach the program asks for", lambda x: (x.tanh() + x.sin().detach()).exp().sum()),
        ("a custom Function saving its output", lambda x: _ExpSavingOutput.apply(x.sin()).tanh().sum()),
        ("layer norm's statistics", lambda x: torch.nn.functional.layer_norm(x, (4,)).sigmoid().sum()),
    ],
)
def test_saved_output_detaches_read_as_the_python_modes(name: str, program: Any) -> None:
    def graphs(python_mode: bool) -> tuple[str, str, torch.Tensor]:
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
        compiled = aotkit.aot_function(program, aotkit.nop)
        ctx = _python_mode_only() if python_mode else contextlib.nullcontext()
        with ctx:
            compiled(x).backward()
        (art,) = _cache(compiled).artifacts
        assert x.grad is not None
        return art.fw_module.code, art.bw_module.code, x.grad

    fw, bw, grad = graphs(False)
    ref_fw, ref_bw, ref_grad = graphs(True)
    assert "detach" in fw + bw or name == "layer norm's statistics"
    assert (fw, bw) == (ref_fw, ref_bw), name
    torch.testing.assert_close(grad, ref_grad)


class _ExpSavingOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor) -> torch.Tensor:
        out = a.exp()
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (out,) = ctx.saved_tensors
        return grad * out

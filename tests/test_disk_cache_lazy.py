"""Warm hits of the on-disk cache build node values lazily. See Note [Lazy node values of
restored graphs] in aotkit_cache."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from aotkit_cache.entry._graph import graph_from_json, graph_to_json
from aotkit_cache.entry._values import LazyValueMeta
from aotkit_schemas import CacheFormatError
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode


def _spec(t: Any) -> Any:
    if isinstance(t, torch.Tensor):
        return (tuple(t.shape), t.stride(), t.dtype, t.device, t.requires_grad)
    if isinstance(t, (list, tuple)):
        return [_spec(x) for x in t]
    return t


def test_lazy_meta_builds_once_on_any_access() -> None:
    calls: list[int] = []

    def build() -> int:
        calls.append(1)
        return 7

    reads = [
        lambda m: m["val"], lambda m: m.get("val"), lambda m: "val" in m, lambda m: list(m),
        lambda m: len(m), lambda m: list(m.items()), lambda m: dict(m), lambda m: {**m},
        lambda m: m.copy(), lambda m: copy.copy(m), lambda m: copy.deepcopy(m),
        lambda m: m == {"val": 7}, lambda m: repr(m), lambda m: m | {},
        lambda m: pickle.loads(pickle.dumps(m)),
    ]
    for read in reads:
        calls.clear()
        m = LazyValueMeta(build)
        assert not m.is_built
        read(m)
        assert m.is_built and calls == [1], read
        assert m["val"] == 7 and dict(m) == {"val": 7} and calls == [1]
    for copied in (copy.copy(m), copy.deepcopy(m), m.copy(), pickle.loads(pickle.dumps(m))):
        assert type(copied) is dict and copied == {"val": 7}
    m = LazyValueMeta(build)
    m["other"] = 1  # a write builds the value first: it is never lost
    assert m == {"val": 7, "other": 1}
    m = LazyValueMeta(build)
    m["val"] = 3  # ... and a written value wins
    assert m["val"] == 3
    calls.clear()
    m = LazyValueMeta(build)
    m.clear()
    assert m == {} and not calls


def _training_graphs() -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    import aotkit

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x @ w)
        return (y.sin() + y.cos() * 2).split(2, dim=1)[0]

    g = aotkit.aot_function(f, aotkit.nop)
    g(torch.randn(3, 4), torch.randn(4, 5, requires_grad=True))
    art = g._aotkit_cache.artifacts[0]
    return art.fw_module, art.bw_module


def test_restored_values_equal_an_eager_rebuild() -> None:
    for gm in _training_graphs():
        data = json.loads(json.dumps(graph_to_json(gm)))
        mode = FakeTensorMode()
        back = graph_from_json(data, mode)
        nodes = [n for n in back.graph.nodes if n.op != "output"]
        lazy = [n for n in nodes if isinstance(n.meta, LazyValueMeta)]
        # every value is deferred, placeholders' too
        assert lazy == nodes and lazy
        assert not any(n.meta.is_built for n in lazy)
        originals = {n.name: n.meta.get("val") for n in gm.graph.nodes}
        for n in nodes:
            val = n.meta["val"]
            assert _spec(val) == _spec(originals[n.name]), n.name
            for t in val if isinstance(val, list) else [val]:
                if isinstance(t, torch.Tensor):
                    assert isinstance(t, FakeTensor) and t.fake_mode is mode
        assert all(n.meta.is_built for n in lazy)


@pytest.mark.parametrize(
    "damage",
    [
        ('"shape":[', '"shape":[-1,'),  # a negative size
        ('"stride":[', '"stride":[-1,'),  # a negative stride
        ('"shape":[', '"shape":[1.5,'),  # not an int
        ('"dtype":"float32"', '"dtype":"float99"'),  # an unknown dtype
        ('"device":"cpu"', '"device":"nowhere:x"'),  # a device torch does not parse
        ('"shape":[', '"shape":[4611686018427387904,'),  # no storage that large
    ],
)
def test_a_bad_deferred_value_rejects_the_graph_at_once(damage: tuple[str, str]) -> None:
    _, bw = _training_graphs()
    data = graph_to_json(bw)
    # damage only a value no placeholder has (a deferred one), in the graph's value table
    # (See Note [The value table of a cached graph])
    # nodes are [op, name, target, args, kwargs, val]: See Note [Graph nodes in the cache JSON]
    eager = {n[5] for n in data["nodes"] if n[0] == "placeholder"}
    i = max(set(range(len(data["vals"]))) - eager)
    text = json.dumps(data["vals"][i], separators=(",", ":"))
    assert damage[0] in text
    data["vals"][i] = json.loads(text.replace(damage[0], damage[1], 1))
    bad = json.loads(json.dumps(data))
    with pytest.raises(CacheFormatError):
        graph_from_json(bad, FakeTensorMode())


def test_requires_grad_on_an_integer_value_is_rejected_at_once() -> None:
    _, bw = _training_graphs()
    data = graph_to_json(bw)
    # a value of a non-placeholder node (deferred), in the graph's value table (See Note
    # [The value table of a cached graph])
    node = next(n for n in reversed(data["nodes"]) if n[5] is not None and "T" in data["vals"][n[5]])
    i = node[5]
    data["vals"][i] = {"T": {**data["vals"][i]["T"], "dtype": "int64"}, "rg": True}
    with pytest.raises(CacheFormatError):
        graph_from_json(json.loads(json.dumps(data)), FakeTensorMode())


class _Graphs:
    """What a compiler was handed: the graphs and whether each node's value was built."""

    def __init__(self, read_values: bool) -> None:
        self.read_values = read_values
        self.seen: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        import aotkit

        self.seen.append(gm)
        if self.read_values:
            for n in gm.graph.nodes:
                n.meta.get("val")
        return aotkit.nop(gm, example_inputs)


def _program(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.tanh(x @ w)
    return (y * y.sigmoid()).sum(1)


def _cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compiler: _Graphs
) -> tuple[Any, dict[str, int]]:
    import aotkit
    from aotkit_cache import cache_counters
    from aotkit_schemas import disk_cache_config, mark_cache_key

    monkeypatch.setattr(disk_cache_config, "dir", str(tmp_path))
    monkeypatch.setattr(disk_cache_config, "enabled", True)
    mark_cache_key(compiler, "test.lazy_values/1")
    cache_counters.clear()
    g = aotkit.aot_function(_program, compiler)
    return g, cache_counters


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)


def test_warm_hit_whose_backward_never_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x, w = _inputs()
    cold_compiler = _Graphs(read_values=False)
    g, counters = _cached(tmp_path, monkeypatch, cold_compiler)
    expected = g(x, w)
    assert counters["store"] == 1
    warm_compiler = _Graphs(read_values=False)
    g, counters = _cached(tmp_path, monkeypatch, warm_compiler)
    out = g(x, w)
    assert counters == {"hit": 1}
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert out.requires_grad and out.grad_fn is not None
    (fw,) = warm_compiler.seen  # the backward is compiled at the first backward only
    art = g._aotkit_cache.artifacts[0]
    # (its placeholders' values are this compiler's example inputs, made at restore: it is
    # not marked as ignoring them; See Note [Compilers that ignore their example inputs])
    deferred = [n for n in art.bw_module.graph.nodes
                if isinstance(n.meta, LazyValueMeta) and n.op != "placeholder"]
    assert deferred and not any(n.meta.is_built for n in deferred)
    # the values nop does not read are still not built after the forward ran
    fw_deferred = [n for n in fw.graph.nodes if isinstance(n.meta, LazyValueMeta)]
    assert fw_deferred and not all(n.meta.is_built for n in fw_deferred)
    # ... and a later backward compiles and runs the restored graph
    eager_w = w.detach().clone().requires_grad_(True)
    _program(x, eager_w).sum().backward()
    out.sum().backward()
    assert len(warm_compiler.seen) == 2
    torch.testing.assert_close(w.grad, eager_w.grad, rtol=0, atol=0)


def test_warm_hit_whose_values_are_read_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x, w = _inputs()
    cold_compiler = _Graphs(read_values=True)
    g, counters = _cached(tmp_path, monkeypatch, cold_compiler)
    expected = g(x, w)
    expected.sum().backward()
    expected_grad = w.grad
    w.grad = None
    assert counters["store"] == 1
    warm_compiler = _Graphs(read_values=True)  # a compiler that reads every value
    g, counters = _cached(tmp_path, monkeypatch, warm_compiler)
    out = g(x, w)
    out.sum().backward()
    assert counters == {"hit": 1}
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(w.grad, expected_grad, rtol=0, atol=0)
    assert len(warm_compiler.seen) == len(cold_compiler.seen) == 2
    for cold, warm in zip(cold_compiler.seen, warm_compiler.seen, strict=True):
        # the deferred values, placeholders' too
        cold_vals = {n.name: _spec(n.meta.get("val")) for n in cold.graph.nodes}
        warm_vals = {n.name: _spec(n.meta.get("val")) for n in warm.graph.nodes}
        assert warm_vals == cold_vals
        modes = {
            n.meta["val"].fake_mode
            for n in warm.graph.nodes
            if isinstance(n.meta.get("val"), FakeTensor)
        }
        assert len(modes) == 1  # the entry's one fake mode, as a trace has
    # a recompile of the restored graph (here: FX's code generation and a deep copy, as
    # Inductor's passes do) sees the same values
    fw = warm_compiler.seen[0]
    fw.recompile()
    dup = copy.deepcopy(fw)
    assert [_spec(n.meta.get("val")) for n in dup.graph.nodes] == [
        _spec(n.meta.get("val")) for n in fw.graph.nodes
    ]
    torch.testing.assert_close(
        dup(x, w)[0], fw(x, w)[0], rtol=0, atol=0
    )


def test_static_value_specs_of_deferred_values_and_in_place_adds() -> None:
    from aotkit_backends._buffer_reuse import in_place_adds
    from aotkit_schemas import static_value_spec, tensor_static_spec

    for gm in _training_graphs():
        back = graph_from_json(json.loads(json.dumps(graph_to_json(gm))), FakeTensorMode())
        # nop's in-place additions come out the same without building the values
        found = {n.name for n in in_place_adds(list(back.graph.nodes))}
        assert found == {n.name for n in in_place_adds(list(gm.graph.nodes))}
        nodes = [n for n in back.graph.nodes if n.op != "output"]
        specs = [static_value_spec(n) for n in nodes]
        assert not any(
            n.meta.is_built for n in nodes if isinstance(n.meta, LazyValueMeta)
        )
        assert any(s is not None for s in specs)
        assert specs == [tensor_static_spec(n.meta["val"]) for n in nodes]
        assert specs == [static_value_spec(n) for n in nodes]  # built: read off the value


@pytest.mark.parametrize(
    "shape,stride",
    [((), ()), ((0, 3), (1, 5)), ((1,), (7,)), ((4,), (2,)), ((4,), (1,)), ((2, 3), (3, 1)),
     ((2, 3), (1, 2)), ((2, 3), (4, 1)), ((2, 1, 3), (3, 9, 1)), ((2, 2), (1, 1)),
     ((2, 3, 4, 5), (60, 1, 15, 3)), ((3, 3), (0, 1)), ((1, 1), (0, 0))],
)
def test_dense_and_non_overlapping_is_torchs(
    shape: tuple[int, ...], stride: tuple[int, ...]
) -> None:
    from aotkit_schemas import dense_and_non_overlapping
    from torch._prims_common import is_non_overlapping_and_dense_or_false

    t = torch.empty_strided(shape, stride, device="meta")
    assert dense_and_non_overlapping(shape, stride) == is_non_overlapping_and_dense_or_false(t)


def test_a_deferred_value_is_the_same_wherever_it_is_first_read() -> None:
    from torch._subclasses.functional_tensor import FunctionalTensorMode
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            raise AssertionError(f"a deferred value dispatched {func} through the reader's mode")

    class FunctionSpy(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            raise AssertionError(f"a deferred value called {func} through the reader's mode")

    _, bw = _training_graphs()
    data = json.loads(json.dumps(graph_to_json(bw)))
    expected = [
        _spec(n.meta.get("val")) for n in graph_from_json(data, FakeTensorMode()).graph.nodes
    ]
    contexts = [
        FunctionalTensorMode, Spy, FunctionSpy, FakeTensorMode, torch.inference_mode, torch.no_grad
    ]
    for context in contexts:
        mode = FakeTensorMode()
        back = graph_from_json(data, mode)
        with context():
            for n in back.graph.nodes:
                n.meta.get("val")  # built here, read below
        got = [_spec(n.meta.get("val")) for n in back.graph.nodes]
        assert got == expected, context
        for n in back.graph.nodes:
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor):
                assert type(v) is FakeTensor and v.fake_mode is mode and not v.is_inference()


def test_the_value_table_holds_each_value_once_and_nodes_get_their_own_values() -> None:
    # See Note [The value table of a cached graph]
    _, bw = _training_graphs()
    data = json.loads(json.dumps(graph_to_json(bw)))
    refs = [n[5] for n in data["nodes"] if n[5] is not None]
    assert len(data["vals"]) == len(set(refs)) < len(refs)  # shared, and none unused
    texts = [json.dumps(v, sort_keys=True) for v in data["vals"]]
    assert len(set(texts)) == len(texts)
    gm = graph_from_json(data, FakeTensorMode())
    values = [n.meta["val"] for n in gm.graph.nodes if n.op not in ("output", "get_attr")]
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    assert len({id(t) for t in tensors}) == len(tensors)  # a fresh value per node
    for node, before in zip(gm.graph.nodes, bw.graph.nodes, strict=True):
        v, w = node.meta.get("val"), before.meta.get("val")
        if isinstance(w, torch.Tensor):
            assert (v.shape, v.stride(), v.dtype, v.requires_grad) == (
                w.shape, w.stride(), w.dtype, w.requires_grad)


@pytest.mark.parametrize("bad", [-1, 10**6, "0", 0.0, True, None])
def test_a_value_that_is_not_a_table_index_rejects_the_graph(bad: Any) -> None:
    _, bw = _training_graphs()
    data = json.loads(json.dumps(graph_to_json(bw)))
    node = next(n for n in reversed(data["nodes"]) if n[5] is not None)
    node[5] = bad
    with pytest.raises(CacheFormatError):
        graph_from_json(data, FakeTensorMode())


def test_in_place_adds_on_a_multi_output_op_build_no_value() -> None:
    # a getitem of an op returning several fresh tensors is fresh memory: nop's
    # in-place-addition analysis reads that off the schema, so a restored graph's
    # multi-output value (a list of fakes) is not built for it
    from aotkit_backends._buffer_reuse import in_place_adds
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.ops.aten.native_layer_norm.default(x, [4], None, None, 1e-5)[0]
        return torch.ops.aten.add.Tensor(out, y)

    gm = make_fx(f)(torch.randn(3, 4), torch.randn(3, 4))
    traced = {n.name for n in in_place_adds(list(gm.graph.nodes))}
    assert traced == {"add"}
    back = graph_from_json(json.loads(json.dumps(graph_to_json(gm))), FakeTensorMode())
    assert {n.name for n in in_place_adds(list(back.graph.nodes))} == traced
    lazy = [n for n in back.graph.nodes if isinstance(n.meta, LazyValueMeta)]
    assert any(n.name == "native_layer_norm" for n in lazy)
    assert not any(n.meta.is_built for n in lazy)


class _Examples:
    """A compiler that records its example inputs (as a list) and runs nop."""

    def __init__(self, unused: bool) -> None:
        from aotkit_schemas import mark_example_inputs_unused

        self.examples: list[list[Any]] = []
        if unused:
            mark_example_inputs_unused(self)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        import aotkit

        self.examples.append(list(example_inputs))
        return aotkit.nop(gm, example_inputs)


def test_nop_warm_hit_builds_no_backward_input_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # See Note [Compilers that ignore their example inputs]: nop says it never reads
    # them, so a restored backward's placeholders (the saved activations) stay unbuilt
    import aotkit
    from aotkit_schemas import example_inputs_unused

    assert example_inputs_unused(aotkit.nop)
    x, w = _inputs()
    for run in ("cold", "warm"):
        g, counters = _cached(tmp_path, monkeypatch, aotkit.nop)  # type: ignore[arg-type]
        out = g(x, w)
        out.sum().backward()
        assert counters == ({"miss": 1, "trace": 1, "store": 1} if run == "cold" else {"hit": 1})
        grad, w.grad = w.grad, None
        if run == "cold":
            expected = (out, grad)
    torch.testing.assert_close(out, expected[0], rtol=0, atol=0)
    torch.testing.assert_close(grad, expected[1], rtol=0, atol=0)
    bw = g._aotkit_cache.artifacts[0].bw_module
    inputs = list(bw.graph.find_nodes(op="placeholder"))
    assert inputs and all(isinstance(n.meta, LazyValueMeta) for n in inputs)
    assert not any(n.meta.is_built for n in inputs)


def test_marked_compiler_reading_its_examples_gets_the_same_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a compiler marked as ignoring its example inputs that reads them anyway gets what an
    # unmarked one gets, on a trace and on a warm hit alike
    x, w = _inputs()
    seen: dict[tuple[str, bool], list[list[Any]]] = {}
    for run in ("cold", "warm"):
        for unused in (False, True):
            compiler = _Examples(unused)
            g, _ = _cached(tmp_path / str(unused), monkeypatch, compiler)  # type: ignore[arg-type]
            g(x, w).sum().backward()
            w.grad = None
            seen[run, unused] = compiler.examples
    for run in ("cold", "warm"):
        plain, deferred = seen[run, False], seen[run, True]
        assert len(plain) == len(deferred) == 2
        for a, b in zip(plain, deferred, strict=True):
            assert [_spec(v) for v in a] == [_spec(v) for v in b]


class _Unread:
    """A compiler marked as ignoring its example inputs that keeps them unread."""

    def __init__(self) -> None:
        from aotkit_schemas import mark_example_inputs_unused

        self.examples: list[Any] = []
        mark_example_inputs_unused(self)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        import aotkit

        self.examples.append(example_inputs)
        return aotkit.nop(gm, example_inputs)


def test_warm_hit_builds_no_forward_example_for_a_compiler_that_ignores_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # See Note [Restored inputs' fakes built when read]
    from aotkit_cache.entry._fakes import RestoredFakes

    x, w = _inputs()
    cold = _Unread()
    g, _ = _cached(tmp_path, monkeypatch, cold)  # type: ignore[arg-type]
    expected = g(x, w)
    expected.sum().backward()
    expected_grad, w.grad = w.grad, None
    warm = _Unread()
    g, counters = _cached(tmp_path, monkeypatch, warm)  # type: ignore[arg-type]
    out = g(x, w)
    out.sum().backward()
    assert counters == {"hit": 1}
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(w.grad, expected_grad, rtol=0, atol=0)
    fw_examples = warm.examples[0]
    assert isinstance(fw_examples, RestoredFakes) and fw_examples._metas is not None  # unbuilt
    assert fw_examples.requires_grad == (False, True) and len(fw_examples) == 2
    fw = g._aotkit_cache.artifacts[0].fw_module
    placeholders = list(fw.graph.find_nodes(op="placeholder"))
    # read now: the values a trace hands over, separate from the placeholders' own
    built = list(fw_examples)
    assert [_spec(v) for v in built] == [_spec(v) for v in cold.examples[0]]
    assert [v.requires_grad for v in built] == [False, True]
    assert all(v is not p.meta["val"] for v, p in zip(built, placeholders, strict=True))
    assert {v.fake_mode for v in built} == {fw_examples.fake_mode, placeholders[0].meta["val"].fake_mode}


def _lazy_input(shape: list[int], requires_grad: bool) -> LazyValueMeta:
    from aotkit_cache.entry._values import StaticTensor

    spec = {"shape": shape, "stride": [1] * len(shape), "dtype": "float32", "device": "cpu"}
    recipe = StaticTensor(spec, requires_grad)
    return LazyValueMeta(lambda: recipe.build(FakeTensorMode()), recipe)


def test_restored_fakes_check_without_building() -> None:
    from aotkit_analysis import compute_input_layout
    from aotkit_cache.entry._fakes import RestoredFakes

    mode = FakeTensorMode()
    # a recipe that requires grad where the metadata says the input does not: refused
    with pytest.raises(CacheFormatError, match="requires grad against the metadata"):
        RestoredFakes([_lazy_input([3], True)], [False], mode)
    # the metadata's requires_grad wins where the recipe's is off (as a trace's fakes)
    fakes = RestoredFakes([_lazy_input([3], False), _lazy_input([3], False)], [False, True], mode)
    args = [torch.randn(3), torch.randn(3, requires_grad=True)]
    fakes.check_inputs(args, compute_input_layout(args))
    assert fakes._metas is not None  # checked from the recipes alone
    for bad in (
        [torch.randn(4), args[1]],  # another shape
        [args[0].double(), args[1]],  # another dtype
        [args[0], torch.randn(3)],  # requires_grad off where the entry has it on
        [1.0, args[1]],  # not a tensor
    ):
        with pytest.raises(CacheFormatError):
            fakes.check_inputs(bad, compute_input_layout(bad))
    assert [t.requires_grad for t in fakes] == [False, True]
    fakes.check_inputs(args, compute_input_layout(args))  # and from the built values

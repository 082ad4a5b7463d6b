"""Custom operators and the on-disk cache: a cold run, then a warm run in a fresh process
whose operator code changed in between, must not reuse the stale graph (the results equal
eager's with the new code); unchanged code is a hit. A Python kernel the cache cannot key
(``Library.impl``) stops caching only the compilations that reach it. See Note [Custom
operators in the on-disk cache key] and Note [Refusing only the compilations that reach an
unkeyable kernel]."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# {OPS} is replaced by the variant's operator definitions (they define ``op``)
_PROGRAM = '''
import json, sys
import torch
from aotkit_schemas import disk_cache_config
from aotkit_cache import cache_counters
from aotkit_frontends import aot_function
from aotkit_backends import nop

disk_cache_config.dir = sys.argv[1]
mode = sys.argv[2]

{OPS}

def f(x, w):
    return op(x * w).sum(dim=0) * 3


def run(fn):
    x = torch.arange(6.0).reshape(2, 3) / 7 + 0.1
    w = torch.full((3,), 0.5, requires_grad=True)
    out = fn(x, w)
    out.sum().backward()
    return out.tolist(), w.grad.tolist()


if mode == "compile":
    import aotkit
    torch._dynamo.config.cache_size_limit = 64
    compiled = torch.compile(f, backend="aotkit_eager", fullgraph=True)
else:
    compiled = aot_function(f, nop)
got = run(compiled)
want = run(f)
print(json.dumps({"got": got, "want": want, "counters": dict(cache_counters)}))
'''

CUSTOM_OP = '''
@torch.library.custom_op("cachetest::scale", mutates_args=())
def op(x: torch.Tensor) -> torch.Tensor:
    return x * {FWD}

@op.register_fake
def _(x):
    return torch.empty_like(x)

def _setup(ctx, inputs, output):
    pass

def _backward(ctx, g):
    return g * {BWD}

op.register_autograd(_backward, setup_context=_setup)
'''

FAKE_ONLY = '''
@torch.library.custom_op("cachetest::head", mutates_args=())
def _head(x: torch.Tensor) -> torch.Tensor:
    return x[:{ROWS}].clone()

@_head.register_fake
def _(x):
    return x.new_empty(({ROWS}, x.shape[1]))

def _setup(ctx, inputs, output):
    ctx.n = inputs[0].shape[0]

def _backward(ctx, g):
    return torch.cat([g, g.new_zeros(ctx.n - g.shape[0], g.shape[1])])

_head.register_autograd(_backward, setup_context=_setup)

def op(x):
    return _head(x) * 2
'''

MUTATING = '''
@torch.library.custom_op("cachetest::bump", mutates_args=("buf",))
def _bump(buf: torch.Tensor, x: torch.Tensor) -> None:
    buf.add_(x.detach() * {FWD})

@_bump.register_fake
def _(buf, x):
    return None

def op(x):
    buf = torch.zeros_like(x)
    _bump(buf, x)
    return buf * 0 + x * {BWD}
'''

LIBRARY_IMPL = '''
_lib = torch.library.Library("cachetest", "FRAGMENT")
_lib.define("twice(Tensor x) -> Tensor")
_lib.impl("twice", lambda x: x * {FWD}, "CompositeImplicitAutograd")

def op(x):
    return torch.ops.cachetest.twice(x) + x * {BWD}
'''


def _run(tmp: Path, ops: str, mode: str) -> dict[str, Any]:
    script = tmp / "prog.py"
    script.write_text(_PROGRAM.replace("{OPS}", ops))
    env = {**os.environ, "AOTKIT_CACHE": "1"}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp / "cache"), mode],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _fill(template: str, **values: Any) -> str:
    for k, v in values.items():
        template = template.replace("{" + k + "}", str(v))
    return template


def _check(r: dict[str, Any]) -> None:
    # outputs and gradients: aotkit with nop/aotkit_eager is bitwise eager here
    assert r["got"] == r["want"]


@pytest.mark.parametrize("mode", ["aot_function", "compile"])
def test_a_custom_op_whose_backward_changed_is_traced_again(tmp_path: Path, mode: str) -> None:
    cold = _run(tmp_path, _fill(CUSTOM_OP, FWD=2.0, BWD=2.0), mode)
    _check(cold)
    assert cold["counters"].get("store", 0) >= 1, cold
    same = _run(tmp_path, _fill(CUSTOM_OP, FWD=2.0, BWD=2.0), mode)
    _check(same)
    assert same["counters"].get("trace", 0) == 0 and same["counters"].get("hit", 0) >= 1, same
    # only the autograd formula changes: a stale backward graph would keep the old gradient
    changed = _run(tmp_path, _fill(CUSTOM_OP, FWD=2.0, BWD=5.0), mode)
    _check(changed)
    assert changed["counters"].get("trace", 0) >= 1 and changed["counters"].get("hit", 0) == 0
    assert changed["got"][1] != cold["got"][1]


def test_a_custom_op_whose_fake_kernel_changed_is_traced_again(tmp_path: Path) -> None:
    cold = _run(tmp_path, _fill(FAKE_ONLY, ROWS=1), "aot_function")
    _check(cold)
    assert cold["counters"].get("store", 0) == 1, cold
    changed = _run(tmp_path, _fill(FAKE_ONLY, ROWS=2), "aot_function")
    _check(changed)
    assert changed["counters"].get("trace", 0) == 1 and changed["counters"].get("hit", 0) == 0
    assert changed["got"] != cold["got"]


def test_a_mutating_custom_op_is_keyed_on_its_code(tmp_path: Path) -> None:
    # auto_functionalized: the traced graph calls the op; its code and schema are keyed
    cold = _run(tmp_path, _fill(MUTATING, FWD=1.0, BWD=2.0), "aot_function")
    _check(cold)
    assert cold["counters"].get("store", 0) == 1, cold
    same = _run(tmp_path, _fill(MUTATING, FWD=1.0, BWD=2.0), "aot_function")
    _check(same)
    assert same["counters"].get("hit", 0) == 1 and same["counters"].get("trace", 0) == 0
    changed = _run(tmp_path, _fill(MUTATING, FWD=3.0, BWD=2.0), "aot_function")
    _check(changed)
    assert changed["counters"].get("trace", 0) == 1 and changed["counters"].get("hit", 0) == 0


def test_a_library_impl_kernel_is_not_stored(tmp_path: Path) -> None:
    # a CompositeImplicitAutograd kernel is inlined into the graph, and the dispatcher holds
    # its Python function where the key cannot read it: never stored, always traced
    cold = _run(tmp_path, _fill(LIBRARY_IMPL, FWD=2.0, BWD=1.0), "aot_function")
    _check(cold)
    assert cold["counters"].get("store", 0) == 0 and cold["counters"].get("uncacheable", 0) == 1
    changed = _run(tmp_path, _fill(LIBRARY_IMPL, FWD=4.0, BWD=1.0), "aot_function")
    _check(changed)
    assert changed["counters"].get("trace", 0) == 1
    assert changed["got"] != cold["got"]
    assert not list((tmp_path / "cache").rglob("*.json"))


def test_unkeyable_operators_names_the_kernel_the_key_cannot_read() -> None:
    # the refusal moved from the key (which refused every compilation of the process) to
    # the compilations that reach the operator: See Note [Refusing only the compilations
    # that reach an unkeyable kernel]
    import torch
    from aotkit_cache.key._ops import custom_ops_key, unkeyable_operators

    before = custom_ops_key()
    assert "cachetest_inproc::f" not in unkeyable_operators()
    lib = torch.library.Library("cachetest_inproc", "FRAGMENT")
    try:
        lib.define("f(Tensor x) -> Tensor")
        lib.impl("f", lambda x: x + 1, "CompositeImplicitAutograd")
        reason = unkeyable_operators()["cachetest_inproc::f"]
        assert "cachetest_inproc::f has a Python CompositeImplicitAutograd" in reason
        assert "torch.library.custom_op" in reason
    finally:
        lib._destroy()
    # the kernel is gone: nothing to refuse, keyed as before (its schema may stay listed)
    assert "cachetest_inproc::f" not in unkeyable_operators()
    after = custom_ops_key()
    assert [p for p in after if p[0] != "schema"] == [p for p in before if p[0] != "schema"]


UNUSED_IMPL = '''
_lib = torch.library.Library("cachetest", "FRAGMENT")
_lib.define("twice(Tensor x) -> Tensor")
_lib.impl("twice", lambda x: x * {FWD}, "CompositeImplicitAutograd")

def op(x):
    return x * {BWD}
'''

# aten::matmul overridden in Python: reached only from at::linear's C++ kernel (a 3-d
# input without bias), never named by the program, never in the graph
MATMUL_OVERRIDE = '''
import warnings
warnings.filterwarnings("ignore")
_lib = torch.library.Library("aten", "IMPL")

def _matmul(a, b):
    return torch.mm(a.reshape(-1, a.shape[-1]), b).reshape(*a.shape[:-1], b.shape[-1]) * {FWD}

if {REG}:
    _lib.impl("matmul", _matmul, "CompositeImplicitAutograd")

def op(x):
    if {BWD}:
        return torch.nn.functional.linear(x.unsqueeze(0), torch.eye(3)).squeeze(0)
    return x * 2
'''


def test_a_library_impl_kernel_the_program_does_not_reach_does_not_stop_caching(
    tmp_path: Path,
) -> None:
    # See Note [Refusing only the compilations that reach an unkeyable kernel]
    cold = _run(tmp_path, _fill(UNUSED_IMPL, FWD=2.0, BWD=3.0), "aot_function")
    _check(cold)
    assert cold["counters"].get("store", 0) == 1 and "uncacheable" not in cold["counters"], cold
    # the unreached kernel's code changes: nothing the entry depends on
    warm = _run(tmp_path, _fill(UNUSED_IMPL, FWD=5.0, BWD=3.0), "aot_function")
    _check(warm)
    assert warm["counters"].get("hit", 0) == 1 and warm["counters"].get("trace", 0) == 0, warm
    assert warm["got"] == cold["got"]
    # the program's own code changes: traced again, as always
    changed = _run(tmp_path, _fill(UNUSED_IMPL, FWD=5.0, BWD=4.0), "aot_function")
    _check(changed)
    assert changed["counters"].get("trace", 0) == 1 and changed["got"] != cold["got"]


def test_an_entry_stored_without_the_operator_list_is_traced_again(tmp_path: Path) -> None:
    # a process without unkeyable kernels stores no list of the operators its trace called;
    # a process with one (the same key: an aten override adds nothing to it) cannot tell
    # whether the entry reaches it: it traces, and stores the entry again with its list,
    # which the next such process uses
    plain = _run(tmp_path, _fill(MATMUL_OVERRIDE, FWD=2.0, BWD=0, REG=0), "aot_function")
    _check(plain)
    assert plain["counters"].get("store", 0) == 1, plain
    first = _run(tmp_path, _fill(MATMUL_OVERRIDE, FWD=2.0, BWD=0, REG=1), "aot_function")
    _check(first)
    assert first["counters"].get("trace", 0) == 1 and first["counters"].get("hit", 0) == 0, first
    assert first["counters"].get("unkeyable_reach", 0) == 1 and first["counters"].get("store") == 1
    second = _run(tmp_path, _fill(MATMUL_OVERRIDE, FWD=3.0, BWD=0, REG=1), "aot_function")
    _check(second)
    assert second["counters"].get("hit", 0) == 1 and second["counters"].get("trace", 0) == 0
    again = _run(tmp_path, _fill(MATMUL_OVERRIDE, FWD=2.0, BWD=0, REG=0), "aot_function")
    assert again["counters"].get("hit", 0) == 1 and again["got"] == plain["got"]  # list ignored


def test_an_aten_override_reached_only_from_cpp_is_refused(tmp_path: Path) -> None:
    # at::linear calls at::matmul in C++: the override runs although neither the program
    # nor the graph names matmul; the trace's operator record sees the call. (aot_function
    # only: under torch.compile, dynamo itself, even with backend="eager", runs the 3-d
    # linear without the Python override, unlike eager)
    mode = "aot_function"
    cold = _run(tmp_path, _fill(MATMUL_OVERRIDE, FWD=2.0, BWD=1, REG=1), mode)
    _check(cold)
    assert cold["counters"].get("store", 0) == 0 and cold["counters"].get("uncacheable", 0) >= 1
    changed = _run(tmp_path, _fill(MATMUL_OVERRIDE, FWD=4.0, BWD=1, REG=1), mode)
    _check(changed)
    assert changed["counters"].get("hit", 0) == 0 and changed["got"] != cold["got"]
    # the same process shape, with a program that does not reach matmul: cached
    unused = _run(tmp_path, _fill(MATMUL_OVERRIDE, FWD=2.0, BWD=0, REG=1), mode)
    _check(unused)
    assert unused["counters"].get("store", 0) >= 1, unused
    warm = _run(tmp_path, _fill(MATMUL_OVERRIDE, FWD=4.0, BWD=0, REG=1), mode)
    _check(warm)
    assert warm["counters"].get("hit", 0) >= 1 and warm["counters"].get("trace", 0) == 0, warm

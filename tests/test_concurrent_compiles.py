"""Threads making the first calls of one fresh compiled function at once (Note [Concurrent
first calls]): one compiles, the others wait and reuse its entry, all get eager's values.
Every thread is joined with a timeout and the tests assert that all of them finished, so
a deadlock fails the test instead of hanging it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.fx._symbolic_trace as fx_trace
from aotkit import aot_function, aot_module, nop
from aotkit_capture import COMPILE_LOCK

JOIN_TIMEOUT = 120.0


@pytest.fixture(autouse=True)
def frequent_thread_switches() -> Iterator[None]:
    """Switch threads as often as the interpreter can, so races show up."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def _run_threads(targets: list[Callable[[], Any]]) -> list[Any]:
    """Run each target in its own thread, started together; their results (or the
    exception each raised). Fails if a thread is still running after the timeout."""
    barrier = threading.Barrier(len(targets))
    results: list[Any] = [None] * len(targets)

    def body(k: int) -> None:
        try:
            barrier.wait(timeout=JOIN_TIMEOUT)
            results[k] = targets[k]()
        except BaseException as e:  # reported by the caller
            results[k] = e

    threads = [threading.Thread(target=body, args=(k,), daemon=True) for k in range(len(targets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a thread did not finish: deadlock?"
    return results


def _raise_any(results: list[Any]) -> None:
    for r in results:
        if isinstance(r, BaseException):
            raise r


class _Rendezvous:
    """Makes the first two make_fx traces of a function overlap so that the first one
    ends first, the interleaving that broke torch.fx's global patcher: the first trace
    waits for the second to start; the second waits until ``release()``. Waits time out
    (a compile lock keeps the second thread out of its trace), so it never hangs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entered = 0
        self.first, self.second, self.done = threading.Event(), threading.Event(), threading.Event()

    def __call__(self) -> None:
        if not fx_trace._get_is_fx_tracing():  # thread-local: this thread's make_fx
            return
        with self.lock:
            self.entered += 1
            k = self.entered
        if k == 1:
            self.first.set()
            self.second.wait(3)
        elif k == 2:
            self.second.set()
            self.done.wait(3)

    def release(self) -> None:
        self.done.set()


def _interleaved_first_calls(compile_fn: Callable[..., Any]) -> tuple[Any, Any, Any]:
    meet = _Rendezvous()

    def f(x: torch.Tensor) -> torch.Tensor:
        meet()
        return x.sin() * 2

    g = compile_fn(f)
    x = torch.randn(4)
    results: dict[str, Any] = {}

    def run(name: str) -> None:
        try:
            results[name] = g(x)
        except BaseException as e:
            results[name] = e
        if name == "a":
            meet.release()

    a = threading.Thread(target=run, args=("a",), daemon=True)
    a.start()
    meet.first.wait(JOIN_TIMEOUT)
    b = threading.Thread(target=run, args=("b",), daemon=True)
    b.start()
    a.join(JOIN_TIMEOUT)
    b.join(JOIN_TIMEOUT)
    assert not a.is_alive() and not b.is_alive(), "a thread did not finish: deadlock?"
    return g, results, f(x)


def test_overlapping_first_calls_compile_once_and_match_eager() -> None:
    g, results, expected = _interleaved_first_calls(lambda f: aot_function(f, nop))
    for name in ("a", "b"):
        got = results[name]
        assert not isinstance(got, BaseException), f"thread {name}: {got!r}"
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert len(g._aotkit_cache.entries) == 1


_TORCH_RACE = """
import threading, torch
import torch.fx._symbolic_trace as fx_trace
from functorch.compile import aot_function, nop
first, second, done = threading.Event(), threading.Event(), threading.Event()
entered = []
def f(x):
    if fx_trace._get_is_fx_tracing():
        entered.append(1)
        if len(entered) == 1:
            first.set(); second.wait(3)
        elif len(entered) == 2:
            second.set(); done.wait(3)
    return x.sin() * 2
g = aot_function(f, nop)
errors = []
def run(release):
    try:
        g(torch.randn(4))
    except BaseException as e:
        errors.append(repr(e))
    if release:
        done.set()
a = threading.Thread(target=run, args=(True,)); a.start(); first.wait(30)
b = threading.Thread(target=run, args=(False,)); b.start()
a.join(60); b.join(60)
print(errors)
"""


def test_torch_aot_function_breaks_on_the_same_interleaving() -> None:
    """The crash aotkit fixes, pinned in torch (if torch fixes it, drop this). In a
    subprocess: the race leaves torch.fx's module patches in place for good."""
    out = subprocess.run(
        [sys.executable, "-c", _TORCH_RACE], capture_output=True, text=True, timeout=300,
        check=True,
    ).stdout
    assert "CURRENT_PATCHER is None in finally block" in out, out


def _mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return (torch.tanh(x @ w1) @ w2).sin().sum()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_stress_fresh_functions_four_threads(dynamic: bool) -> None:
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(6, 8), torch.randn(8, 8), torch.randn(8, 3)
    expected = _mlp(x, w1.requires_grad_(), w2.requires_grad_())
    eager_grads = torch.autograd.grad(expected, [w1, w2])
    for _ in range(4):  # a fresh function each round: its first calls race
        bw_compiles: list[int] = []

        def counting_bw(gm: torch.fx.GraphModule, example: Any, seen: list[int] = bw_compiles) -> Any:
            seen.append(1)
            return nop(gm, example)

        g = aot_function(_mlp, nop, counting_bw, dynamic=dynamic)

        def call(g: Any = g) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
            a, b = w1.detach().requires_grad_(), w2.detach().requires_grad_()
            out = g(x, a, b)
            return out, torch.autograd.grad(out, [a, b])

        results = _run_threads([call] * 4)
        _raise_any(results)
        for out, grads in results:
            torch.testing.assert_close(out, expected, rtol=0, atol=0)
            for got, want in zip(grads, eager_grads, strict=True):
                torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert len(g._aotkit_cache.entries) == 1
        assert len(bw_compiles) == 1  # the lazy backward too: compiled once


def test_stress_aot_module_and_inference() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.GELU(), torch.nn.Linear(7, 2))
    x = torch.randn(3, 5)
    with torch.no_grad():
        expected = model(x)
    for _ in range(3):
        compiled = aot_module(model, nop)

        def call(compiled: Any = compiled) -> torch.Tensor:
            with torch.no_grad():
                return compiled(x)  # type: ignore[no-any-return]

        results = _run_threads([call] * 4)
        _raise_any(results)
        for out in results:
            torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_a_call_while_another_thread_traces_the_module_reads_real_parameters() -> None:
    """Thread A's trace has swapped traced tensors into the module's parameters when
    thread B calls it (See Note [Module state read while another thread traces])."""
    tracing, b_calls = threading.Event(), threading.Event()

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if fx_trace._get_is_fx_tracing() and not tracing.is_set():
                tracing.set()
                b_calls.wait(5)
                time.sleep(0.3)  # B reads the module's parameters now
            return self.lin(x).relu()

    torch.manual_seed(0)
    net = Net()
    compiled = aot_module(net, nop)
    x = torch.randn(2, 4)
    with torch.no_grad():
        expected = net(x)
    results: dict[str, Any] = {}

    def run(name: str) -> None:
        try:
            with torch.no_grad():
                results[name] = compiled(x)
        except BaseException as e:
            results[name] = e

    a = threading.Thread(target=run, args=("a",), daemon=True)
    a.start()
    assert tracing.wait(JOIN_TIMEOUT)
    b = threading.Thread(target=run, args=("b",), daemon=True)
    b_calls.set()
    b.start()
    a.join(JOIN_TIMEOUT)
    b.join(JOIN_TIMEOUT)
    assert not a.is_alive() and not b.is_alive(), "a thread did not finish: deadlock?"
    for name in ("a", "b"):
        assert not isinstance(results[name], BaseException), f"thread {name}: {results[name]!r}"
        torch.testing.assert_close(results[name], expected, rtol=0, atol=0)
    for p in net.parameters():
        assert type(p) is torch.nn.Parameter  # the user's tensors are back


def test_a_compiler_that_compiles_another_function_does_not_deadlock() -> None:
    inner = aot_function(lambda t: t.cos(), nop)

    def reentrant(gm: torch.fx.GraphModule, example: Any) -> Any:
        inner(torch.ones(2))  # aotkit compiles again inside the compile, on this thread
        return nop(gm, example)

    g = aot_function(lambda t: t.sin() + 1, reentrant)
    x = torch.randn(3)
    results = _run_threads([lambda: g(x)] * 3)
    _raise_any(results)
    for out in results:
        torch.testing.assert_close(out, x.sin() + 1)
    assert len(g._aotkit_cache.entries) == 1


def test_a_hit_never_takes_the_compile_lock() -> None:
    g = aot_function(lambda t: t * 3, nop)
    x = torch.randn(3)
    g(x)  # compiled
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with COMPILE_LOCK:
            held.set()
            release.wait(JOIN_TIMEOUT)

    t = threading.Thread(target=holder, daemon=True)
    t.start()
    try:
        assert held.wait(JOIN_TIMEOUT)
        results = _run_threads([lambda: g(x)] * 2)  # would block behind the holder
        _raise_any(results)
        for out in results:
            torch.testing.assert_close(out, x * 3)
    finally:
        release.set()
        t.join(JOIN_TIMEOUT)
    assert not t.is_alive()

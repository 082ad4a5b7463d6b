"""Recurrent layers train as eager does (See Note [Kernels that read grad mode] and
Note [Recurrent layers under the Python dispatcher]).

The static-shape cases live in the corpus (``tests/corpus/modules.py``); these cover
dynamic shapes, where torch's AOTAutograd takes its Python decompositions and loses the
dropout between layers, and the global state the tracing touches.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from aotkit import aot_module, nop
from functorch.compile import aot_module as torch_aot_module
from functorch.compile import nop as torch_nop


def _layer(kind: str, dropout: float) -> nn.Module:
    torch.manual_seed(0)
    if kind == "lstm":
        return nn.LSTM(4, 5, num_layers=2, dropout=dropout, bidirectional=True)
    if kind == "gru":
        return nn.GRU(4, 5, num_layers=2, dropout=dropout, batch_first=True)
    return nn.RNN(4, 5, num_layers=3, dropout=dropout, nonlinearity="relu")


def _run(m: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(7)
    out, state = m(x)
    h = state[0] if isinstance(state, tuple) else state
    (out.sin().sum() + h.cos().sum()).backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    return out.detach(), grads


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn"])
@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_dynamic_recurrent_training_equals_eager(kind: str, dropout: float) -> None:
    eager = _layer(kind, dropout)
    compiled = aot_module(copy.deepcopy(eager), nop, dynamic=True)
    for batch, seq in [(3, 6), (2, 6), (4, 7)]:
        shape = (batch, seq, 4) if kind == "gru" else (seq, batch, 4)
        x = torch.randn(shape)
        out_e, grads_e = _run(eager, x)
        out_c, grads_c = _run(compiled, x)
        torch.testing.assert_close(out_c, out_e, rtol=1e-5, atol=1e-5)
        for g_c, g_e in zip(grads_c, grads_e, strict=True):
            torch.testing.assert_close(g_c, g_e, rtol=1e-5, atol=1e-5)


def test_torch_loses_dynamic_dropout_between_layers() -> None:
    """The torch behaviour the Note describes, so a torch that fixes it is noticed."""
    eager = _layer("gru", 0.5)
    oracle = torch_aot_module(copy.deepcopy(eager), torch_nop, dynamic=True)
    x = torch.randn(3, 6, 4)
    out_e, _ = _run(eager, x)
    out_t, _ = _run(oracle, x)
    no_dropout, _ = _run(eager.eval(), x)
    assert not torch.allclose(out_e, no_dropout)
    torch.testing.assert_close(out_t, no_dropout)


def test_tracing_restores_global_state() -> None:
    ops = [torch.ops.aten.lstm.input, torch.ops.aten.gru.input, torch.ops.aten.rnn_tanh.input]
    kernels = [dict(op.py_kernels) for op in ops]
    mkldnn = torch._C._get_mkldnn_enabled()
    compiled = aot_module(_layer("lstm", 0.0), nop, dynamic=True)
    _run(compiled, torch.randn(6, 3, 4))
    assert [dict(op.py_kernels) for op in ops] == kernels
    assert torch._C._get_mkldnn_enabled() == mkldnn


def test_lstm_inference_keeps_fused_kernel() -> None:
    """Without a backward the oneDNN kernel stays (its workspace is never read)."""
    seen: list[torch.fx.GraphModule] = []

    def compiler(gm: torch.fx.GraphModule, _: object) -> torch.fx.GraphModule:
        seen.append(gm)
        return gm

    m = _layer("lstm", 0.0)
    x = torch.randn(6, 3, 4)
    with torch.no_grad():
        out = aot_module(copy.deepcopy(m), compiler)(x)[0]
        torch.testing.assert_close(out, m(x)[0])
    targets = {n.target for n in seen[0].graph.nodes if n.op == "call_function"}
    if torch.backends.mkldnn.is_available() and torch._C._get_mkldnn_enabled():
        assert torch.ops.aten.mkldnn_rnn_layer.default in targets

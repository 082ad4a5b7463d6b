"""Core path: whole modules through aot_module (parameters and buffers lifted as inputs)."""

from __future__ import annotations

import torch
import torch.nn as nn

from corpus import Call, TorchDiffers, case_registrar, rand

module_case = case_registrar("core")


def case(**options):
    return module_case(module=True, **options)


def _sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))

    def forward(self, x):
        return self.layers(x)


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 4, 3, stride=2)
        self.bn2 = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean((2, 3)))


def _randomize_bn_stats(m: nn.Module) -> nn.Module:
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.normal_()
            mod.running_var.uniform_(0.5, 2.0)
    return m


@case(inputs=lambda: (rand(5, 8),), boxed=True)
def mlp():
    return MLP()


@case(inputs=lambda: (rand(5, 8),), calls=4, optimizer=_sgd)
def mlp_sgd_training_steps():
    return MLP()


@case(inputs=lambda: (rand(2, 3, 9, 9),))
def convnet_batchnorm_eval():
    return _randomize_bn_stats(ConvNet()).eval()


@case(inputs=lambda: (rand(4, 3, 9, 9),), calls=3, optimizer=_sgd)
def convnet_batchnorm_train_updates_running_stats():
    return ConvNet().train()


@case(
    inputs=lambda: (rand(4, 3, 9, 9),), calls=3, optimizer=_sgd, keep_inference_input_mutations=True
)
def convnet_batchnorm_train_keeps_stat_updates_in_graph():
    # See Note [Input mutations kept in the training graph]: the running stats are written
    # by copy_ at the end of the training forward graph
    return ConvNet().train()


class StepCounter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("steps", torch.zeros(()))
        self.register_buffer("ema", torch.zeros(4))

    def forward(self, x):
        y = self.lin(x)
        self.steps.add_(1)
        with torch.no_grad():
            self.ema.mul_(0.9).add_(y.mean(0), alpha=0.1)
        return y.tanh() * self.steps


@case(inputs=lambda: (rand(3, 4),), calls=3, optimizer=_sgd, keep_inference_input_mutations=True)
def buffers_updated_in_training_kept_in_graph():
    return StepCounter()


@case(inputs=lambda: (rand(3, 4),), calls=3, optimizer=_sgd)
def buffers_updated_in_training():
    return StepCounter()


@case(inputs=lambda: (rand(2, 6, 16),), rtol=1e-4, atol=1e-5)
def transformer_encoder_layer():
    return nn.TransformerEncoderLayer(d_model=16, nhead=4, dim_feedforward=32, dropout=0.0, batch_first=True)


class KwargsAndDicts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("offset", torch.arange(4.0))

    def forward(self, x, *, gate=None):
        h = self.proj(x) + self.offset
        if gate is not None:
            h = h * torch.sigmoid(gate)
        return {"hidden": h, "norm": h.norm(dim=-1)}


@case(inputs=lambda: Call((rand(3, 4),), {"gate": rand(3, 4, grad=True)}))
def module_kwargs_dict_output():
    return KwargsAndDicts()


class TiedWeights(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.out = nn.Linear(6, 10, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, idx):
        return self.out(self.embed(idx).tanh())


@case(
    inputs=lambda: (torch.randint(0, 10, (2, 3)),),
    torch_differs=TorchDiffers(
        "torch's aot_module calls functional_call with tied weights and raises", raises=True
    ),
)
def tied_weights():
    return TiedWeights()


class RenormalizesInForward(nn.Module):
    """Rescales its weight in place under no_grad and counts calls in a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight.div_(self.lin.weight.norm())
        self.calls.add_(1)
        return self.lin(x)


@case(inputs=lambda: (rand(3, 4),), calls=3, optimizer=_sgd)
def parameter_mutated_under_no_grad_in_forward():
    return RenormalizesInForward()


@case(inputs=lambda: (rand(3, 5),))
def layernorm_gru_cell():
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(5)
            self.cell = nn.GRUCell(5, 7)

        def forward(self, x):
            return self.cell(self.norm(x))

    return M()


# Recurrent layers (See Note [Kernels that read grad mode]). torch's AOTAutograd fails at
# backward on nn.LSTM: on CPU the layer runs oneDNN's kernel, whose training workspace is
# undefined when the compiled forward runs under no_grad.
_LSTM_WORKSPACE = TorchDiffers(
    "nn.LSTM's oneDNN workspace is undefined under the compiled forward's no_grad", raises=True
)


# torch's AOTAutograd returns values that differ from eager's when dropout between
# recurrent layers is on (aotkit's equal eager's, same seed).
_RECURRENT_DROPOUT = TorchDiffers("torch's values differ from eager's with dropout between layers")


class _Recurrent(nn.Module):
    """A recurrent layer whose outputs (sequence and final state) are all returned."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x):
        out, state = self.layer(x)
        return (out, *state) if isinstance(state, tuple) else (out, state)


@case(inputs=lambda: (rand(5, 2, 4),), torch_differs=_LSTM_WORKSPACE, optimizer=_sgd)
def lstm():
    return _Recurrent(nn.LSTM(4, 6))


@case(inputs=lambda: (rand(2, 5, 4),), torch_differs=_LSTM_WORKSPACE)
def lstm_bidirectional_batch_first_two_layers():
    return _Recurrent(nn.LSTM(4, 3, num_layers=2, bidirectional=True, batch_first=True))


@case(inputs=lambda: (rand(5, 2, 4, grad=True),), torch_differs=_RECURRENT_DROPOUT)
def lstm_two_layers_dropout_input_requires_grad():
    return _Recurrent(nn.LSTM(4, 3, num_layers=2, dropout=0.4))


@case(inputs=lambda: (rand(2, 5, 4),), torch_differs=_RECURRENT_DROPOUT)
def gru_bidirectional_batch_first_two_layers_dropout():
    return _Recurrent(nn.GRU(4, 3, num_layers=2, bidirectional=True, batch_first=True, dropout=0.4))


@case(inputs=lambda: (rand(5, 2, 4),))
def rnn_relu_bidirectional_two_layers():
    return _Recurrent(nn.RNN(4, 3, num_layers=2, nonlinearity="relu", bidirectional=True))

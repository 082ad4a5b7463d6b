"""transformers and timm models, built from tiny configs in code (nothing is downloaded), each
wrapped to return a scalar loss, for the ``aotkit inspect`` / ``compare`` tests
(``file.py:factory``)."""

from __future__ import annotations

import torch
import torch.nn as nn

VOCAB = 64
SEQ = 8


class LossOf(nn.Module):
    """``model(**inputs)``'s loss: the model's own (``labels=``) or ``loss_fn`` of its output."""

    def __init__(self, model: nn.Module, takes_labels: bool) -> None:
        super().__init__()
        self.model = model
        self.takes_labels = takes_labels

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.takes_labels:
            loss: torch.Tensor = self.model(x, labels=y).loss
            return loss
        out = self.model(x)
        logits = out if isinstance(out, torch.Tensor) else out.logits
        return nn.functional.cross_entropy(logits, y)


def _tokens() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (2, SEQ))
    return ids, ids


def gpt2() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
        bos_token_id=0, eos_token_id=0,
    )
    return LossOf(GPT2LMHeadModel(config), takes_labels=True), _tokens()


def llama() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=SEQ,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )
    return LossOf(LlamaForCausalLM(config), takes_labels=True), _tokens()


def bert() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        vocab_size=VOCAB, max_position_embeddings=SEQ, num_labels=3, pad_token_id=0,
    )
    model = BertForSequenceClassification(config)
    return LossOf(model, takes_labels=True), (
        torch.randint(0, VOCAB, (2, SEQ)), torch.tensor([0, 2])
    )


def vit() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        image_size=16, patch_size=8, num_channels=3, num_labels=3,
    )
    model = ViTForImageClassification(config)
    return LossOf(model, takes_labels=True), (torch.randn(2, 3, 16, 16), torch.tensor([0, 2]))


def resnet18() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    import timm

    torch.manual_seed(0)
    # timm's resnet18 with one BasicBlock per stage instead of two (kwargs override the
    # architecture's defaults), on 32x32 images
    model = timm.create_model("resnet18", pretrained=False, num_classes=3, layers=(1, 1, 1, 1))
    return LossOf(model, takes_labels=False), (torch.randn(2, 3, 32, 32), torch.tensor([0, 2]))

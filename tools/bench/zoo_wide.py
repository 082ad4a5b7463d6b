"""The wide zoo: more real architectures, tiny, random init (``zoo.py --set wide``).

Each builder returns ``(module, inputs)``: ``module(*inputs)`` is a scalar loss. Every
model is small (2 layers or stages, hidden size at most 128, small images or sequences),
so that one compiles in seconds on a CPU; dropout is off so that training is deterministic.
Nothing is downloaded: transformers models come from configs, timm's with
``pretrained=False``. Chosen for the paths they exercise: shared layers (albert), alibi
(bloom), sliding window and grouped-query attention (mistral, qwen2), partial rotary (phi,
gpt_neox), encoder-decoders (bart, marian, whisper), two towers with a contrastive loss
(clip), windowed attention with rolls (swin), group norm and a conv positional embedding
with weight norm plus a CTC loss (wav2vec2), NoNorm and bottlenecks (mobilebert), and on
the timm side dense concatenation (densenet), split attention (resnest, sknet), multi-branch
fusion (hrnet), an auxiliary head (inception_v3), attention biases (levit), ghost modules
and token mixing (ghostnet, mixer).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

Made = tuple[nn.Module, tuple[torch.Tensor, ...]]


class Loss(nn.Module):
    """``loss(inner, *inputs)``: a scalar."""

    def __init__(self, inner: nn.Module, loss: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.inner = inner
        self.loss = loss

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.loss(self.inner, *inputs)


def _tf() -> Any:
    import transformers as tf

    tf.logging.set_verbosity_error()
    return tf


VOCAB, SEQ, BATCH = 512, 32, 2
_SMALL: dict[str, Any] = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=1, pad_token_id=0)


def _ids() -> torch.Tensor:
    return torch.randint(2, VOCAB, (BATCH, SEQ))


def _lm_loss(inner: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return inner(input_ids=ids, labels=ids).loss  # type: ignore[no-any-return]


def _lm(model_cls: str, cfg_cls: str, **cfg: Any) -> Made:
    tf = _tf()
    model = getattr(tf, model_cls)(getattr(tf, cfg_cls)(**cfg))
    return Loss(model, _lm_loss), (_ids(),)


_BERTISH: dict[str, Any] = dict(
    num_hidden_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=4,
    max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
)
_DECODER: dict[str, Any] = dict(
    num_hidden_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=4,
    max_position_embeddings=64,
)


def distilbert() -> Made:
    return _lm(
        "DistilBertForMaskedLM", "DistilBertConfig", n_layers=2, dim=128, hidden_dim=256,
        n_heads=4, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
        vocab_size=VOCAB, pad_token_id=0,
    )


def roberta() -> Made:
    return _lm("RobertaForMaskedLM", "RobertaConfig", **{**_BERTISH, **_SMALL, "pad_token_id": 1})


def albert() -> Made:
    return _lm(
        "AlbertForMaskedLM", "AlbertConfig", embedding_size=64, classifier_dropout_prob=0.0,
        **{**_BERTISH, **_SMALL},
    )


def electra() -> Made:
    return _lm("ElectraForMaskedLM", "ElectraConfig", embedding_size=64, **{**_BERTISH, **_SMALL})


def mobilebert() -> Made:
    return _lm(
        "MobileBertForMaskedLM", "MobileBertConfig", embedding_size=64, intra_bottleneck_size=32,
        true_hidden_size=32, num_feedforward_networks=2,
        **{**_BERTISH, "intermediate_size": 128, **_SMALL},
    )


def gpt_neo() -> Made:
    return _lm(
        "GPTNeoForCausalLM", "GPTNeoConfig", num_layers=2, attention_types=[[["global", "local"], 1]],
        hidden_size=128, num_heads=4, window_size=8, max_position_embeddings=64,
        embed_dropout=0.0, attention_dropout=0.0, resid_dropout=0.0, **_SMALL,
    )


def gpt_neox() -> Made:
    return _lm(
        "GPTNeoXForCausalLM", "GPTNeoXConfig", rotary_pct=0.25, hidden_dropout=0.0,
        attention_dropout=0.0, **{**_DECODER, **_SMALL},
    )


def gptj() -> Made:
    return _lm(
        "GPTJForCausalLM", "GPTJConfig", n_layer=2, n_embd=128, n_head=4, rotary_dim=16,
        n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **_SMALL,
    )


def opt() -> Made:
    return _lm(
        "OPTForCausalLM", "OPTConfig", num_hidden_layers=2, hidden_size=128, ffn_dim=256,
        num_attention_heads=4, word_embed_proj_dim=64, max_position_embeddings=64,
        dropout=0.0, attention_dropout=0.0, **{**_SMALL, "pad_token_id": 1},
    )


def bloom() -> Made:
    return _lm(
        "BloomForCausalLM", "BloomConfig", n_layer=2, hidden_size=128, n_head=4,
        hidden_dropout=0.0, attention_dropout=0.0, **_SMALL,
    )


def mistral() -> Made:
    return _lm(
        "MistralForCausalLM", "MistralConfig", num_key_value_heads=2, sliding_window=8,
        **{**_DECODER, **_SMALL},
    )


def qwen2() -> Made:
    return _lm("Qwen2ForCausalLM", "Qwen2Config", num_key_value_heads=2, **{**_DECODER, **_SMALL})


def phi() -> Made:
    return _lm(
        "PhiForCausalLM", "PhiConfig", partial_rotary_factor=0.5, resid_pdrop=0.0,
        embd_pdrop=0.0, attention_dropout=0.0, **{**_DECODER, **_SMALL},
    )


def falcon() -> Made:
    return _lm(
        "FalconForCausalLM", "FalconConfig", num_hidden_layers=2, hidden_size=128,
        num_attention_heads=4, hidden_dropout=0.0, attention_dropout=0.0, **_SMALL,
    )


def _seq2seq(model_cls: str, cfg_cls: str, **extra: Any) -> Made:
    cfg = dict(
        encoder_layers=1, decoder_layers=1, d_model=128, encoder_ffn_dim=256,
        decoder_ffn_dim=256, encoder_attention_heads=4, decoder_attention_heads=4,
        max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        decoder_start_token_id=0, **_SMALL,
    )
    return _lm(model_cls, cfg_cls, **{**cfg, **extra})


def bart() -> Made:
    return _seq2seq("BartForConditionalGeneration", "BartConfig")


def marian() -> Made:
    return _seq2seq("MarianMTModel", "MarianConfig", decoder_vocab_size=VOCAB)


def mbart() -> Made:
    return _seq2seq("MBartForConditionalGeneration", "MBartConfig")


def _whisper_loss(inner: nn.Module, feats: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return inner(input_features=feats, labels=labels).loss  # type: ignore[no-any-return]


def whisper() -> Made:
    tf = _tf()
    cfg = tf.WhisperConfig(
        num_mel_bins=16, encoder_layers=1, decoder_layers=1, d_model=64, encoder_ffn_dim=128,
        decoder_ffn_dim=128, encoder_attention_heads=4, decoder_attention_heads=4,
        max_source_positions=32, max_target_positions=32, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, decoder_start_token_id=0, **_SMALL,
    )
    model = tf.WhisperForConditionalGeneration(cfg)
    feats = torch.randn(BATCH, 16, 64)  # 2 * max_source_positions frames
    return Loss(model, _whisper_loss), (feats, torch.randint(2, VOCAB, (BATCH, 8)))


def _clip_loss(inner: nn.Module, ids: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
    return inner(input_ids=ids, pixel_values=pixels, return_loss=True).loss  # type: ignore[no-any-return]


def clip() -> Made:
    tf = _tf()
    text = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=32, bos_token_id=0, eos_token_id=1,
        pad_token_id=0,
    )
    vision = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        image_size=32, patch_size=8,
    )
    model = tf.CLIPModel(tf.CLIPConfig(text_config=text, vision_config=vision, projection_dim=32))
    return Loss(model, _clip_loss), (torch.randint(2, VOCAB, (BATCH, 16)), torch.randn(BATCH, 3, 32, 32))


def _image_loss(inner: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return inner(pixel_values=x, labels=labels).loss  # type: ignore[no-any-return]


def _hf_image(model_cls: str, cfg_cls: str, size: int = 32, labels: torch.Tensor | None = None,
              **cfg: Any) -> Made:
    tf = _tf()
    model = getattr(tf, model_cls)(getattr(tf, cfg_cls)(num_labels=10, **cfg))
    x = torch.randn(BATCH, 3, size, size)
    y = torch.randint(0, 10, (BATCH,)) if labels is None else labels
    return Loss(model, _image_loss), (x, y)


def swin() -> Made:
    return _hf_image(
        "SwinForImageClassification", "SwinConfig", image_size=32, patch_size=2, embed_dim=32,
        depths=[2, 2], num_heads=[2, 4], window_size=4, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, drop_path_rate=0.0,
    )


def deit() -> Made:
    return _hf_image(
        "DeiTForImageClassification", "DeiTConfig", image_size=32, patch_size=8,
        num_hidden_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=4,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )


def convnext() -> Made:
    return _hf_image(
        "ConvNextForImageClassification", "ConvNextConfig", num_stages=2, hidden_sizes=[32, 64],
        depths=[1, 1], drop_path_rate=0.0,
    )


def segformer() -> Made:
    return _hf_image(
        "SegformerForSemanticSegmentation", "SegformerConfig", size=64,
        labels=torch.randint(0, 10, (BATCH, 64, 64)), num_encoder_blocks=2, depths=[1, 1],
        sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
        num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=32,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0,
        drop_path_rate=0.0,
    )


def _ctc_loss(inner: nn.Module, audio: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return inner(input_values=audio, labels=labels).loss  # type: ignore[no-any-return]


def wav2vec2() -> Made:
    tf = _tf()
    cfg = tf.Wav2Vec2Config(
        vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, feat_extract_norm="group",
        hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0,
        final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0, ctc_loss_reduction="mean",
        pad_token_id=0,
    )
    model = tf.Wav2Vec2ForCTC(cfg)
    return Loss(model, _ctc_loss), (torch.randn(BATCH, 1600), torch.randint(1, 32, (BATCH, 12)))


def _classify(inner: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    out = inner(x)
    if isinstance(out, tuple):  # an auxiliary head in training mode (inception_v3)
        return F.cross_entropy(out[0], labels) + 0.4 * F.cross_entropy(out[1], labels)
    return F.cross_entropy(out, labels)


def _timm(name: str, size: int, **kwargs: Any) -> Made:
    import timm

    model = timm.create_model(name, pretrained=False, num_classes=10, **kwargs)
    return Loss(model, _classify), (torch.randn(BATCH, 3, size, size), torch.randint(0, 10, (BATCH,)))


def _mixer() -> Made:
    from timm.models.mlp_mixer import MlpMixer

    model = MlpMixer(num_classes=10, img_size=32, patch_size=8, num_blocks=2, embed_dim=128)
    return Loss(model, _classify), (torch.randn(BATCH, 3, 32, 32), torch.randint(0, 10, (BATCH,)))


def _inception() -> Made:
    return _timm("inception_v3", 299, aux_logits=True)  # the aux head needs 17x17 maps


WIDE: dict[str, Callable[[], Made]] = {
    "distilbert": distilbert,
    "roberta": roberta,
    "albert": albert,
    "electra": electra,
    "mobilebert": mobilebert,
    "gpt_neo": gpt_neo,
    "gpt_neox": gpt_neox,
    "gptj": gptj,
    "opt": opt,
    "bloom": bloom,
    "mistral": mistral,
    "qwen2": qwen2,
    "phi": phi,
    "falcon": falcon,
    "bart": bart,
    "marian": marian,
    "mbart": mbart,
    "whisper": whisper,
    "clip": clip,
    "swin": swin,
    "deit": deit,
    "hf_convnext": convnext,
    "segformer": segformer,
    "wav2vec2": wav2vec2,
    "convnext_atto": functools.partial(_timm, "convnext_atto", 32),
    "regnetx_002": functools.partial(_timm, "regnetx_002", 32),
    "densenet121": functools.partial(_timm, "densenet121", 32),
    "mixer": _mixer,
    "levit": functools.partial(_timm, "levit_128s", 64, img_size=64),
    "efficientformer": functools.partial(_timm, "efficientformer_l1", 224),  # fixed 7x7 attention bias
    "ghostnet": functools.partial(_timm, "ghostnet_100", 32),
    "dla34": functools.partial(_timm, "dla34", 32),
    "hrnet": functools.partial(_timm, "hrnet_w18_small", 64),
    "inception_v3": _inception,
    "resnest14d": functools.partial(_timm, "resnest14d", 32),
    "skresnet18": functools.partial(_timm, "skresnet18", 32),
    "coat_lite": functools.partial(_timm, "coat_lite_tiny", 32, img_size=32),
    "crossvit": functools.partial(_timm, "crossvit_tiny_240", 240),
}

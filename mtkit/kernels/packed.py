"""The one map from a Transformer's parameters to its inference weights: :func:`pack`.

:class:`InferenceWeights` describes the weights once, as CTranslate2's model specs do: per layer
its projections (W_Q, W_K and W_V of self-attention stacked into one (3·d_model, d_model) matrix),
its LayerNorms, the embeddings and position tables, the output projection. Three readers, no other
map: the fused encoder (:func:`mtkit.kernels.encoder.fused_encode`), the fused decoding step
(:func:`mtkit.kernels.decoder_step.fused_step`) and the exporters (:func:`mtkit.export.ctranslate2.build_spec`,
:func:`mtkit.export.huggingface.hf_state`). Every weight is named by its role, after the model's own
parameter names (``self_attn_norm``, ``cross_attn_norm``, ``feed_forward_norm``), never by position.

The map takes the model duck-typed, by the attributes of its checkpoint names (this package imports
nothing of mtkit but the config). Its tensors are the parameters themselves, or concatenations of
them made at packing: weights packed before an optimizer step are the old ones, so whoever packs owns
the result and packs again for new weights (the torch engine packs once, at construction).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mtkit.kernels.linear import PackedLinear

Norm = tuple[Tensor, Tensor]  # a LayerNorm's (weight, bias), each (d_model,)


@dataclass(frozen=True)
class EmbeddingWeights:
    """Token embeddings and positions: x = tokens[ids] · scale + positions[offset : offset + L] (§3.4, §3.5)."""

    tokens: Tensor  # (V, d_model)
    scale: float  # √d_model, or 1 (scale_embedding: false)
    positions: Tensor  # (P, d_model): the sinusoid table or the learned embeddings


@dataclass(frozen=True)
class EncoderLayerWeights:
    self_qkv: PackedLinear  # W_Q, W_K, W_V stacked: (3·d_model, d_model)
    self_out: PackedLinear  # W_O
    ffn_in: PackedLinear  # W_1 (d_ff, d_model)
    ffn_out: PackedLinear  # W_2 (d_model, d_ff)
    self_attn_norm: Norm  # the sub-layers' LayerNorms, named as the model's parameters (STYLE rule 13)
    feed_forward_norm: Norm


@dataclass(frozen=True)
class DecoderLayerWeights:
    self_qkv: PackedLinear  # masked self-attention's W_Q, W_K, W_V stacked: (3·d_model, d_model)
    self_out: PackedLinear
    cross_query: PackedLinear  # attention over the encoder output: W_Q, W_K, W_V, W_O
    cross_key: PackedLinear
    cross_value: PackedLinear
    cross_out: PackedLinear
    ffn_in: PackedLinear
    ffn_out: PackedLinear
    self_attn_norm: Norm  # the three sub-layers' LayerNorms, named as the model's parameters
    cross_attn_norm: Norm
    feed_forward_norm: Norm


@dataclass(frozen=True)
class InferenceWeights:
    """A Transformer's weights for inference, gathered by :func:`pack`."""

    source: EmbeddingWeights
    target: EmbeddingWeights
    encoder: tuple[EncoderLayerWeights, ...]
    decoder: tuple[DecoderLayerWeights, ...]
    encoder_norm: Norm | None  # pre-norm's last LayerNorm of each stack; None for post-norm
    decoder_norm: Norm | None
    output: PackedLinear  # the pre-softmax projection (V, d_model) and its bias (None: §3.4's none)
    heads: int
    pre_norm: bool
    eps: float
    activation: str  # the FFN's: relu | swish | gelu


def _linear(module, reorder: bool) -> PackedLinear:
    return PackedLinear(module.weight, module.bias, reorder)


def _stacked(attn, reorder: bool) -> PackedLinear:
    return PackedLinear(torch.cat([attn.w_q.weight, attn.w_k.weight, attn.w_v.weight]),
                        torch.cat([attn.w_q.bias, attn.w_k.bias, attn.w_v.bias]), reorder)


def _norm(module) -> Norm:
    return module.weight, module.bias


def _embedding(embeddings) -> EmbeddingWeights:
    positions = embeddings.positions
    table = positions.table if hasattr(positions, "table") else positions.weight
    return EmbeddingWeights(embeddings.tokens.weight, embeddings.scale, table)


@torch.no_grad()
def pack(model, reorder: bool = True) -> InferenceWeights:
    """The :class:`InferenceWeights` of a :class:`mtkit.model.Transformer` as its parameters are now.

    ``reorder``: also reorder each matmul's weight for oneDNN where that serves (float32 on the CPU,
    :class:`~mtkit.kernels.linear.PackedLinear`); the exporter, which only reads the weights, says no.
    """
    cfg = model.cfg
    pre_norm = cfg.norm == "pre"
    encoder = tuple(
        EncoderLayerWeights(
            self_qkv=_stacked(layer.self_attn, reorder),
            self_out=_linear(layer.self_attn.w_o, reorder),
            ffn_in=_linear(layer.feed_forward.w_1, reorder),
            ffn_out=_linear(layer.feed_forward.w_2, reorder),
            self_attn_norm=_norm(layer.self_attn_norm),
            feed_forward_norm=_norm(layer.feed_forward_norm),
        )
        for layer in model.encoder.layers
    )
    decoder = tuple(
        DecoderLayerWeights(
            self_qkv=_stacked(layer.self_attn, reorder),
            self_out=_linear(layer.self_attn.w_o, reorder),
            cross_query=_linear(layer.cross_attn.w_q, reorder),
            cross_key=_linear(layer.cross_attn.w_k, reorder),
            cross_value=_linear(layer.cross_attn.w_v, reorder),
            cross_out=_linear(layer.cross_attn.w_o, reorder),
            ffn_in=_linear(layer.feed_forward.w_1, reorder),
            ffn_out=_linear(layer.feed_forward.w_2, reorder),
            self_attn_norm=_norm(layer.self_attn_norm),
            cross_attn_norm=_norm(layer.cross_attn_norm),
            feed_forward_norm=_norm(layer.feed_forward_norm),
        )
        for layer in model.decoder.layers
    )
    return InferenceWeights(
        source=_embedding(model.encoder.embeddings),
        target=_embedding(model.decoder.embeddings),
        encoder=encoder,
        decoder=decoder,
        encoder_norm=_norm(model.encoder.norm) if pre_norm else None,
        decoder_norm=_norm(model.decoder.norm) if pre_norm else None,
        output=_linear(model.output_projection, reorder),
        heads=cfg.h,
        pre_norm=pre_norm,
        eps=cfg.layer_norm_eps,
        activation=cfg.activation,
    )

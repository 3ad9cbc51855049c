"""The encoder's forward pass for inference, fused over :class:`~mtkit.kernels.packed.InferenceWeights`.

:func:`fused_encode` computes the formulas of :class:`mtkit.model.Encoder` (its reference twin, which
training and the reference kernels run) with functional ops on the packed weights: one matmul for W_Q,
W_K and W_V, the matmuls through :class:`~mtkit.kernels.linear.PackedLinear` (oneDNN where that is
faster), no dropout (inference), SDPA for attention over the unpadded keys. It records no gradients
for the weights' modules: run it under ``torch.inference_mode()``.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from mtkit.kernels.decoder_step import ACTIVATIONS
from mtkit.kernels.packed import InferenceWeights


def fused_encode(w: InferenceWeights, src: Tensor, src_mask: Tensor) -> Tensor:
    """src (B, S) ids, src_mask (B, 1, 1, S) True at real tokens -> the encoder output (B, S, d_model)."""
    emb = w.source
    B, S = src.shape
    x = F.embedding(src, emb.tokens) * emb.scale + emb.positions[:S]  # (B, S, d)
    d = x.size(-1)
    h = w.heads
    d_k = d // h
    eps = w.eps
    activation = ACTIVATIONS[w.activation]
    x = x.reshape(B * S, d)
    for lw in w.encoder:
        (n0w, n0b), (n1w, n1b) = lw.self_attn_norm, lw.feed_forward_norm
        y = F.layer_norm(x, (d,), n0w, n0b, eps) if w.pre_norm else x
        q, k, v = lw.self_qkv(y).view(B, S, 3, h, d_k).permute(2, 0, 3, 1, 4).unbind(0)  # each (B, h, S, d_k)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=src_mask)  # (B, h, S, d_k)
        a = lw.self_out(a.transpose(1, 2).reshape(B * S, d))
        x = x + a if w.pre_norm else F.layer_norm(x + a, (d,), n0w, n0b, eps)
        y = F.layer_norm(x, (d,), n1w, n1b, eps) if w.pre_norm else x
        a = lw.ffn_out(activation(lw.ffn_in(y)))
        x = x + a if w.pre_norm else F.layer_norm(x + a, (d,), n1w, n1b, eps)
    if w.encoder_norm is not None:
        x = F.layer_norm(x, (d,), *w.encoder_norm, eps)
    return x.view(B, S, d)

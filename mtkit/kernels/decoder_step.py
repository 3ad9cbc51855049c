"""Incremental decoding for inference, fused over :class:`~mtkit.kernels.packed.InferenceWeights`.

A step takes the last token of each of N rows and the :class:`~mtkit.model.DecoderCache`, and
returns the next-token logits (N, V) and the new cache; rows ``i*beam .. i*beam+beam-1`` belong to
sentence ``i``. Its reference twin is :meth:`mtkit.model.Transformer.decode_step` (the paper's
modules, one call per sub-layer, three projections for Q, K and V).

:func:`fused_step` computes the same formulas with the functional ops directly on the packed weights:
one matmul for W_Q, W_K and W_V together, no module calls, no per-layer closures or dataclass copies.
At the tiny shapes of a decoding step (a few rows of d_model 128-512) the time goes to the number of
operator calls; at larger ones to the matmuls, which run through oneDNN on weights reordered for it
once (:class:`~mtkit.kernels.linear.PackedLinear`). :func:`cross_keys_values` projects the encoder
output once per sentence for the cache, as :meth:`mtkit.model.Transformer.init_cache` does.

The cache is taken duck-typed (this package imports nothing of mtkit but the config); the fused
step has no dropout (inference).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from mtkit.kernels.packed import InferenceWeights

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}


def cross_keys_values(w: InferenceWeights, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
    """Each decoder layer's keys and values over the encoder output memory (B, S, d), each (B, h, S, d_k)."""
    B, S, d = memory.shape
    h = w.heads
    return [(F.linear(memory, lw.cross_key.weight, lw.cross_key.bias).view(B, S, h, d // h).transpose(1, 2),
             F.linear(memory, lw.cross_value.weight, lw.cross_value.bias).view(B, S, h, d // h).transpose(1, 2))
            for lw in w.decoder]  # as MultiHeadAttention.project_kv: the same ops, the same bits


def fused_step(w: InferenceWeights, tokens: Tensor, cache):
    """The step of :meth:`mtkit.model.Transformer.decode_step` through functional ops on ``w``: the
    decoder's output (:func:`fused_hidden`) through the output projection, logits (N, V) and the new cache."""
    hidden, cache = fused_hidden(w, tokens, cache)
    return w.output(hidden), cache


def fused_hidden(w: InferenceWeights, tokens: Tensor, cache):
    """The decoder's output (N, d_model) for the next token, before the output projection, and the new cache.

    Per layer: LayerNorm placement as the model's (post: LayerNorm(x + sublayer(x)); pre:
    x + sublayer(LayerNorm(x))), masked self-attention over the cached keys and values plus the new
    position (one (N, 3·d_model) projection), attention over the encoder output (a sentence's beam rows
    are the queries over its one copy of the keys, as in the model), the feed-forward network.
    """
    emb = w.target
    N = tokens.size(0)
    d = emb.tokens.size(1)
    h = w.heads
    d_k = d // h
    beam = cache.beam
    eps = w.eps
    activation = ACTIVATIONS[w.activation]
    x = F.embedding(tokens, emb.tokens) * emb.scale + emb.positions[cache.step]  # (N, d)
    layers = []
    for lw, lc in zip(w.decoder, cache.layers):
        (n0w, n0b), (n1w, n1b), (n2w, n2b) = lw.self_attn_norm, lw.cross_attn_norm, lw.feed_forward_norm
        # masked self-attention: the new position sees every cached one (all are in its past)
        y = F.layer_norm(x, (d,), n0w, n0b, eps) if w.pre_norm else x
        q, k, v = lw.self_qkv(y).view(N, 3, h, 1, d_k).unbind(1)  # each (N, h, 1, d_k)
        self_k = torch.cat([lc.self_k, k], dim=2)  # (N, h, t+1, d_k)
        self_v = torch.cat([lc.self_v, v], dim=2)
        a = F.scaled_dot_product_attention(q, self_k, self_v)  # (N, h, 1, d_k)
        a = lw.self_out(a.reshape(N, d))
        x = x + a if w.pre_norm else F.layer_norm(x + a, (d,), n0w, n0b, eps)
        # attention over the encoder output
        y = F.layer_norm(x, (d,), n1w, n1b, eps) if w.pre_norm else x
        q = lw.cross_query(y).view(N // beam, beam, h, d_k).transpose(1, 2)  # (B, h, beam, d_k)
        a = F.scaled_dot_product_attention(q, lc.cross_k, lc.cross_v, attn_mask=cache.src_mask)
        a = lw.cross_out(a.transpose(1, 2).reshape(N, d))
        x = x + a if w.pre_norm else F.layer_norm(x + a, (d,), n1w, n1b, eps)
        # position-wise feed-forward network
        y = F.layer_norm(x, (d,), n2w, n2b, eps) if w.pre_norm else x
        a = lw.ffn_out(activation(lw.ffn_in(y)))
        x = x + a if w.pre_norm else F.layer_norm(x + a, (d,), n2w, n2b, eps)
        layers.append(type(lc)(self_k, self_v, lc.cross_k, lc.cross_v))
    if w.decoder_norm is not None:
        x = F.layer_norm(x, (d,), *w.decoder_norm, eps)
    return x, type(cache)(layers, cache.src_mask, cache.beam, cache.step + 1)

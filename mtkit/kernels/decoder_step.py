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

from mtkit.kernels.linear import PackedLinear
from mtkit.kernels.packed import InferenceWeights

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}
STEP_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {**ACTIVATIONS, "relu": torch.relu}  # F.relu's own op


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

    A step of a few rows costs in the number of Python and operator calls: what is the same for every call
    of the step (the matmuls' checks, the shapes) is settled once here, and the ops are torch's own
    (``torch.layer_norm``, ``torch.embedding``: what ``F.layer_norm`` and ``F.embedding`` call, without
    their per-call argument checks), the same operators as the model's modules.
    """
    emb = w.target
    N = tokens.size(0)
    d = emb.tokens.size(1)
    shape = (d,)
    h = w.heads
    d_k = d // h
    beam = cache.beam
    B = N // beam
    eps = w.eps
    pre_norm = w.pre_norm
    activation = STEP_ACTIVATIONS[w.activation]
    layer_norm = torch.layer_norm
    sdpa = F.scaled_dot_product_attention
    src_mask = cache.src_mask
    x = torch.embedding(emb.tokens, tokens) * emb.scale + emb.positions[cache.step]  # (N, d)
    # the matmuls' per-call checks, once for the step: 2-D rows of the weights' dtype, no autocast
    linear = PackedLinear.checked if torch.is_autocast_enabled(x.device.type) else PackedLinear.exact
    layers = []
    for lw, lc in zip(w.decoder, cache.layers):
        (n0w, n0b), (n1w, n1b), (n2w, n2b) = lw.self_attn_norm, lw.cross_attn_norm, lw.feed_forward_norm
        # masked self-attention: the new position sees every cached one (all are in its past)
        y = layer_norm(x, shape, n0w, n0b, eps) if pre_norm else x
        q, k, v = linear(lw.self_qkv, y, N).view(N, 3, h, 1, d_k).unbind(1)  # each (N, h, 1, d_k)
        self_k = torch.cat((lc.self_k, k), dim=2)  # (N, h, t+1, d_k)
        self_v = torch.cat((lc.self_v, v), dim=2)
        a = linear(lw.self_out, sdpa(q, self_k, self_v).reshape(N, d), N)  # attention (N, h, 1, d_k) as (N, d)
        x = x + a if pre_norm else layer_norm(x + a, shape, n0w, n0b, eps)
        # attention over the encoder output
        y = layer_norm(x, shape, n1w, n1b, eps) if pre_norm else x
        q = linear(lw.cross_query, y, N).view(B, beam, h, d_k).transpose(1, 2)  # (B, h, beam, d_k)
        a = sdpa(q, lc.cross_k, lc.cross_v, attn_mask=src_mask)  # (B, h, beam, d_k)
        a = linear(lw.cross_out, a.transpose(1, 2).reshape(N, d), N)
        x = x + a if pre_norm else layer_norm(x + a, shape, n1w, n1b, eps)
        # position-wise feed-forward network
        y = layer_norm(x, shape, n2w, n2b, eps) if pre_norm else x
        a = linear(lw.ffn_out, activation(linear(lw.ffn_in, y, N)), N)
        x = x + a if pre_norm else layer_norm(x + a, shape, n2w, n2b, eps)
        layers.append(type(lc)(self_k, self_v, lc.cross_k, lc.cross_v))
    if w.decoder_norm is not None:
        x = layer_norm(x, shape, *w.decoder_norm, eps)
    return x, type(cache)(layers, src_mask, beam, cache.step + 1)

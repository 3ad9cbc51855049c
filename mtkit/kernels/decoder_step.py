"""The decoding step of incremental decoding: the model's own modules (reference) or one function
over weights packed once per model (fused).

A step takes the last token of each of N rows and the :class:`~mtkit.model.DecoderCache`, and
returns the next-token logits (N, V) and the new cache; rows ``i*beam .. i*beam+beam-1`` belong to
sentence ``i``.

* :func:`module_step` (reference) runs :meth:`mtkit.model.Decoder.step`: the paper's modules, one
  call per sub-layer, with three projections for Q, K and V.
* :func:`fused_step` (auto) computes the same formulas with the functional ops directly on weights
  that :func:`pack_decoder` gathered in ``init_cache``: one matmul for W_Q, W_K and W_V together,
  no module calls, no per-layer closures or dataclass copies. At the tiny shapes of a decoding step
  (a few rows of d_model 128-512) the time goes to the number of operator calls; at larger ones to
  the matmuls, which run through oneDNN on weights reordered for it once
  (:class:`~mtkit.kernels.linear.PackedLinear`). The packing is kept for the model until one of its
  parameters changes (a training step between two validations), not redone per batch.

Both take the model duck-typed (this package imports nothing of mtkit but the config): the fused step
reads the parameters by their checkpoint names' attributes and the model's config. Dropout is
inactive in both (decoding runs the model in eval mode; the fused step has no dropout at all).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from mtkit.kernels.linear import PackedLinear, packed_once

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}


@dataclass(frozen=True)
class PackedLayer:
    """One decoder layer's weights as the fused step uses them: its projections as :class:`PackedLinear`
    (W_Q, W_K and W_V stacked into one (3·d_model, d_model)), its LayerNorms' parameters."""

    qkv: PackedLinear
    self_out: PackedLinear
    cross_query: PackedLinear
    cross_out: PackedLinear
    ffn_in: PackedLinear
    ffn_out: PackedLinear
    norms: tuple[tuple[Tensor, Tensor], ...]  # the three sub-layers' LayerNorm (weight, bias)


@dataclass(frozen=True)
class PackedDecoder:
    """The decoder's weights for :func:`fused_step`, gathered by :func:`pack_decoder` (once per model)."""

    tokens: Tensor  # (V, d_model) target embeddings
    scale: float  # √d_model, or 1 (scale_embedding: false)
    positions: Tensor  # (P, d_model): the sinusoid table or the learned embeddings
    layers: tuple[PackedLayer, ...]
    final_norm: tuple[Tensor, Tensor] | None  # pre-norm's last LayerNorm
    output: PackedLinear  # the pre-softmax projection (V, d_model) and its bias
    heads: int
    pre_norm: bool
    eps: float
    activation: Callable[[Tensor], Tensor]


def _linear(module) -> PackedLinear:
    return PackedLinear(module.weight, module.bias)


def pack_decoder(model) -> PackedDecoder:
    """The decoder of a :class:`mtkit.model.Transformer` packed for :func:`fused_step` (in ``init_cache``):
    packed once and reused while no parameter has been replaced, moved or changed in place."""
    return packed_once(model, "decoder", _pack)


def _pack(model) -> PackedDecoder:
    cfg = model.cfg
    embeddings = model.decoder.embeddings
    positions = embeddings.positions
    layers = []
    for layer in model.decoder.layers:
        attn, cross, ffn = layer.self_attn, layer.cross_attn, layer.feed_forward
        layers.append(PackedLayer(
            qkv=PackedLinear(torch.cat([attn.w_q.weight, attn.w_k.weight, attn.w_v.weight]),
                             torch.cat([attn.w_q.bias, attn.w_k.bias, attn.w_v.bias])),
            self_out=_linear(attn.w_o),
            cross_query=_linear(cross.w_q),
            cross_out=_linear(cross.w_o),
            ffn_in=_linear(ffn.w_1),
            ffn_out=_linear(ffn.w_2),
            norms=tuple((s.norm.weight, s.norm.bias) for s in layer.sublayer),
        ))
    norm = model.decoder.norm
    return PackedDecoder(
        tokens=embeddings.tokens.weight,
        scale=embeddings.scale,
        positions=positions.table if hasattr(positions, "table") else positions.weight,
        layers=tuple(layers),
        final_norm=(norm.weight, norm.bias) if cfg.norm == "pre" else None,
        output=_linear(model.output_projection),
        heads=cfg.h,
        pre_norm=cfg.norm == "pre",
        eps=cfg.layer_norm_eps,
        activation=ACTIVATIONS[cfg.activation],
    )


def no_pack(model) -> None:
    """The reference step needs nothing packed."""
    return None


def module_step(model, tokens: Tensor, cache):
    """The reference: the paper's modules (:meth:`mtkit.model.Decoder.step`), then the output projection."""
    hidden, cache = model.decoder.step(tokens.unsqueeze(1), cache)  # (N, 1, d_model)
    return model.logits(hidden.squeeze(1)), cache


def fused_step(model, tokens: Tensor, cache):
    """The same step as :func:`module_step` through functional ops on ``cache.packed``.

    Per layer: LayerNorm placement as the model's (post: LayerNorm(x + sublayer(x)); pre:
    x + sublayer(LayerNorm(x))), masked self-attention over the cached keys and values plus the new
    position (one (N, 3·d_model) projection), attention over the encoder output (a sentence's beam rows
    are the queries over its one copy of the keys, as in the model), the feed-forward network.
    """
    p: PackedDecoder = cache.packed
    N = tokens.size(0)
    d = p.tokens.size(1)
    h = p.heads
    d_k = d // h
    beam = cache.beam
    eps = p.eps
    x = F.embedding(tokens, p.tokens) * p.scale + p.positions[cache.step]  # (N, d)
    layers = []
    for lp, lc in zip(p.layers, cache.layers):
        (n0w, n0b), (n1w, n1b), (n2w, n2b) = lp.norms
        # masked self-attention: the new position sees every cached one (all are in its past)
        y = F.layer_norm(x, (d,), n0w, n0b, eps) if p.pre_norm else x
        q, k, v = lp.qkv(y).view(N, 3, h, 1, d_k).unbind(1)  # each (N, h, 1, d_k)
        self_k = torch.cat([lc.self_k, k], dim=2)  # (N, h, t+1, d_k)
        self_v = torch.cat([lc.self_v, v], dim=2)
        a = F.scaled_dot_product_attention(q, self_k, self_v)  # (N, h, 1, d_k)
        a = lp.self_out(a.reshape(N, d))
        x = x + a if p.pre_norm else F.layer_norm(x + a, (d,), n0w, n0b, eps)
        # attention over the encoder output
        y = F.layer_norm(x, (d,), n1w, n1b, eps) if p.pre_norm else x
        q = lp.cross_query(y).view(N // beam, beam, h, d_k).transpose(1, 2)  # (B, h, beam, d_k)
        a = F.scaled_dot_product_attention(q, lc.cross_k, lc.cross_v, attn_mask=cache.src_mask)
        a = lp.cross_out(a.transpose(1, 2).reshape(N, d))
        x = x + a if p.pre_norm else F.layer_norm(x + a, (d,), n1w, n1b, eps)
        # position-wise feed-forward network
        y = F.layer_norm(x, (d,), n2w, n2b, eps) if p.pre_norm else x
        a = lp.ffn_out(p.activation(lp.ffn_in(y)))
        x = x + a if p.pre_norm else F.layer_norm(x + a, (d,), n2w, n2b, eps)
        layers.append(type(lc)(self_k, self_v, lc.cross_k, lc.cross_v))
    if p.final_norm is not None:
        x = F.layer_norm(x, (d,), *p.final_norm, eps)
    logits = p.output(x)
    return logits, type(cache)(layers, cache.src_mask, cache.beam, cache.step + 1, p)

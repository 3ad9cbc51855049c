"""The encoder's forward pass: the model's own modules (reference) or, for inference, one function over
weights packed once per model (fused).

* :func:`module_encode` (reference, and always while gradients are recorded or the model trains) runs
  :class:`mtkit.model.Encoder`: the paper's modules.
* :func:`fused_encode` (auto, for decoding) computes the same formulas with functional ops on the packed
  weights: one matmul for W_Q, W_K and W_V, the matmuls through :class:`~mtkit.kernels.linear.PackedLinear`
  (oneDNN where that is faster), no dropout (inference), SDPA for attention over the unpadded keys.

Both take the model duck-typed, as :mod:`mtkit.kernels.decoder_step` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from mtkit.kernels.decoder_step import ACTIVATIONS
from mtkit.kernels.linear import PackedLinear, packed_once


@dataclass(frozen=True)
class PackedEncoderLayer:
    qkv: PackedLinear  # W_Q, W_K, W_V stacked: (3·d_model, d_model)
    out: PackedLinear
    ffn_in: PackedLinear
    ffn_out: PackedLinear
    norms: tuple[tuple[Tensor, Tensor], ...]  # the two sub-layers' LayerNorm (weight, bias)


@dataclass(frozen=True)
class PackedEncoder:
    layers: tuple[PackedEncoderLayer, ...]
    final_norm: tuple[Tensor, Tensor] | None  # pre-norm's last LayerNorm
    heads: int
    pre_norm: bool
    eps: float
    activation: Callable[[Tensor], Tensor]


def _pack(model) -> PackedEncoder:
    cfg = model.cfg
    layers = []
    for layer in model.encoder.layers:
        attn, ffn = layer.self_attn, layer.feed_forward
        layers.append(PackedEncoderLayer(
            qkv=PackedLinear(torch.cat([attn.w_q.weight, attn.w_k.weight, attn.w_v.weight]),
                             torch.cat([attn.w_q.bias, attn.w_k.bias, attn.w_v.bias])),
            out=PackedLinear(attn.w_o.weight, attn.w_o.bias),
            ffn_in=PackedLinear(ffn.w_1.weight, ffn.w_1.bias),
            ffn_out=PackedLinear(ffn.w_2.weight, ffn.w_2.bias),
            norms=tuple((s.norm.weight, s.norm.bias) for s in layer.sublayer),
        ))
    norm = model.encoder.norm
    return PackedEncoder(
        layers=tuple(layers),
        final_norm=(norm.weight, norm.bias) if cfg.norm == "pre" else None,
        heads=cfg.h,
        pre_norm=cfg.norm == "pre",
        eps=cfg.layer_norm_eps,
        activation=ACTIVATIONS[cfg.activation],
    )


def module_encode(model, src: Tensor, src_mask: Tensor) -> Tensor:
    """The reference: :class:`mtkit.model.Encoder`'s modules. src (B, S), src_mask (B, 1, 1, S) -> (B, S, d)."""
    return model.encoder(src, src_mask)


def fused_encode(model, src: Tensor, src_mask: Tensor) -> Tensor:
    """The same pass as :func:`module_encode` through functional ops on packed weights, for inference; while
    the model trains or gradients are recorded, the modules themselves (the packed weights hold none)."""
    if model.training or torch.is_grad_enabled():
        return module_encode(model, src, src_mask)
    p: PackedEncoder = packed_once(model, "encoder", _pack)
    x = model.encoder.embeddings(src)  # (B, S, d); eval mode: no dropout
    B, S, d = x.shape
    h = p.heads
    d_k = d // h
    eps = p.eps
    x = x.reshape(B * S, d)
    for lp in p.layers:
        (n0w, n0b), (n1w, n1b) = lp.norms
        y = F.layer_norm(x, (d,), n0w, n0b, eps) if p.pre_norm else x
        q, k, v = lp.qkv(y).view(B, S, 3, h, d_k).permute(2, 0, 3, 1, 4).unbind(0)  # each (B, h, S, d_k)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=src_mask)  # (B, h, S, d_k)
        a = lp.out(a.transpose(1, 2).reshape(B * S, d))
        x = x + a if p.pre_norm else F.layer_norm(x + a, (d,), n0w, n0b, eps)
        y = F.layer_norm(x, (d,), n1w, n1b, eps) if p.pre_norm else x
        a = lp.ffn_out(p.activation(lp.ffn_in(y)))
        x = x + a if p.pre_norm else F.layer_norm(x + a, (d,), n1w, n1b, eps)
    if p.final_norm is not None:
        x = F.layer_norm(x, (d,), *p.final_norm, eps)
    return x.view(B, S, d)

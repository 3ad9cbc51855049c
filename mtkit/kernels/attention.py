"""Scaled dot-product attention (§3.2.1, Eq. 1): the formula written out (reference) and
``F.scaled_dot_product_attention`` (SDPA: its fused, "flash" kernel where it applies).

Every function takes q (B, h, T, d_k), k and v (B, h, S, d_k), a boolean ``mask``
broadcastable to (B, h, T, S) (True where attention is allowed) or None, ``causal`` (query t
sees keys ≤ t only, as SDPA's ``is_causal``) and ``dropout_p`` (on the weights; 0 outside
training), and returns (B, h, T, d_k).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from mtkit.kernels.dropout import fast_dropout, reference_dropout


def reference_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False, dropout_p: float = 0.0,
    dropout: Callable[[Tensor, float, bool], Tensor] = reference_dropout,
) -> tuple[Tensor, Tensor]:
    """softmax(QKᵀ/√d_k)·V written out, with the weights (B, h, T, S) (before dropout) as well.

    The softmax runs in float32; ``dropout`` is the dropout applied to the weights.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, h, T, S)
    if causal:
        T, S = scores.shape[-2:]
        future = torch.ones(T, S, dtype=torch.bool, device=q.device).tril()  # (T, S)
        mask = future if mask is None else mask & future
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)  # (B, h, T, S)
    dropped = dropout(weights, dropout_p, True) if dropout_p > 0 else weights
    return dropped @ v, weights


def plain_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False,
                    dropout_p: float = 0.0) -> Tensor:
    """The reference formula (``F.dropout`` on the weights): the ``reference`` kernel."""
    return reference_attention(q, k, v, mask, causal, dropout_p)[0]


def plain_attention_fast_dropout(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                                 causal: bool = False, dropout_p: float = 0.0) -> Tensor:
    """The reference formula with the fast CPU dropout on the weights (``auto``'s plain path)."""
    return reference_attention(q, k, v, mask, causal, dropout_p, fast_dropout)[0]


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False,
                   dropout_p: float = 0.0) -> Tensor:
    """``F.scaled_dot_product_attention``: the flash kernel where device, dtype and mask allow."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal)


def choose_attention(q: Tensor) -> Callable[..., Tensor]:
    """``auto``'s attention kernel for queries ``q`` (B, h, T, d_k) at this call.

    ======  =============  ======================  =================================
    device  gradients on?  dtype of q, d_k         kernel
    ======  =============  ======================  =================================
    CPU     yes            bf16 / fp16, any d_k    plain formula (fast dropout)
    CPU     yes            fp32, d_k < 64          plain formula (fast dropout)
    CPU     yes            fp32, d_k ≥ 64          SDPA
    CPU     no             any                     SDPA
    other   any            any                     SDPA
    ======  =============  ======================  =================================

    Why: training on CPU at sentence lengths, the flash kernel's backward measured slower than
    the plain formula's in bf16, and in fp32 too with heads of d_k 32; fp32 with d_k 64 keeps SDPA
    (the figures: benchmarks/README.md). It depends on the
    grad mode and the autocast dtype, known only at the call: a per-call rule of the table in
    :mod:`mtkit.kernels`.
    """
    if q.device.type == "cpu" and torch.is_grad_enabled() and (q.dtype != torch.float32 or q.size(-1) < 64):
        return plain_attention_fast_dropout
    return sdpa_attention


def auto_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False,
                   dropout_p: float = 0.0) -> Tensor:
    """Attention through the kernel that :func:`choose_attention` picks."""
    return choose_attention(q)(q, k, v, mask, causal, dropout_p)

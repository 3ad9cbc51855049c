"""The decoder step's self-attention projections Q = xW_Q, K = xW_K, V = xW_V (§3.2.2).

At every step of incremental decoding each decoder layer projects the newest position of every
row three times. ``pack`` runs once per batch (in ``init_cache``) and ``project`` once per step:

* separate (reference): three matmuls with the layer's own parameters;
* stacked (auto): W_Q, W_K, W_V (and their biases) concatenated once per batch, one matmul per
  step, whose (N, 3·d_model) output is split into views. The parameters stay separate: their names
  are the checkpoint format.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def separate_qkv_weights(w_q: nn.Linear, w_k: nn.Linear, w_v: nn.Linear) -> tuple[Tensor, ...]:
    return (w_q.weight, w_q.bias, w_k.weight, w_k.bias, w_v.weight, w_v.bias)


def separate_qkv(x: Tensor, packed: tuple[Tensor, ...]) -> tuple[Tensor, Tensor, Tensor]:
    """x (N, d_model) -> Q, K, V, each (N, d_model), by three matmuls."""
    w_q, b_q, w_k, b_k, w_v, b_v = packed
    return F.linear(x, w_q, b_q), F.linear(x, w_k, b_k), F.linear(x, w_v, b_v)


def stacked_qkv_weights(w_q: nn.Linear, w_k: nn.Linear, w_v: nn.Linear) -> tuple[Tensor, ...]:
    """(3·d_model, d_model) stacked weights and (3·d_model,) biases."""
    return torch.cat([w_q.weight, w_k.weight, w_v.weight]), torch.cat([w_q.bias, w_k.bias, w_v.bias])


def stacked_qkv(x: Tensor, packed: tuple[Tensor, ...]) -> tuple[Tensor, Tensor, Tensor]:
    """x (N, d_model) -> Q, K, V, each (N, d_model) (views of one (N, 3·d_model) matmul)."""
    q, k, v = F.linear(x, *packed).chunk(3, dim=-1)
    return q, k, v

"""Label-smoothed cross-entropy (§5.4, "Label Smoothing", ε_ls = 0.1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor, int]:
    """Summed label-smoothed loss and NLL over the non-padding target tokens.

    The smoothed target puts 1-ε on the reference token and spreads ε uniformly over
    the whole vocabulary: loss = (1-ε)·NLL + ε·mean_v(-log p_v).

    Args:
        logits: (B, T, V) (any float dtype; the softmax runs in float32).
        target: (B, T) ids, ``pad_id`` where there is no token.

    Returns:
        (loss_sum, nll_sum, n_tokens); divide by a token count to normalize.
    """
    logits = logits.reshape(-1, logits.size(-1))  # (B*T, V)
    target = target.reshape(-1)  # (B*T,)
    keep = target != pad_id
    logits, target = logits[keep], target[keep]  # drop padding before the vocabulary-sized work
    lprobs = F.log_softmax(logits.float(), dim=-1)  # (N, V)
    nll = -lprobs.gather(1, target.unsqueeze(1)).squeeze(1)  # (N,)
    smooth = -lprobs.mean(dim=-1)  # (N,)
    loss = (1.0 - epsilon) * nll + epsilon * smooth
    return loss.sum(), nll.sum().detach(), int(target.numel())


def perplexity(nll_per_token: float) -> float:
    return float(torch.tensor(nll_per_token).clamp(max=50).exp())

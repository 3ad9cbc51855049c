"""Label-smoothed cross-entropy (§5.4, "Label Smoothing", ε_ls = 0.1).

:func:`reference_label_smoothed_loss` is the formula written out with a float32
log-softmax; :func:`label_smoothed_loss`, used for training, computes the same
values and gradients without materializing float32 log-probabilities of the whole
(N, V) matrix: it works through row chunks and writes the gradient straight into
the logits' dtype (tests/unit/test_fast_paths.py checks the equivalence).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# Rows per chunk are chosen so that one float32 chunk of (rows, V) is about this many
# elements (4 MiB): large enough for efficient kernels, small enough to stay in cache.
CHUNK_ELEMENTS = 1 << 20


def _drop_padding(logits: Tensor, target: Tensor, pad_id: int) -> tuple[Tensor, Tensor]:
    logits = logits.reshape(-1, logits.size(-1))  # (B*T, V)
    target = target.reshape(-1)  # (B*T,)
    keep = target != pad_id
    return logits[keep], target[keep]  # drop padding before the vocabulary-sized work


def reference_label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor, int]:
    """Summed label-smoothed loss and NLL over the non-padding target tokens.

    The smoothed target puts 1-ε on the reference token and spreads ε uniformly over
    the whole vocabulary: loss = (1-ε)·NLL + ε·mean_v(-log p_v).

    Args:
        logits: (B, T, V) (any float dtype; the softmax runs in float32).
        target: (B, T) ids, ``pad_id`` where there is no token.

    Returns:
        (loss_sum, nll_sum, n_tokens); divide by a token count to normalize.
    """
    logits, target = _drop_padding(logits, target, pad_id)
    lprobs = F.log_softmax(logits.float(), dim=-1)  # (N, V)
    nll = -lprobs.gather(1, target.unsqueeze(1)).squeeze(1)  # (N,)
    smooth = -lprobs.mean(dim=-1)  # (N,)
    loss = (1.0 - epsilon) * nll + epsilon * smooth
    return loss.sum(), nll.sum().detach(), int(target.numel())


class _ChunkedSmoothedCE(torch.autograd.Function):
    """Per-token label-smoothed loss and NLL of logits (N, V), chunk by chunk; zero at padding.

    With lse = logsumexp(logits): NLL = lse - logit[target], mean_v(-log p_v) =
    lse - mean_v(logit), and d loss / d logits = softmax - (1-ε)·onehot(target) - ε/V.
    Only (rows, V) float32 chunks ever exist; the gradient is written in the logits' dtype.
    Padding rows are masked rather than cut out: with length-bucketed batches they are
    few, and cutting them out would copy the whole matrix forward and scatter it backward.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor]:
        N, V = logits.shape
        rows = max(1, CHUNK_ELEMENTS // V)
        keep = target != pad_id  # (N,)
        lse = logits.new_empty(N, dtype=torch.float32)
        loss = logits.new_empty(N, dtype=torch.float32)
        nll = logits.new_empty(N, dtype=torch.float32)
        for i in range(0, N, rows):
            x = logits[i : i + rows].float()  # (rows, V)
            t = target[i : i + rows].unsqueeze(1)  # (rows, 1)
            chunk_lse = torch.logsumexp(x, dim=-1)  # (rows,)
            lse[i : i + rows] = chunk_lse
            nll[i : i + rows] = chunk_lse - x.gather(1, t).squeeze(1)
            loss[i : i + rows] = chunk_lse - x.mean(dim=-1)  # the smoothing term, for now
        loss.mul_(epsilon).add_(nll, alpha=1.0 - epsilon).mul_(keep)
        nll.mul_(keep)
        ctx.save_for_backward(logits, target, lse, keep)
        ctx.epsilon = epsilon
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        logits, target, lse, keep = ctx.saved_tensors
        N, V = logits.shape
        eps = ctx.epsilon
        rows = max(1, CHUNK_ELEMENTS // V)
        grad_loss = grad_loss.float() * keep  # (N,), zero at padding
        grad = torch.empty_like(logits)
        for i in range(0, N, rows):
            p = logits[i : i + rows].float().sub_(lse[i : i + rows].unsqueeze(1)).exp_()  # softmax, (rows, V)
            p.sub_(eps / V)
            p.scatter_add_(1, target[i : i + rows].unsqueeze(1), p.new_full((p.size(0), 1), eps - 1.0))
            grad[i : i + rows] = p.mul_(grad_loss[i : i + rows].unsqueeze(1))
        return grad, None, None, None


def label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor, int]:
    """The same as :func:`reference_label_smoothed_loss` (same arguments and results), computed
    chunk-wise without a float32 copy of the whole (N, V) log-probabilities."""
    logits = logits.reshape(-1, logits.size(-1))  # (B*T, V), a view
    target = target.reshape(-1)  # (B*T,)
    loss, nll = _ChunkedSmoothedCE.apply(logits, target, float(epsilon), pad_id)
    return loss.sum(), nll.sum().detach(), int((target != pad_id).sum())


def perplexity(nll_per_token: float) -> float:
    return float(torch.tensor(nll_per_token).clamp(max=50).exp())

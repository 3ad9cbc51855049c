"""Dropout (§5.4, Srivastava et al. 2014): ``F.dropout`` (reference) and a faster CPU dropout (fast).

Both are inverted dropout: kept entries are x / (1 - p), dropped ones 0, at rate p. The fast
one draws its mask from :func:`keep_mask`, several times faster on CPU than the ``bernoulli_``
that ``F.dropout`` draws from (benchmarks/README.md); off the CPU it is ``F.dropout`` itself.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def reference_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """``F.dropout``; the identity (x itself) out of training or at p = 0."""
    if not training or p == 0.0:
        return x
    return F.dropout(x, p, training)


class _MaskedScale(torch.autograd.Function):
    """x · keep / (1 - p) with a 0/1 ``keep`` mask of x's dtype (a bool mask would be cast on every use)."""

    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None, None


def keep_mask(shape: torch.Size, p: float, dtype: torch.dtype) -> Tensor:
    """A 0/1 mask of ``dtype`` on CPU, 1 with probability 1 - p (p rounded to a multiple of 1/65536).

    Each element compares 16 random bits with a threshold: a quarter of the random draws
    of ``torch.rand``, from the same seeded generator.
    """
    n = math.prod(shape)
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # uniform over all 64 bits
    lanes = bits.view(torch.int16)[:n].view(shape)  # uniform over [-32768, 32767]
    threshold = torch.tensor(round(p * 65536) - 32768, dtype=torch.int16)
    return torch.ge(lanes, threshold, out=torch.empty(shape, dtype=dtype))


def masked_dropout(x: Tensor, keep: Tensor, p: float) -> Tensor:
    """x · keep / (1 - p) for a given 0/1 ``keep`` mask of x's dtype, with its gradient through the same mask."""
    return _MaskedScale.apply(x, keep, 1.0 / (1.0 - p))


def fast_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """The same as :func:`reference_dropout`, with a :func:`keep_mask` on CPU (0 < p < 1)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training)
    return masked_dropout(x, keep_mask(x.shape, p, x.dtype), p)

"""Label-smoothed cross-entropy (§5.4, "Label Smoothing", ε_ls = 0.1) and R-Drop's symmetric KL.

Reference twins: :func:`reference_label_smoothed_loss` and :func:`reference_symmetric_kl`, the
formulas written out with a float32 log-softmax of the whole (N, V) matrix, and
:func:`reference_linear_label_smoothed_loss`, the logits ``hidden @ Wᵀ`` then the reference loss.

Fast paths, the same values and gradients (tests/unit/test_fast_paths.py): the chunked
:func:`label_smoothed_loss` and :func:`symmetric_kl` never hold float32 copies of the whole (N, V)
matrices: they work through row chunks and, as the loss is the last node of the graph, compute
the gradient in the same pass, straight into the logits' dtype; the fused
:func:`linear_label_smoothed_loss` never makes the (N, V) logits at all.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# Rows per chunk are chosen so that one float32 chunk of (rows, V) is about this many
# elements (4 MiB): large enough for efficient kernels, small enough to stay in cache.
CHUNK_ELEMENTS = 1 << 20
# On a GPU, cache is not the point: fewer, larger chunks (256 MiB of float32 logits).
GPU_CHUNK_ELEMENTS = 1 << 26


def _drop_padding(logits: Tensor, target: Tensor, pad_id: int) -> tuple[Tensor, Tensor]:
    logits = logits.reshape(-1, logits.size(-1))  # (B*T, V)
    target = target.reshape(-1)  # (B*T,)
    keep = target != pad_id
    return logits[keep], target[keep]  # drop padding before the vocabulary-sized work


def reference_label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float,
                                  pad_id: int) -> tuple[Tensor, Tensor, int]:
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


def _chunk_loss_and_grad(logits: Tensor, target: Tensor, epsilon: float, grad_out: Tensor | None):
    """One chunk of rows: logits (rows, V), target (rows, 1) -> NLL (rows,) and the smoothing
    term mean_v(-log p_v) (rows,). With ``grad_out`` (rows, V), of any float dtype, also writes
    d loss / d logits = p - (1-ε)·onehot - ε/V there.

    Which kernels, measured on CPU (benchmarks/README.md): for float32 logits a second fused
    softmax, then the subtraction written straight into ``grad_out``; for bf16/fp16 logits the
    log-probabilities turned into probabilities in place (``exp_``) and cast at the end, 1.37x
    faster there, as a subtraction whose output has another dtype is slow."""
    lprobs = F.log_softmax(logits, dim=-1, dtype=torch.float32)  # (rows, V)
    nll = -lprobs.gather(1, target).squeeze(1)
    smooth = -lprobs.mean(dim=-1)
    if grad_out is None:
        return nll, smooth
    if grad_out.dtype == torch.float32:
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)  # (rows, V)
        probs.scatter_add_(1, target, probs.new_full(target.shape, epsilon - 1.0))
        torch.sub(probs, epsilon / logits.size(-1), out=grad_out)
    else:
        probs = lprobs.exp_()  # (rows, V); nll and smooth are already computed from it
        probs.scatter_add_(1, target, probs.new_full(target.shape, epsilon - 1.0))
        grad_out.copy_(probs.sub_(epsilon / logits.size(-1)))
    return nll, smooth


def _scale_rows_once(ctx, name: str, grad_out: Tensor) -> tuple[Tensor, ...]:
    """The backward pass of a per-row loss whose gradients (N, V) were computed in its forward pass
    and saved as ``ctx.saved_tensors = (*grads, keep)``: scales each row by its incoming gradient
    (N,), zero at padding, in place, so that they can serve one backward pass only."""
    if ctx.consumed:
        raise RuntimeError(f"{name}: backward can run only once (retain_graph is not supported)")
    ctx.consumed = True
    *grads, keep = ctx.saved_tensors
    # (N, 1), zero at padding; in the gradients' dtype, as a mixed-dtype in-place product is
    # several times slower (in bf16 the scale is rounded to 8 bits, the same for every row).
    scale = (grad_out.float() * keep).to(grads[0].dtype).unsqueeze(1)
    return tuple(g.mul_(scale) for g in grads)


class _ChunkedSmoothedCE(torch.autograd.Function):
    """Per-token label-smoothed loss and NLL of logits (N, V), chunk by chunk; zero at padding.

    With log p = log_softmax(logits): NLL = -log p[target], mean_v(-log p_v) is the
    smoothing term, and d loss / d logits = p - (1-ε)·onehot(target) - ε/V. The loss is
    the last node of the graph, so the gradient is computed in the forward pass, from the
    same chunk (:func:`_chunk_loss_and_grad`), and kept in the logits' dtype; the backward
    pass only scales it by the incoming per-token gradient. Only (rows, V) float32 chunks
    ever exist. Padding rows are masked rather than cut out: with length-bucketed batches
    they are few, and cutting them out would copy the whole matrix.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor]:
        N, V = logits.shape
        rows = max(1, CHUNK_ELEMENTS // V)
        keep = target != pad_id  # (N,)
        want_grad = ctx.needs_input_grad[0]
        grad = torch.empty_like(logits) if want_grad else None  # (N, V), d loss_i / d logits_i
        loss = logits.new_empty(N, dtype=torch.float32)
        nll = logits.new_empty(N, dtype=torch.float32)
        for i in range(0, N, rows):
            t = target[i : i + rows].unsqueeze(1)  # (rows, 1)
            chunk_grad = grad[i : i + rows] if want_grad else None  # written in the logits' dtype
            nll[i : i + rows], loss[i : i + rows] = _chunk_loss_and_grad(logits[i : i + rows], t, epsilon, chunk_grad)
            # loss holds the smoothing term for now
        loss.mul_(epsilon).add_(nll, alpha=1.0 - epsilon).mul_(keep)
        nll.mul_(keep)
        ctx.consumed = False
        if want_grad:
            ctx.save_for_backward(grad, keep)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        (grad,) = _scale_rows_once(ctx, "label_smoothed_loss", grad_loss)
        return grad, None, None, None


def label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor, int]:
    """The same as :func:`reference_label_smoothed_loss` (same arguments and results), computed
    chunk-wise without a float32 copy of the whole (N, V) log-probabilities."""
    logits = logits.reshape(-1, logits.size(-1))  # (B*T, V), a view
    target = target.reshape(-1)  # (B*T,)
    loss, nll = _ChunkedSmoothedCE.apply(logits, target, float(epsilon), pad_id)
    return loss.sum(), nll.sum().detach(), int((target != pad_id).sum())


class _LinearSmoothedCE(torch.autograd.Function):
    """Summed label-smoothed loss and NLL of logits = hidden · Wᵀ, a chunk of rows at a time.

    The (N, V) logits never exist whole: each chunk of rows is projected, turned into
    its loss and its gradient, and multiplied back into the gradients of ``hidden`` and
    ``W`` while it is still in cache. The gradients are computed in the forward pass
    (the loss is the end of the graph) and scaled in the backward pass by the incoming
    gradient of the sum. Matmuls run in ``dtype`` (the autocast dtype, or the inputs');
    softmax, the loss and W's gradient are accumulated in float32.
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, target: Tensor, epsilon: float, pad_id: int,
                dtype: torch.dtype, rows: int) -> tuple[Tensor, Tensor]:
        N = hidden.size(0)
        want_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        with torch.autocast(hidden.device.type, enabled=False):
            h = hidden.to(dtype)  # (N, d)
            w = weight.to(dtype)  # (V, d)
            keep = target != pad_id  # (N,)
            loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
            nll_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
            grad_h = torch.empty_like(h) if want_grad else None  # (N, d)
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_grad else None
            for i in range(0, N, rows):
                h_c, t, k = h[i : i + rows], target[i : i + rows].unsqueeze(1), keep[i : i + rows]
                g = h.new_empty(h_c.size(0), w.size(0)) if want_grad else None  # (rows, V), d loss / d logits
                nll, smooth = _chunk_loss_and_grad(h_c @ w.t(), t, epsilon, g)  # logits (rows, V)
                nll, smooth = nll * k, smooth * k  # (rows,), zero at padding
                loss_sum += (1.0 - epsilon) * nll.sum() + epsilon * smooth.sum()
                nll_sum += nll.sum()
                if want_grad:
                    g.mul_(k.unsqueeze(1).to(dtype))
                    torch.mm(g, w, out=grad_h[i : i + rows])  # (rows, d)
                    grad_w += g.t() @ h_c  # (V, d)
        if want_grad:
            ctx.save_for_backward(grad_h, grad_w)
        ctx.input_dtypes = (hidden.dtype, weight.dtype)
        ctx.mark_non_differentiable(nll_sum)
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        grad_h, grad_w = ctx.saved_tensors
        h_dtype, w_dtype = ctx.input_dtypes
        g_h = (grad_h * grad_loss).to(h_dtype) if ctx.needs_input_grad[0] else None  # (N, d): small, no in-place
        g_w = (grad_w * grad_loss).to(w_dtype) if ctx.needs_input_grad[1] else None
        return g_h, g_w, None, None, None, None, None


def linear_label_smoothed_loss(hidden: Tensor, weight: Tensor, target: Tensor, epsilon: float, pad_id: int,
                               rows: int = 0) -> tuple[Tensor, Tensor, int]:
    """:func:`label_smoothed_loss` of ``hidden @ weight.T`` without the (N, V) logits.

    Args:
        hidden: (B, T, d_model) decoder output; weight: (V, d_model), the output projection.
        target: (B, T) ids, ``pad_id`` where there is no token.
        rows: rows per chunk (0: about ``CHUNK_ELEMENTS`` logits on CPU, ``GPU_CHUNK_ELEMENTS``
            elsewhere, at least 256 rows).

    Returns:
        (loss_sum, nll_sum, n_tokens), as :func:`label_smoothed_loss`.
    """
    hidden = hidden.reshape(-1, hidden.size(-1))  # (B*T, d_model)
    target = target.reshape(-1)  # (B*T,)
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
    else:
        dtype = torch.promote_types(hidden.dtype, weight.dtype)
    chunk = CHUNK_ELEMENTS if device_type == "cpu" else GPU_CHUNK_ELEMENTS
    rows = rows or max(256, chunk // weight.size(0))
    loss, nll = _LinearSmoothedCE.apply(hidden, weight, target, float(epsilon), pad_id, dtype, rows)
    return loss, nll.detach(), int((target != pad_id).sum())


def reference_symmetric_kl(logits_a: Tensor, logits_b: Tensor, target: Tensor, pad_id: int) -> Tensor:
    """Summed KL(P_a‖P_b) + KL(P_b‖P_a) over the non-padding target tokens (R-Drop's consistency term).

    Written as Σ_v (p_a - p_b)(log p_a - log p_b), which is the sum of the two divergences.

    Args:
        logits_a, logits_b: (B, T, V), two predictions of the same tokens; the softmax runs in float32.
        target: (B, T) ids, ``pad_id`` where there is no token.
    """
    lp_a = F.log_softmax(logits_a.float(), dim=-1)  # (B, T, V)
    lp_b = F.log_softmax(logits_b.float(), dim=-1)
    per_token = ((lp_a.exp() - lp_b.exp()) * (lp_a - lp_b)).sum(dim=-1)  # (B, T)
    return (per_token * (target != pad_id)).sum()


class _ChunkedSymmetricKL(torch.autograd.Function):
    """Per-token KL(P_a‖P_b) + KL(P_b‖P_a) of logits (N, V) and (N, V), chunk by chunk; zero at padding.

    With d = log p_a - log p_b and KL_ab = Σ p_a·d, KL_ba = -Σ p_b·d:
    d KL / d logits_a = p_a ⊙ (d - KL_ab) + p_a - p_b and d KL / d logits_b = -p_b ⊙ (d + KL_ba) + p_b - p_a.
    As in :class:`_ChunkedSmoothedCE`, the gradients are computed in the forward pass from float32
    chunks that stay in cache, kept in the logits' dtype, and scaled in the backward pass.
    """

    @staticmethod
    def forward(ctx, logits_a: Tensor, logits_b: Tensor, keep: Tensor) -> Tensor:
        N, V = logits_a.shape
        rows = max(1, CHUNK_ELEMENTS // V)
        grad_a, grad_b = torch.empty_like(logits_a), torch.empty_like(logits_b)
        kl = logits_a.new_empty(N, dtype=torch.float32)
        for i in range(0, N, rows):
            lp_a = F.log_softmax(logits_a[i : i + rows], dim=-1, dtype=torch.float32)  # (rows, V)
            lp_b = F.log_softmax(logits_b[i : i + rows], dim=-1, dtype=torch.float32)
            d = lp_a - lp_b
            p_a, p_b = lp_a.exp_(), lp_b.exp_()  # in place: the log-probabilities are not needed after d
            kl_ab = (p_a * d).sum(-1, keepdim=True)  # (rows, 1)
            kl_ba = -(p_b * d).sum(-1, keepdim=True)
            kl[i : i + rows] = (kl_ab + kl_ba).squeeze(1)
            diff = p_a - p_b
            grad_a[i : i + rows] = p_a * (d - kl_ab) + diff
            grad_b[i : i + rows] = -(p_b * (d + kl_ba)) - diff
        kl.mul_(keep)
        ctx.save_for_backward(grad_a, grad_b, keep)
        ctx.consumed = False
        return kl

    @staticmethod
    def backward(ctx, grad_kl: Tensor):
        grad_a, grad_b = _scale_rows_once(ctx, "symmetric_kl", grad_kl)
        return grad_a, grad_b, None


def symmetric_kl(logits_a: Tensor, logits_b: Tensor, target: Tensor, pad_id: int) -> Tensor:
    """The same as :func:`reference_symmetric_kl` (same arguments and result), computed chunk-wise
    with its gradient, without float32 copies of the whole (N, V) matrices."""
    V = logits_a.size(-1)
    keep = (target.reshape(-1) != pad_id)
    return _ChunkedSymmetricKL.apply(logits_a.reshape(-1, V), logits_b.reshape(-1, V), keep).sum()


def reference_linear_label_smoothed_loss(hidden: Tensor, weight: Tensor, target: Tensor, epsilon: float, pad_id: int,
                                         rows: int = 0) -> tuple[Tensor, Tensor, int]:
    """The logits ``hidden @ weight.T`` (B, T, V) made whole, then :func:`reference_label_smoothed_loss`
    (``rows`` is ignored: the twin of :func:`linear_label_smoothed_loss`)."""
    return reference_label_smoothed_loss(hidden @ weight.t(), target, epsilon, pad_id)

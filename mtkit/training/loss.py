"""The training objective (§5.4): label-smoothed cross-entropy (ε_ls = 0.1), optionally with R-Drop.

The loss kernels (the chunked, fused and reference label-smoothed losses, the symmetric KL) live
in :mod:`mtkit.kernels.loss` beside their reference twins; :class:`TranslationLoss` takes them
from the :class:`~mtkit.kernels.Kernels` it is given.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mtkit.kernels import Kernels, KernelsName, select


def guided_alignment_loss(attention: Tensor, align: Tensor) -> Tensor:
    """-Σ align · log attention over every target piece and source piece (float32): the cross-entropy of
    guided alignment, summed over the target pieces with links (the others' rows of ``align`` are zero).
    attention, align: (B, T, S)."""
    log_attention = attention.float().clamp_min(1e-9).log()
    return -(align.float() * log_attention).sum()


def perplexity(nll_per_token: float) -> float:
    return float(torch.tensor(nll_per_token).clamp(max=50).exp())


class TranslationLoss(nn.Module):
    """The training objective (§5.4): label-smoothed cross-entropy of the model's translations.

    One forward from a batch to its summed loss, so that a DDP wrapper around this module
    sees the whole computation. The loss kernels come from ``kernels`` (the table in
    mtkit.kernels): with ``auto``, the output projection (§3.4) is fused into the loss off the
    CPU (the (N, V) logits never exist), and on CPU the logits are made whole and go through the
    chunked loss. ``fuse_projection`` forces either path (None: as the kernels choose). The fused
    path needs the projection's weight: the model's ``output_projection``, a linear map without bias.

    With ``rdrop_alpha`` > 0 and the model in training mode, the loss is R-Drop's (Liang et al.
    2021, eq. 3), halved: every sentence goes through the model twice in one batch (so two
    dropout masks), and loss = ½(CE₁ + CE₂) + (α/4)·(KL(P₁‖P₂) + KL(P₂‖P₁)), summed over the
    tokens; NLL is ½(NLL₁ + NLL₂) and the token count that of one copy, so that the loss per
    token stays comparable with plain training. This path always makes the logits whole.

    With ``guided`` = (layer, head, λ) and a batch's alignment ``align`` (B, T, S) (target piece t's
    distribution over the source pieces its word links name; :attr:`mtkit.training.batching.Batch.align`), the
    loss adds λ times the cross-entropy between that distribution and the attention of ``head`` of decoder
    ``layer``, summed over the target pieces that have links (Garg et al. 2019, eq. 4). In that layer's
    cross-attention, the term's gradient reaches only that head's queries and keys (no value, no output
    projection, no other head; the layers above it none).
    """

    def __init__(self, model: nn.Module, epsilon: float, pad_id: int, fuse_projection: bool | None = None,
                 rdrop_alpha: float = 0.0, kernels: KernelsName | Kernels = "auto",
                 guided: tuple[int, int, float] | None = None) -> None:
        super().__init__()
        self.kernels = select(kernels)
        self.model = model
        self.epsilon = epsilon
        self.pad_id = pad_id
        self.fuse_projection = fuse_projection
        self.rdrop_alpha = rdrop_alpha
        self.guided = guided

    def forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, align: Tensor | None = None
                ) -> tuple[Tensor, Tensor, int]:
        """src (B, S), tgt_in (B, T) (BOS first), tgt_out (B, T) (EOS last) -> (loss_sum, nll_sum, n_tokens);
        ``align`` (B, T, S): guided alignment's target (with ``guided``)."""
        if self.rdrop_alpha > 0 and self.model.training:
            return self._rdrop(src, tgt_in, tgt_out)
        memory, src_mask = self.model.encode(src)
        alignment_loss = None
        if self.guided is not None and align is not None:
            layer, head, weight = self.guided
            hidden, attention = self.model.decoder.forward_with_attention(tgt_in, memory, src_mask, layer, head)
            alignment_loss = weight * guided_alignment_loss(attention, align)
        else:
            hidden = self.model.decode(tgt_in, memory, src_mask)  # (B, T, d_model)
        loss_sum, nll_sum, n = self._translation_loss(hidden, tgt_out)
        return (loss_sum if alignment_loss is None else loss_sum + alignment_loss), nll_sum, n

    def _translation_loss(self, hidden: Tensor, tgt_out: Tensor) -> tuple[Tensor, Tensor, int]:
        fuse = self.fuse_projection
        if fuse is None:  # the fused loss knows no output bias (model.output_bias)
            fuse = self.kernels.fuse_projection(hidden.device.type) and self.model.output_projection.bias is None
        if fuse:
            return self.kernels.linear_label_smoothed_loss(hidden, self.model.output_projection.weight, tgt_out,
                                                           self.epsilon, self.pad_id)
        logits = self.model.logits(hidden)  # (B, T, V)
        return self.kernels.label_smoothed_loss(logits, tgt_out, self.epsilon, self.pad_id)

    def _rdrop(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> tuple[Tensor, Tensor, int]:
        B = src.size(0)
        memory, src_mask = self.model.encode(torch.cat([src, src]))  # (2B, S, d_model): two dropout masks
        logits = self.model.logits(self.model.decode(torch.cat([tgt_in, tgt_in]), memory, src_mask))  # (2B, T, V)
        target = torch.cat([tgt_out, tgt_out])  # (2B, T)
        ce, nll, n = self.kernels.label_smoothed_loss(logits, target, self.epsilon, self.pad_id)
        kl = self.kernels.symmetric_kl(logits[:B], logits[B:], tgt_out, self.pad_id)
        return 0.5 * ce + 0.25 * self.rdrop_alpha * kl, 0.5 * nll, n // 2

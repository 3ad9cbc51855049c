"""Teacher-forced log-probabilities of given targets, on padded id tensors (the tensor side of
``mtkit score``; lines, vocabularies and batching by tokens are :mod:`mtkit.engines.pair_scoring`'s).

log P(target | source) = Σ_t log P(y_t | y_<t, x), natural log, over the target's pieces and EOS,
with the model in eval mode (no dropout) and no label smoothing: the distribution greedy and beam
search draw from (an ensemble's as :class:`mtkit.decoding.ensemble.Ensemble` gives it), so a
translation they found scores here what search gave it before its length penalty.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from mtkit.config import BOS_ID, EOS_ID, PAD_ID
from mtkit.decoding.options import ScoringModel

# Log-probabilities are computed for at most this many (token, vocabulary entry) cells at a time:
# the (B, T, V) tensor of a whole batch would be V times its hidden states.
CHUNK_CELLS = 1 << 24


def _log_softmax_at(models: Sequence[ScoringModel], hidden: list[Tensor], targets: Tensor) -> Tensor:
    """log P(target) at N positions: hidden[m] (N, d_model_m) of each model, targets (N,) -> (N,) float32.

    One model: its log-softmax. Several: the log-softmax of the mean of their log-softmaxes, the
    distribution that :class:`mtkit.decoding.ensemble.Ensemble` gives search.
    """
    V = models[0].output_projection.out_features
    size = max(1, CHUNK_CELLS // V)
    out = []
    for start in range(0, targets.numel(), size):
        total = None
        for model, h in zip(models, hidden):
            lprobs = torch.log_softmax(model.logits(h[start : start + size]).float(), dim=-1)  # (n, V)
            total = lprobs if total is None else total + lprobs
        if len(models) > 1:
            total = torch.log_softmax(total / len(models), dim=-1)
        out.append(total.gather(1, targets[start : start + size].unsqueeze(1)).squeeze(1))  # (n,)
    return torch.cat(out) if out else targets.new_zeros(0, dtype=torch.float32)


def token_log_probs(models, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, pad_id: int = PAD_ID,
                    encoders: Sequence | None = None) -> Tensor:
    """Teacher-forced log-probabilities of the target tokens.

    Args:
        models: a :class:`mtkit.model.Transformer`, or a list of them (an ensemble with one
            target vocabulary); in eval mode, for scores without dropout.
        src: (B, S) source ids ending in EOS, padded with ``pad_id``.
        tgt_in: (B, T) decoder input, BOS first (``tgt_out`` shifted right), padded.
        tgt_out: (B, T) the tokens to score, EOS last, padded with ``pad_id``.
        encoders: per model, what encodes src (an object with ``encode``, as the engine's inference
            model, whose fused encoder is search's); None: the model itself.

    Returns:
        (B, T) float32: log P(tgt_out[b, t] | src[b], tgt_in[b, :t+1]), natural log; 0 at padding.
        Run it under ``torch.inference_mode()`` (and the precision's autocast); the log-softmax
        is in float32 whatever the autocast.
    """
    models = list(models) if isinstance(models, (list, tuple)) else [models]
    real = tgt_out != pad_id  # (B, T)
    hidden = []
    for model, encoder in zip(models, models if encoders is None else encoders):
        memory, src_mask = encoder.encode(src)  # (B, S, d_model), (B, 1, 1, S)
        hidden.append(model.decode(tgt_in, memory, src_mask)[real])  # (N, d_model): real positions only
    picked = _log_softmax_at(models, hidden, tgt_out[real])  # (N,)
    out = torch.zeros(tgt_out.shape, dtype=torch.float32, device=tgt_out.device)
    out[real] = picked
    return out


def pad_pairs(pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
              start: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(source ids, target ids) pairs, without BOS/EOS -> src (B, S), tgt_in (B, T), tgt_out (B, T),
    as training builds them (EOS after the source; BOS, or ``start``: a target-side tag, before the
    target, EOS after it)."""
    B = len(pairs)
    S = max(len(s) for s, _ in pairs) + 1
    T = max(len(t) for _, t in pairs) + 1
    src = torch.full((B, S), PAD_ID, dtype=torch.long)
    tgt_in = torch.full((B, T), PAD_ID, dtype=torch.long)
    tgt_out = torch.full((B, T), PAD_ID, dtype=torch.long)
    for row, (s, t) in enumerate(pairs):
        src[row, : len(s) + 1] = torch.tensor([*s, EOS_ID])
        tgt_in[row, : len(t) + 1] = torch.tensor([BOS_ID if start is None else start, *t])
        tgt_out[row, : len(t) + 1] = torch.tensor([*t, EOS_ID])
    return src, tgt_in, tgt_out

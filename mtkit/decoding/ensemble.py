"""Several models with one target vocabulary, decoded as one: a model to :mod:`mtkit.decoding.search`.

An :class:`Ensemble` follows the model's decoding protocol (``encode``, ``init_cache``,
``decode_step`` and a cache with ``reorder`` / ``select_sentences``), so search needs
no ensemble-specific code. That the models share one vocabulary is the caller's to check
(:func:`mtkit.checkpoints.io.check_one_vocabulary`): here there are only ids.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


class EnsembleCache:
    """The caches of an ensemble's models, reordered and shrunk together."""

    def __init__(self, caches: list) -> None:
        self.caches = caches

    @property
    def step(self) -> int:
        return self.caches[0].step

    def reorder(self, indices: Tensor) -> EnsembleCache:
        return EnsembleCache([c.reorder(indices) for c in self.caches])

    def select_sentences(self, sentences: Tensor) -> EnsembleCache:
        return EnsembleCache([c.select_sentences(sentences) for c in self.caches])


class Ensemble:
    """Several models with one target vocabulary, decoded as one.

    The next-token distribution is the average of the models' log-probabilities
    (a normalized geometric mean of their distributions); fairseq instead
    averages probabilities. ``decode_step`` returns the averaged log-probabilities
    as its "logits"; search renormalizes them with its log-softmax.
    """

    def __init__(self, models: Sequence) -> None:
        if not models:
            raise ValueError("an ensemble needs at least one model")
        self.models = list(models)

    def encode(self, src: Tensor) -> tuple[list[Tensor], Tensor]:
        """src (B, S) -> each model's memory (B, S, d_model_i) and the common mask (B, 1, 1, S)."""
        outputs = [m.encode(src) for m in self.models]
        return [memory for memory, _ in outputs], outputs[0][1]

    def init_cache(self, memory: list[Tensor], src_mask: Tensor, beam: int = 1) -> EnsembleCache:
        return EnsembleCache([m.init_cache(mem, src_mask, beam) for m, mem in zip(self.models, memory)])

    def decode_step(self, tokens: Tensor, cache: EnsembleCache) -> tuple[Tensor, EnsembleCache]:
        """tokens (N,) -> mean log-probabilities (N, V) and the new cache."""
        total, caches = None, []
        for model, model_cache in zip(self.models, cache.caches):
            logits, model_cache = model.decode_step(tokens, model_cache)
            lprobs = torch.log_softmax(logits.float(), dim=-1)
            total = lprobs if total is None else total + lprobs
            caches.append(model_cache)
        return total / len(self.models), EnsembleCache(caches)

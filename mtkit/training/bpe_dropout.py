"""BPE-dropout (Provilkov et al., 2020, "BPE-Dropout: Simple and Effective Subword Regularization").

Every time a training sentence is read, it is segmented afresh with each BPE merge skipped
with probability ``p``, so that the model sees many segmentations of the same words (a
regularizer that helps most on small corpora). Validation, test and translation keep the
deterministic segmentation, as in the paper.

The prepared store holds the deterministic ids. A sentence is decoded back to its text
(lossless for SentencePiece) and encoded again with SentencePiece's sampling; sentences
with an unknown piece, and sampled segmentations longer than the model's positions, keep
their stored ids.

Sampled segmentations are longer (notably so at p = 0.1 with an 8k vocabulary). So
that a batch still holds about ``max_tokens`` real tokens, the batch sampler sees the stored
lengths scaled by the mean growth measured on a sample of training sentences at start-up
(:meth:`BPEDropout.growth`); the trainer averages it over ranks and saves it in checkpoints.

Reproducibility: SentencePiece's sampler cannot be seeded reproducibly across processes
(``set_random_generator_seed`` with the same seed gave a different segmentation in each of
three processes with sentencepiece 0.2.3), so the segmentations are not part of the exact
resume: a resumed run reads the same batches of the same sentences, with the same weights,
optimizer state and dropout masks, but draws other segmentations than an uninterrupted run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mtkit.config import UNK_ID
from mtkit.data.vocab import Vocab
from mtkit.errors import MtkitError

GROWTH_SAMPLE = 1000  # training sentences sampled once at start-up to measure the growth


class BPEDropout:
    """Re-segments the sentences of a batch with BPE-dropout ``p`` (one instance per training process)."""

    def __init__(self, vocab: Vocab, p: float, seed: int, max_len: int = 1 << 30, tags: Sequence[int] = (),
                 tag_side: str = "src") -> None:
        """``tags``: a multilingual store's target-language tag ids, which lead its sources (or its targets:
        ``tag_side`` "tgt") and stay as they are."""
        if not 0.0 < p < 1.0:
            raise MtkitError(f"train.bpe_dropout must be in (0, 1), got {p}")
        for side in ("src", "tgt"):
            kind = vocab.model_type(side)
            if kind not in ("bpe", None):
                raise MtkitError(f"train.bpe_dropout needs a BPE SentencePiece model; the {side} model is {kind}"
                                 " (data.spm.model_type: bpe)")
        self.vocab = vocab
        self.p = p
        self.seed = seed  # of the growth sample
        self.max_len = max_len
        self.tags = frozenset(int(t) for t in tags)
        self.tag_side = tag_side

    def _resegment(self, side: str, sentences: Sequence[np.ndarray]) -> list:
        decode = self.vocab.decode_src if side == "src" else self.vocab.decode_tgt
        todo = [i for i, ids in enumerate(sentences) if UNK_ID not in ids]
        # A leading tag is kept as it is: decoded and encoded again, it could gain a separate "▁" piece.
        lead = [[int(sentences[i][0])] if side == self.tag_side and self.tags and len(sentences[i]) and
                int(sentences[i][0]) in self.tags else [] for i in todo]
        sampled = self.vocab.sample_batch(side, [decode(sentences[i][len(k):]) for i, k in zip(todo, lead)], self.p)
        out = list(sentences)
        for i, k, ids in zip(todo, lead, sampled):
            if len(ids) + len(k) <= self.max_len:
                out[i] = k + list(ids)
        return out

    def __call__(self, srcs: Sequence[np.ndarray], tgts: Sequence[np.ndarray]) -> tuple[list, list]:
        """New segmentations of one batch's source and target ids (lists of id sequences)."""
        return self._resegment("src", srcs), self._resegment("tgt", tgts)

    def growth(self, store) -> tuple[float, float]:
        """Mean length growth (source, target) of sampled over stored segmentations, on a seeded
        sample of up to GROWTH_SAMPLE sentences."""
        n = len(store)
        if n == 0:
            return 1.0, 1.0
        rows = np.random.default_rng(self.seed).choice(n, size=min(n, GROWTH_SAMPLE), replace=False)
        srcs = [store.src(int(i)) for i in rows]
        tgts = [store.tgt(int(i)) for i in rows]
        new_srcs, new_tgts = self(srcs, tgts)
        ratio = lambda new, old: sum(map(len, new)) / max(1, sum(map(len, old)))  # noqa: E731
        return ratio(new_srcs, srcs), ratio(new_tgts, tgts)


def scaled_lengths(lengths: np.ndarray, growth: float) -> np.ndarray:
    """Stored lengths scaled by ``growth``, rounded up: what the batch sampler budgets for."""
    return np.ceil(lengths.astype(np.float64) * growth).astype(lengths.dtype)

"""Forced decoding: the log-probability of a given translation under a model (or an ensemble).

fairseq (``fairseq-generate --score-reference``), Marian (``marian-scorer``), Sockeye
(``sockeye-score``), CTranslate2 (``score_batch``) and JoeyNMT score a given target for
reranking, corpus filtering and debugging; so does ``mtkit score``. The score of a pair is
log P(target | source) = Σ_t log P(y_t | y_<t, x), natural log, over the target's pieces and
EOS, with the model in eval mode (no dropout) and no label smoothing: the distribution greedy
and beam search draw from, so a translation they found scores here what search gave it
before its length penalty (``mtkit translate --alpha 0 --format scores``).

* :func:`mtkit.decoding.forced.token_log_probs` is the teacher-forced pass on padded id tensors;
* :class:`PairScorer` (here) turns lines into :class:`PairScore` objects: it encodes a chunk of
  pairs, sorts them by length, cuts token-budget batches and gives the scores back in input
  order, one per pair, always (an empty pair scores EOS given an empty source).

Not to be confused with :mod:`mtkit.metrics.files` (sacreBLEU scores of hypothesis files).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from mtkit.checkpoints.io import check_one_vocabulary
from mtkit.data.languages import decoder_prefix, decoder_start, for_config
from mtkit.data.vocab import check_text
from mtkit.decoding.forced import pad_pairs, token_log_probs
from mtkit.engines.inference import InferenceModel
from mtkit.engines.precision import autocast, check_precision
from mtkit.errors import MtkitError

logger = logging.getLogger(__name__)


@dataclass
class PairScore:
    """The score of input pair ``index`` (0-based): ``logprob`` the sum over its ``tokens`` target
    tokens (pieces + EOS); NaN when the model cannot hold the pair (see :class:`PairScorer`)."""

    index: int
    logprob: float
    tokens: int

    @property
    def mean(self) -> float:
        """The per-token mean log-probability."""
        return self.logprob / self.tokens


class PairScorer:
    """Line pairs in, one :class:`PairScore` per pair out, in input order.

    Args:
        models: a LoadedModel-like (``.model``, ``.vocab``, ``.path``) or a list of them (an
            ensemble; they must share one vocabulary).
        device: ``cpu``, ``cuda`` or ``cuda:N``; the models are moved there.
        precision: ``fp32``, or ``bf16``/``fp16`` autocast for the model (the log-softmax stays fp32).
        batch_tokens: a batch holds at most this many padded tokens of its longer side
            (rows × max(source, target) length, with EOS; at least one pair).

    A pair whose source or target (with EOS) is longer than the model's position table cannot
    be scored: it gets NaN and a warning naming its line (on the ``mtkit`` logger) (truncating it would report the score
    of another sentence).
    """

    def __init__(self, models, device: str = "cpu", precision: str = "fp32", batch_tokens: int = 4000) -> None:
        loaded = list(models) if isinstance(models, (list, tuple)) else [models]
        if not loaded:
            raise MtkitError("no model to score with")
        first = loaded[0]
        check_one_vocabulary(loaded)
        if batch_tokens < 1:
            raise MtkitError(f"batch_tokens must be >= 1, got {batch_tokens}")
        self.device = torch.device(device)
        check_precision(precision, self.device.type, "precision")
        self.vocab = first.vocab  # a multilingual model's untagged vocabulary; vocab_for(target) tags it
        self.config = getattr(first, "config", None)
        self.precision = precision
        self.batch_tokens = batch_tokens
        self.models = [m.model.to(self.device).eval() for m in loaded]
        self.encoders = [InferenceModel(m) for m in self.models]  # the encoder pass search runs (packed once)
        self.max_len = min(m.cfg.max_positions for m in self.models)  # tokens with EOS, on either side

    def vocab_for(self, target: str | None = None):
        """The vocabulary that encodes pairs for ``target`` (a multilingual model's target language;
        None: its only one, or a single-pair model's): tagged as the model was trained."""
        if self.config is None:
            return self.vocab
        return for_config(self.vocab, self.config, target)

    # ------------------------------------------------------------------ ids

    def batches(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[int]]:
        """Indices of ``pairs`` in length-sorted batches of at most ``batch_tokens`` padded tokens."""
        width_of = [max(len(s), len(t)) + 1 for s, t in pairs]
        order = sorted(range(len(pairs)), key=lambda i: -width_of[i])
        batches, current, width = [], [], 0
        for i in order:
            new_width = max(width, width_of[i])
            if current and new_width * (len(current) + 1) > self.batch_tokens:
                batches.append(current)
                current, new_width = [], width_of[i]
            current.append(i)
            width = new_width
        if current:
            batches.append(current)
        return batches

    def score_ids(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], target: str | None = None) -> list[float]:
        """Σ log P(target + EOS | source) of each (source ids, target ids) pair, without BOS/EOS,
        in the order given; every pair must fit the model (see :attr:`max_len`). ``target``: the
        language whose tag starts the decoder, for a model with target-side tags."""
        vocab = self.vocab_for(target)
        if decoder_prefix(vocab):
            raise MtkitError("scoring a model whose decoder reads a forced language code (an NLLB import, "
                             "data.tag_side: codes) is not supported")
        start = decoder_start(vocab)
        sums = [0.0] * len(pairs)
        with torch.inference_mode(), autocast(self.precision, self.device.type):
            for batch in self.batches(pairs):
                padded = pad_pairs([pairs[i] for i in batch], start)
                src, tgt_in, tgt_out = (x.to(self.device) for x in padded)
                totals = token_log_probs(self.models, src, tgt_in, tgt_out, encoders=self.encoders).sum(dim=1)  # (B,)
                for i, total in zip(batch, totals.tolist()):
                    sums[i] = total
        return sums

    # ---------------------------------------------------------------- lines

    def score(self, pairs: Iterable[tuple[str, str]], chunk_size: int = 1000,
              target: str | None = None) -> Iterator[PairScore]:
        """Score (source line, target line) pairs, ``chunk_size`` pairs at a time (never the whole
        input); one :class:`PairScore` per pair, in input order. ``target``: a multilingual model's
        target language (:meth:`vocab_for`). Nothing of the scorer changes, so several threads may
        score at once."""
        vocab = self.vocab_for(target)
        chunk: list[tuple[str, str]] = []
        start = 0
        for pair in pairs:
            chunk.append(pair)
            if len(chunk) >= max(1, chunk_size):
                yield from self._score_chunk(chunk, start, vocab, target)
                start += len(chunk)
                chunk = []
        if chunk:
            yield from self._score_chunk(chunk, start, vocab, target)

    def _score_chunk(self, lines: list[tuple[str, str]], start: int, vocab, target: str | None) -> Iterator[PairScore]:
        for i, (s, t) in enumerate(lines):  # not Unicode text: SentencePiece cannot encode it
            check_text(s, f"line {start + i + 1}: source")
            check_text(t, f"line {start + i + 1}: target")
        srcs = vocab.encode_src_batch([s for s, _ in lines])
        tgts = vocab.encode_tgt_batch([t for _, t in lines])
        fits = []
        for i, (s, t) in enumerate(zip(srcs, tgts)):
            lengths = (("source", len(s) + 1), ("target", len(t) + 1))
            too_long = [f"{side} has {n} tokens with EOS" for side, n in lengths if n > self.max_len]
            if too_long:
                logger.info(f"warning: line {start + i + 1}: {' and '.join(too_long)}, more than the model's "
                         f"max_positions ({self.max_len}); its score is nan")
            else:
                fits.append(i)
        sums = self.score_ids([(srcs[i], tgts[i]) for i in fits], target)
        logprob = [math.nan] * len(lines)
        for i, total in zip(fits, sums):
            logprob[i] = total
        for i, t in enumerate(tgts):
            yield PairScore(start + i, logprob[i], len(t) + 1)

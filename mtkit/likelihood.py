"""Forced decoding: the log-probability of a given translation under a model (or an ensemble).

fairseq (``fairseq-generate --score-reference``), Marian (``marian-scorer``), Sockeye
(``sockeye-score``), CTranslate2 (``score_batch``) and JoeyNMT score a given target for
reranking, corpus filtering and debugging; so does ``mtkit score``. The score of a pair is
log P(target | source) = Σ_t log P(y_t | y_<t, x), natural log, over the target's pieces and
EOS, with the model in eval mode (no dropout) and no label smoothing: the distribution greedy
and beam search draw from, so a translation they found scores here what search gave it
before its length penalty (``mtkit translate --alpha 0 --format scores``).

* :func:`token_log_probs` is the teacher-forced pass on padded id tensors;
* :class:`PairScorer` turns lines into :class:`PairScore` objects: it encodes a chunk of
  pairs, sorts them by length, cuts token-budget batches and gives the scores back in input
  order, one per pair, always (an empty pair scores EOS given an empty source).

Not to be confused with :mod:`mtkit.scoring` (sacreBLEU scores of hypothesis files).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mtkit.config import BOS_ID, EOS_ID, PAD_ID
from mtkit.data.languages import decoder_start
from mtkit.errors import MtkitError
from mtkit.runtime.ensemble import check_one_vocabulary
from mtkit.runtime.inference import InferenceModel
from mtkit.runtime.precision import check_precision

# Log-probabilities are computed for at most this many (token, vocabulary entry) cells at a time:
# the (B, T, V) tensor of a whole batch would be V times its hidden states.
CHUNK_CELLS = 1 << 24


def _log_softmax_at(models: Sequence, hidden: list[Tensor], targets: Tensor) -> Tensor:
    """log P(target) at N positions: hidden[m] (N, d_model_m) of each model, targets (N,) -> (N,) float32.

    One model: its log-softmax. Several: the log-softmax of the mean of their log-softmaxes, the
    distribution that :class:`mtkit.runtime.ensemble.Ensemble` gives search.
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
        encoders: per model, what encodes src (an object with ``encode``, as
            :class:`mtkit.runtime.inference.InferenceModel`, whose fused encoder is search's); None: the model.

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


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class PairScorer:
    """Line pairs in, one :class:`PairScore` per pair out, in input order.

    Args:
        models: a LoadedModel-like (``.model``, ``.vocab``, ``.path``) or a list of them (an
            ensemble; they must share one vocabulary).
        device: ``cpu``, ``cuda`` or ``cuda:N``; the models are moved there.
        precision: ``fp32``, or ``bf16``/``fp16`` autocast for the model (the log-softmax stays fp32).
        batch_tokens: a batch holds at most this many padded tokens of its longer side
            (rows × max(source, target) length, with EOS; at least one pair).
        log: where warnings go (stderr by default).

    A pair whose source or target (with EOS) is longer than the model's position table cannot
    be scored: it gets NaN and a warning naming its line (truncating it would report the score
    of another sentence).
    """

    def __init__(self, models, device: str = "cpu", precision: str = "fp32", batch_tokens: int = 4000,
                 log: Callable[[str], None] = _stderr) -> None:
        loaded = list(models) if isinstance(models, (list, tuple)) else [models]
        if not loaded:
            raise MtkitError("no model to score with")
        first = loaded[0]
        check_one_vocabulary(loaded)
        if batch_tokens < 1:
            raise MtkitError(f"batch_tokens must be >= 1, got {batch_tokens}")
        self.device = torch.device(device)
        check_precision(precision, self.device.type, "precision")
        self.vocab = first.vocab
        self.precision = precision
        self.batch_tokens = batch_tokens
        self.log = log
        self.models = [m.model.to(self.device).eval() for m in loaded]
        self.encoders = [InferenceModel(m) for m in self.models]  # the encoder pass search runs (packed once)
        self.max_len = min(m.cfg.max_positions for m in self.models)  # tokens with EOS, on either side

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

    def score_ids(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[float]:
        """Σ log P(target + EOS | source) of each (source ids, target ids) pair, without BOS/EOS,
        in the order given; every pair must fit the model (see :attr:`max_len`)."""
        from mtkit.runtime.precision import autocast

        sums = [0.0] * len(pairs)
        with torch.inference_mode(), autocast(self.precision, self.device.type):
            for batch in self.batches(pairs):
                padded = pad_pairs([pairs[i] for i in batch], decoder_start(self.vocab))
                src, tgt_in, tgt_out = (x.to(self.device) for x in padded)
                totals = token_log_probs(self.models, src, tgt_in, tgt_out, encoders=self.encoders).sum(dim=1)  # (B,)
                for i, total in zip(batch, totals.tolist()):
                    sums[i] = total
        return sums

    # ---------------------------------------------------------------- lines

    def score(self, pairs: Iterable[tuple[str, str]], chunk_size: int = 1000) -> Iterator[PairScore]:
        """Score (source line, target line) pairs, ``chunk_size`` pairs at a time (never the whole
        input); one :class:`PairScore` per pair, in input order."""
        chunk: list[tuple[str, str]] = []
        start = 0
        for pair in pairs:
            chunk.append(pair)
            if len(chunk) >= max(1, chunk_size):
                yield from self._score_chunk(chunk, start)
                start += len(chunk)
                chunk = []
        if chunk:
            yield from self._score_chunk(chunk, start)

    def _score_chunk(self, lines: list[tuple[str, str]], start: int) -> Iterator[PairScore]:
        from mtkit.data.vocab import check_text

        for i, (s, t) in enumerate(lines):  # not Unicode text: SentencePiece cannot encode it
            check_text(s, f"line {start + i + 1}: source")
            check_text(t, f"line {start + i + 1}: target")
        srcs = self.vocab.encode_src_batch([s for s, _ in lines])
        tgts = self.vocab.encode_tgt_batch([t for _, t in lines])
        fits = []
        for i, (s, t) in enumerate(zip(srcs, tgts)):
            lengths = (("source", len(s) + 1), ("target", len(t) + 1))
            too_long = [f"{side} has {n} tokens with EOS" for side, n in lengths if n > self.max_len]
            if too_long:
                self.log(f"warning: line {start + i + 1}: {' and '.join(too_long)}, more than the model's "
                         f"max_positions ({self.max_len}); its score is nan")
            else:
                fits.append(i)
        sums = self.score_ids([(srcs[i], tgts[i]) for i in fits])
        logprob = [math.nan] * len(lines)
        for i, total in zip(fits, sums):
            logprob[i] = total
        for i, t in enumerate(tgts):
            yield PairScore(start + i, logprob[i], len(t) + 1)

"""What search takes and gives: :class:`SearchOptions` (one frozen object per call), :class:`Hypothesis`,
and the model protocol that search calls (:class:`SearchModel`, :class:`SearchCache`).

A :class:`mtkit.model.Transformer` and a :class:`mtkit.decoding.ensemble.Ensemble` of them both follow
the protocol; search needs nothing else of a model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from torch import Tensor

from mtkit.config import DECODE_RANGES, DecodeConfig, check_decode


class SearchStopped(Exception):
    """A search whose :attr:`SearchOptions.should_stop` answered True, between two steps."""


@dataclass
class Hypothesis:
    """One output: ``tokens`` without BOS or EOS (nor a forced prefix), ``score`` = ``logprob / lp(len(tokens) + 1)``
    (``lp(len(prefix) + len(tokens) + 1)`` with :attr:`SearchOptions.prefix`)."""

    tokens: list[int]
    score: float
    logprob: float


@dataclass(frozen=True)
class SearchOptions:
    """How to search, per call (fairseq's ``Search`` settings, CTranslate2's ``translate_batch`` arguments).

    The fields shared with :class:`mtkit.config.DecodeConfig` mean what they mean there; the others are
    set by the engine that calls search:

    * ``max_len_limit``: a cap on the output length (e.g. the model's position table), None for none;
    * ``min_len``: EOS is banned before this many tokens;
    * ``start``: the decoder's first input (None: BOS; a multilingual model's target-side tag);
    * ``prefix``: tokens forced after ``start``, each of log-probability 0, left out of the hypotheses' tokens
      but counted in their length for the length penalty and the maximum length (Hugging Face's
      ``forced_bos_token_id``: NLLB's decoder reads ``</s>``, then the target language's code);
    * ``should_stop``: asked before every step (None: never); when it answers True the search raises
      :class:`SearchStopped` (a caller's deadline, or a caller that no longer wants the result).

    ``beam`` and ``nbest`` are for beam search, ``temperature``, ``top_k``, ``top_p`` and ``epsilon`` for sampling;
    greedy search reads neither (``alpha`` and ``length_penalty`` only score its output).
    """

    beam: int = 4
    nbest: int = 1
    alpha: float = 0.6
    length_penalty: Literal["gnmt", "power"] = "gnmt"
    max_len_a: float = 1.0
    max_len_b: int = 50
    max_len_limit: int | None = None
    min_len: int = 0
    no_repeat_ngram_size: int = 0
    forced_eos: Literal["logprob", "zero"] = "logprob"
    start: int | None = None
    prefix: tuple[int, ...] = ()
    sampling: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    epsilon: float = 0.0
    should_stop: Callable[[], bool] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        """The config's rules for the fields it shares (nbest <= beam among them): a ConfigError."""
        check_decode({name: getattr(self, name) for name in (*DECODE_RANGES, "sampling") if hasattr(self, name)})

    def check_stop(self) -> None:
        """Raise :class:`SearchStopped` when ``should_stop`` says so (search calls it before every step)."""
        if self.should_stop is not None and self.should_stop():
            raise SearchStopped("the search was told to stop")

    @classmethod
    def from_decode(cls, decode: DecodeConfig, **overrides: Any) -> SearchOptions:
        """The options of ``decode``'s search fields (its batching fields are not search's), with ``overrides``
        (any field, e.g. ``max_len_limit=``, ``min_len=``, ``start=``) on top."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {f.name: getattr(decode, f.name) for f in dataclasses.fields(decode) if f.name in names}
        return cls(**{**values, **overrides})


class SearchCache(Protocol):
    """A decoder cache: rows ``i*beam .. i*beam+beam-1`` belong to sentence ``i``."""

    def reorder(self, rows: Tensor) -> SearchCache:
        """The cache of rows ``rows`` (N',) of this one (beam search's parents)."""
        ...

    def select_sentences(self, sentences: Tensor) -> SearchCache:
        """The cache of sentences ``sentences`` (B',) only, each with all its rows."""
        ...


class SearchModel(Protocol):
    """What greedy, sampling and beam search call on a model."""

    def encode(self, src: Tensor) -> tuple[Any, Tensor]:
        """src (B, S) -> (memory, src_mask): whatever ``init_cache`` takes, and the mask (B, 1, 1, S)."""
        ...

    def init_cache(self, memory: Any, src_mask: Tensor, beam: int = 1) -> SearchCache:
        """A cache of ``beam`` rows per sentence, the encoder's keys and values computed once."""
        ...

    def decode_step(self, tokens: Tensor, cache: Any) -> tuple[Tensor, SearchCache]:
        """tokens (N,), one per cache row -> logits (N, V) of the next token, and the cache one step on."""
        ...


class ScoringModel(Protocol):
    """What teacher-forced scoring (:mod:`mtkit.decoding.forced`) calls on a model."""

    output_projection: Any  # its ``out_features`` is the target vocabulary size V

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> memory (B, S, d_model), src_mask (B, 1, 1, S)."""
        ...

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """tgt_in (B, T) -> the decoder's hidden states (B, T, d_model)."""
        ...

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden (N, d_model) -> logits (N, V)."""
        ...

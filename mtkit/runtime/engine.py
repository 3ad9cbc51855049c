"""The engines' common pipeline: lines in, one :class:`Translation` per line out, in input order.

An engine (:class:`mtkit.runtime.torch_engine.Translator`,
:class:`mtkit.runtime.ctranslate2_engine.Ctranslate2Translator`) supplies
:meth:`LineTranslator.search_batch`; :class:`LineTranslator`:

* reads its input lazily, ``buffer_size`` lines at a time (never the whole input),
  or what a pipe has delivered so far when it has no more ready (a None in the lines,
  see :func:`mtkit.translate.read_ready_lines`);
* encodes a chunk, sorts it by length, cuts token-budget batches
  (``decode.batch_tokens`` padded source tokens per batch; beam rows come on top),
  and yields the results in input order;
* yields exactly one :class:`Translation` per input line: an empty (or all-blank)
  line gives an empty translation without running the model, and an input longer
  than ``decode.max_input_len`` tokens (or than the model's position table) is
  truncated with a warning on stderr naming its line number, never dropped;
* with ``constraints`` (:mod:`mtkit.runtime.constraints`), gives the lines that have some to the
  engine's :meth:`LineTranslator.search_constrained_batch`, and warns, naming the line, when a
  best translation lacks an ``include`` phrase (it did not fit in the maximum output length); an
  include phrase the model cannot write (a character outside its vocabulary) is not forced, is
  unmet on every line that has it (``Translation.unwritable`` says why) and is warned about once;
* refuses a line holding a lone surrogate (not Unicode text; SentencePiece cannot encode it) with
  a one-line error naming the line.

No torch at load time: the CTranslate2 engine never loads it (CTranslate2 runs several
times slower once torch's OpenMP runtime is loaded and used in the same process).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from mtkit.config import EOS_ID, DecodeConfig
from mtkit.errors import MtkitError
from mtkit.runtime.constraints import ConstraintSource, PieceConstraints, encode_constraints, unmet


@dataclass
class Candidate:
    """One hypothesis: target ids (no BOS/EOS), its text, pieces and score."""

    ids: list[int]
    text: str
    pieces: list[str]
    score: float


@dataclass
class Translation:
    """The result for input line ``index`` (0-based): ``candidates``, best first (at least one)."""

    index: int
    source: str
    src_ids: list[int]  # as fed to the model (truncated, ending in EOS); empty for an empty line
    candidates: list[Candidate] = field(default_factory=list)
    unmet: list[str] = field(default_factory=list)  # include phrases the best candidate lacks (as written)
    # include phrases (as given, also in ``unmet``) that the model cannot write, so never forced -> why
    unwritable: dict[str, str] = field(default_factory=dict)

    @property
    def best(self) -> Candidate:
        return self.candidates[0]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class LineTranslator:
    """Lines in, :class:`Translation` objects out, in input order; engines supply :meth:`search_batch`.

    Args:
        vocab: a :class:`mtkit.data.vocab.Vocab` (``encode_src_batch``, ``decode_tgt``, ``tgt_pieces``).
        decode: the decoding settings.
        max_positions: the model's position table size, bounding input and output lengths.
        log: where warnings go (stderr by default).
    """

    def __init__(self, vocab, decode: DecodeConfig, max_positions: int | None = None,
                 log: Callable[[str], None] = _stderr) -> None:
        if decode.batch_tokens < 1:
            raise MtkitError("decode.batch_tokens must be positive")
        if decode.max_input_len < 2:
            raise MtkitError("decode.max_input_len must be at least 2 (one token and EOS)")
        if not 1 <= decode.nbest <= max(decode.beam, 1) and not decode.sampling:
            raise MtkitError("decode: need 1 <= decode.nbest <= decode.beam")
        self.vocab = vocab
        self.decode = decode
        self.log = log
        self.max_src_len = decode.max_input_len if max_positions is None else min(decode.max_input_len, max_positions)
        self.max_out_len = None if max_positions is None else max_positions - 1
        self._warned_max_len = False
        self._warned_unwritable: set[str] = set()

    # ------------------------------------------------------------------ engine

    def search_batch(self, batch: list[list[int]]) -> list[list[tuple[list[int], float]]]:
        """Source ids (each ending in EOS) -> per sentence, (target ids, score) pairs, best first."""
        raise NotImplementedError

    def search_constrained_batch(self, batch: list[list[int]], constraints: list[PieceConstraints | None]
                                 ) -> list[list[tuple[list[int], float]]]:
        """As :meth:`search_batch`, each sentence with its constraints (None: none)."""
        raise MtkitError(f"{type(self).__name__} cannot translate with constraints")

    # ---------------------------------------------------------------- pipeline

    def translate(self, lines: Iterable[str | None], buffer_size: int = 1000,
                  constraints: ConstraintSource | None = None) -> Iterator[Translation]:
        """Translate ``lines`` (text without newlines), reading ``buffer_size`` lines at a time.

        Yields one :class:`Translation` per line, in input order, a chunk at a time;
        with ``buffer_size=1`` each line is yielded as soon as it is translated. A None
        in ``lines`` (see :func:`read_ready_lines`) ends the chunk early. ``constraints``
        gives each line's constraints, called in input order with (0-based index, line).
        """
        buffer_size = max(1, buffer_size)
        chunk: list[str] = []
        start = 0
        for line in lines:
            if line is not None:
                chunk.append(line)
            if chunk and (line is None or len(chunk) >= buffer_size):
                yield from self._translate_chunk(chunk, start, constraints)
                start += len(chunk)
                chunk = []
        if chunk:
            yield from self._translate_chunk(chunk, start, constraints)

    def translate_text(self, lines: Sequence[str], constraints: ConstraintSource | None = None) -> list[str]:
        """Convenience: the best translation of each line."""
        return [t.best.text for t in self.translate(lines, constraints=constraints)]

    def _encode(self, lines: list[str], start: int) -> list[list[int]]:
        from mtkit.data.vocab import check_text

        for i, line in enumerate(lines):
            check_text(line, f"line {start + i + 1}")
        encoded = self.vocab.encode_src_batch(lines)
        out = []
        for i, ids in enumerate(encoded):
            if not ids:
                out.append([])
                continue
            if len(ids) + 1 > self.max_src_len:
                self.log(f"warning: line {start + i + 1}: {len(ids) + 1} source tokens (with EOS), "
                         f"truncated to {self.max_src_len} (decode.max_input_len or the model's max_positions)")
                ids = ids[: self.max_src_len - 1]
            out.append(list(ids) + [EOS_ID])
            self._check_max_len(len(ids) + 1, start + i + 1)
        return out

    def _check_max_len(self, src_len: int, number: int) -> None:
        """Warn, once, when the maximum output length a·S + b leaves a line a single token."""
        d = self.decode
        if self._warned_max_len or int(d.max_len_a * src_len + d.max_len_b) >= 1:
            return
        self._warned_max_len = True
        self.log(f"warning: line {number}: the maximum output length max_len_a·S + max_len_b = "
                 f"{d.max_len_a:g}·{src_len} + {d.max_len_b} is below 1, so its output is cut to one token "
                 "(see --max-len-a/--max-len-b); other such lines are not reported")

    def batches(self, src: list[list[int]]) -> list[list[int]]:
        """Indices of the non-empty sentences in length-sorted batches of at most
        ``decode.batch_tokens`` padded source tokens (at least one sentence each)."""
        order = sorted((i for i, ids in enumerate(src) if ids), key=lambda i: -len(src[i]))
        batches, current, width = [], [], 0
        for i in order:
            new_width = max(width, len(src[i]))
            if current and new_width * (len(current) + 1) > self.decode.batch_tokens:
                batches.append(current)
                current, new_width = [], len(src[i])
            current.append(i)
            width = new_width
        if current:
            batches.append(current)
        return batches

    def _translate_chunk(self, lines: list[str], start: int,
                         source: ConstraintSource | None = None) -> Iterator[Translation]:
        src = self._encode(lines, start)
        wanted = [None] * len(lines) if source is None else [
            encode_constraints(source(start + i, line), self.vocab) for i, line in enumerate(lines)]
        results: list[list[tuple[list[int], float]]] = [[([], 0.0)] for _ in lines]
        for batch in self.batches(src):
            if any(wanted[i] for i in batch):
                found = self.search_constrained_batch([src[i] for i in batch], [wanted[i] for i in batch])
            else:
                found = self.search_batch([src[i] for i in batch])
            for i, hyps in zip(batch, found):
                results[i] = hyps or [([], 0.0)]
        for i, line in enumerate(lines):
            candidates = [
                Candidate(ids, self.vocab.decode_tgt(ids), self.vocab.tgt_pieces(ids), score)
                for ids, score in results[i]
            ]
            missing = unmet(wanted[i], candidates[0].text)
            if missing:
                self._warn_unmet(start + i + 1, missing, wanted[i], len(src[i]))
            unwritable = dict(wanted[i].unwritable) if wanted[i] is not None else {}
            for phrase, why in unwritable.items():
                if phrase not in self._warned_unwritable:
                    self._warned_unwritable.add(phrase)
                    self.log(f"warning: line {start + i + 1}: include phrase {phrase!r}: {why} "
                             "(later lines with it are not reported)")
            yield Translation(start + i, line, src[i], candidates, missing + list(unwritable), unwritable)

    def _warn_unmet(self, number: int, missing: list[str], wanted: PieceConstraints, src_len: int) -> None:
        d = self.decode
        limit = max(1, int(d.max_len_a * src_len + d.max_len_b))
        limit = limit if self.max_out_len is None else max(1, min(limit, self.max_out_len))
        why = (f"{wanted.include_pieces} constraint pieces, more than the maximum output length of {limit}"
               if wanted.include_pieces > limit else f"not met within the maximum output length of {limit} pieces")
        if src_len == 0:
            why = "an empty line is not translated"
        self.log(f"warning: line {number}: the translation lacks {', '.join(map(repr, missing))} ({why})")

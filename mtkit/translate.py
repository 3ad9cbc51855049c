"""Translating lines of text: batching, order, alignment and output formats.

:class:`Translator` runs mtkit's own search (:mod:`mtkit.search`) on one model
or an ensemble; :class:`mtkit.export.ctranslate2.Ctranslate2Translator` runs an
exported model in CTranslate2. Both share :class:`LineTranslator`, which:

* reads its input lazily, ``buffer_size`` lines at a time (never the whole input),
  or what a pipe has delivered so far when it has no more ready (:func:`read_ready_lines`);
* encodes a chunk, sorts it by length, cuts token-budget batches
  (``decode.batch_tokens`` padded source tokens per batch; beam rows come on top),
  and yields the results in input order;
* yields exactly one :class:`Translation` per input line: an empty (or all-blank)
  line gives an empty translation without running the model, and an input longer
  than ``decode.max_input_len`` tokens (or than the model's position table) is
  truncated with a warning on stderr naming its line number, never dropped.

This module imports no torch at load time, so that the CTranslate2 path never
loads it (CTranslate2 runs several times slower once torch's OpenMP runtime is
loaded and used in the same process).

Output formats (:func:`format_translation`), one line per input line unless noted:

    text    the detokenized translation (default)
    tokens  the SentencePiece pieces, space-separated
    scores  ``SCORE<TAB>text``, SCORE the length-normalized log-probability (4 decimals)
    nbest   ``decode.nbest`` lines per input line, best first:
            ``INDEX ||| text ||| SCORE``, INDEX the 0-based input line number
            (as in Moses, fairseq and Marian n-best lists); an input with fewer
            distinct hypotheses repeats its last one, so every input has exactly
            ``nbest`` lines.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import IO, Callable, Iterable, Iterator, Sequence

from mtkit.config import EOS_ID, DecodeConfig
from mtkit.errors import MtkitError

OUTPUT_FORMATS = ("text", "tokens", "scores", "nbest")
PRECISIONS = ("fp32", "bf16", "fp16")

# Characters that str.splitlines() (and many tools) treat as line breaks: never
# let one into an output line, or the output would lose its alignment.
_LINE_BREAKS = {c: " " for c in (0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x85, 0x2028, 0x2029)}


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

    @property
    def best(self) -> Candidate:
        return self.candidates[0]


def _decode_line(raw: bytes) -> str:
    """One line (with its ``\\n``, if any) as text: invalid UTF-8 becomes U+FFFD and only the
    line ending (``\\n`` or ``\\r\\n``) is stripped."""
    line = raw.decode("utf-8", errors="replace")
    if line.endswith("\n"):
        line = line[:-1]
        if line.endswith("\r"):
            line = line[:-1]
    return line


def read_text_lines(stream: IO[bytes]) -> Iterator[str]:
    """Lines of a binary stream as text (see :func:`_decode_line`), so the line count is
    exactly ``wc -l``'s (plus an unterminated last line)."""
    for raw in stream:
        yield _decode_line(raw)


def read_ready_lines(fd: int, before_wait: Callable[[], None] | None = None,
                     chunk_size: int = 1 << 16) -> Iterator[str | None]:
    """Lines of a pipe or terminal as they arrive, and None whenever no more input is ready.

    :meth:`LineTranslator.translate` translates what it holds at a None, so a program that
    writes one line and waits for its answer gets it, while a pipe that keeps up still
    fills whole chunks. ``before_wait`` runs before blocking for more input (the command
    flushes its output there). Reads with ``os.read``: a buffered reader would hold back
    lines it has already read.
    """
    import os
    import select

    pending = bytearray()
    while True:
        ready, _, _ = select.select([fd], [], [], 0)
        if not ready:
            yield None
            if before_wait is not None:
                before_wait()
        data = os.read(fd, chunk_size)
        if not data:
            break
        start = len(pending)
        pending += data
        end = pending.find(b"\n", start)
        if end < 0:
            continue
        begin = 0
        while end >= 0:
            yield _decode_line(bytes(pending[begin : end + 1]))
            begin = end + 1
            end = pending.find(b"\n", begin)
        del pending[:begin]
    if pending:
        yield _decode_line(bytes(pending))


def clean_output(text: str) -> str:
    """``text`` with any line-break character replaced by a space."""
    return text.translate(_LINE_BREAKS)


def format_translation(t: Translation, output_format: str = "text", nbest: int = 1) -> list[str]:
    """The output lines (without newline) of one translation; see the module docstring."""
    best = t.best
    if output_format == "text":
        return [clean_output(best.text)]
    if output_format == "tokens":
        return [clean_output(" ".join(best.pieces))]
    if output_format == "scores":
        return [f"{best.score:.4f}\t{clean_output(best.text)}"]
    if output_format == "nbest":
        cands = list(t.candidates[:nbest])
        cands += [cands[-1]] * (nbest - len(cands))
        return [f"{t.index} ||| {clean_output(c.text)} ||| {c.score:.4f}" for c in cands]
    raise MtkitError(f"unknown output format {output_format!r}; expected one of {', '.join(OUTPUT_FORMATS)}")


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

    # ------------------------------------------------------------------ engine

    def search_batch(self, batch: list[list[int]]) -> list[list[tuple[list[int], float]]]:
        """Source ids (each ending in EOS) -> per sentence, (target ids, score) pairs, best first."""
        raise NotImplementedError

    # ---------------------------------------------------------------- pipeline

    def translate(self, lines: Iterable[str | None], buffer_size: int = 1000) -> Iterator[Translation]:
        """Translate ``lines`` (text without newlines), reading ``buffer_size`` lines at a time.

        Yields one :class:`Translation` per line, in input order, a chunk at a time;
        with ``buffer_size=1`` each line is yielded as soon as it is translated. A None
        in ``lines`` (see :func:`read_ready_lines`) ends the chunk early.
        """
        buffer_size = max(1, buffer_size)
        chunk: list[str] = []
        start = 0
        for line in lines:
            if line is not None:
                chunk.append(line)
            if chunk and (line is None or len(chunk) >= buffer_size):
                yield from self._translate_chunk(chunk, start)
                start += len(chunk)
                chunk = []
        if chunk:
            yield from self._translate_chunk(chunk, start)

    def translate_text(self, lines: Sequence[str]) -> list[str]:
        """Convenience: the best translation of each line."""
        return [t.best.text for t in self.translate(lines)]

    def _encode(self, lines: list[str], start: int) -> list[list[int]]:
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

    def _translate_chunk(self, lines: list[str], start: int) -> Iterator[Translation]:
        src = self._encode(lines, start)
        results: list[list[tuple[list[int], float]]] = [[([], 0.0)] for _ in lines]
        for batch in self.batches(src):
            for i, hyps in zip(batch, self.search_batch([src[i] for i in batch])):
                results[i] = hyps or [([], 0.0)]
        for i, line in enumerate(lines):
            candidates = [
                Candidate(ids, self.vocab.decode_tgt(ids), self.vocab.tgt_pieces(ids), score)
                for ids, score in results[i]
            ]
            yield Translation(start + i, line, src[i], candidates)


class Translator(LineTranslator):
    """mtkit's own engine: one model, or an ensemble of models sharing one vocabulary.

    Args:
        models: a LoadedModel-like (``.model``, ``.vocab``) or a list of them (an ensemble).
        decode: the decoding settings (beam, alpha, lengths, sampling ...).
        device: ``cpu``, ``cuda`` or ``cuda:N``; the models are moved there.
        precision: ``fp32``, or ``bf16``/``fp16`` under autocast (fp16 needs CUDA).
        seed: the sampling seed (the same input and batch give the same samples).
        min_len: EOS is banned before this many output tokens (0: never; benchmarks force lengths with it).
    """

    def __init__(self, models, decode: DecodeConfig, device: str = "cpu", precision: str = "fp32",
                 seed: int = 1, log: Callable[[str], None] = _stderr, min_len: int = 0) -> None:
        import torch

        loaded = list(models) if isinstance(models, (list, tuple)) else [models]
        if not loaded:
            raise MtkitError("no model to translate with")
        first = loaded[0]
        for other in loaded[1:]:
            if other.vocab.model_bytes() != first.vocab.model_bytes():
                raise MtkitError(f"{getattr(other, 'path', 'a model')}: an ensemble needs one vocabulary, "
                                 f"and it differs from {getattr(first, 'path', 'the first model')}'s")
        if precision not in PRECISIONS:
            raise MtkitError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
        self.device = torch.device(device)
        if precision == "fp16" and self.device.type != "cuda":
            raise MtkitError("precision fp16 needs a CUDA device; use bf16 on CPU")
        max_positions = min(getattr(getattr(m.model, "cfg", None), "max_positions", 1 << 30) for m in loaded)
        super().__init__(first.vocab, decode, max_positions, log)
        self.precision = precision
        self.min_len = min_len
        self.models = [m.model.to(self.device).eval() for m in loaded]
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        if len(self.models) == 1:
            self.model = self.models[0]
        else:
            from mtkit.search import Ensemble

            self.model = Ensemble(self.models)

    def search_batch(self, batch: list[list[int]]) -> list[list[tuple[list[int], float]]]:
        import torch

        from mtkit import search
        from mtkit.config import PAD_ID
        from mtkit.training.precision import autocast

        d = self.decode
        width = max(len(ids) for ids in batch)
        src = torch.full((len(batch), width), PAD_ID, dtype=torch.long)
        for row, ids in enumerate(batch):
            src[row, : len(ids)] = torch.tensor(ids)
        src = src.to(self.device)
        common = dict(max_len_a=d.max_len_a, max_len_b=d.max_len_b, alpha=d.alpha, penalty=d.length_penalty,
                      no_repeat_ngram_size=d.no_repeat_ngram_size, max_len_limit=self.max_out_len,
                      min_len=self.min_len)
        with torch.inference_mode(), autocast(self.precision, self.device.type):
            if d.sampling:
                n = d.nbest
                found = search.sample(self.model, src.repeat_interleave(n, dim=0), d.temperature, d.top_k,
                                      d.top_p, self.generator, **common)
                hyps = [sorted((h for s in found[i * n : (i + 1) * n] for h in s), key=lambda h: -h.score)
                        for i in range(len(batch))]
            elif d.beam == 1:
                hyps = search.greedy_search(self.model, src, **common)
            else:
                hyps = search.beam_search(self.model, src, beam=d.beam, nbest=d.nbest, **common)
        return [[(h.tokens, h.score) for h in sentence] for sentence in hyps]

"""Translating lines of text: reading input lines and output formats.

The engines (:mod:`mtkit.engines`, loaded through :func:`mtkit.api.load`) turn lines into
:class:`mtkit.engines.engine.Translation` objects, one per input line, in input order; this module reads
the lines they take (:func:`read_text_lines`, :func:`read_ready_lines`) and formats what they give
(:func:`format_translation`).

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
    json    one JSON object per input line: ``line`` (1-based), ``text``, ``score``, ``logprob`` (log P of the
            translation and its EOS, nats), ``confidence`` (the mean log-probability per token, EOS included:
            the model's own quality estimate, as the server's ``confidence``), ``tokens`` (the pieces),
            ``nbest`` (``decode.nbest`` hypotheses, best first, each with text, score, logprob, confidence and
            tokens) and ``unmet`` (include phrases the translation lacks); a number that is not finite is null,
            and an empty line has no hypothesis (its numbers null, as the server answers it); with splitting or the
            guard on (``--split sentences``, ``--guard``: the defaults), ``sentences``: each sentence's ``source``
            and ``text`` and the guard's ``repaired``, ``missing`` and ``loop`` (:mod:`mtkit.text.pipeline`).

With ``--alignments`` (:mod:`mtkit.data.word_alignment`), each hypothesis's word alignment in the Pharaoh
format (``0-0 1-2``: 0-based source word - target word, words the whitespace tokens of the input line and of
the output), as Marian prints it: ``text ||| 0-0 1-2`` in ``text``, a last field ``||| 0-0 1-2`` of each
``nbest`` line, a key ``alignment`` (a list of [source, target] pairs) of each ``json`` hypothesis;
``--alignments-out FILE`` writes the best one's there instead, a line per input line.

With ``--qe`` (:mod:`mtkit.engines.quality`), each translation's quality estimate: ``text<TAB>QE`` (4 decimals,
empty for an empty line) in ``text``, a key ``qe`` in ``json``.
"""

from __future__ import annotations

import json
import math
import os
import select
from collections.abc import Callable, Iterator
from typing import IO

from mtkit.data.word_alignment import pharaoh
from mtkit.engines.engine import Translation
from mtkit.errors import MtkitError
from mtkit.io import STDIN_NAME, decode_line

OUTPUT_FORMATS = ("text", "tokens", "scores", "nbest", "json")

# Characters that str.splitlines() (and many tools) treat as line breaks: never
# let one into an output line, or the output would lose its alignment.
_LINE_BREAKS = {c: " " for c in (0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x85, 0x2028, 0x2029)}


def _decode_line(raw: bytes, name: str, number: int) -> str:
    """Line ``number`` (with its ``\\n``, if any) of ``name`` as text, only the line ending (``\\n`` or
    ``\\r\\n``) stripped; invalid UTF-8 is a :class:`MtkitError` naming the input and the line, as
    ``prepare`` and ``evaluate`` have it (never a silent U+FFFD in a translation or a score)."""
    line = decode_line(raw, name, number)
    if line.endswith("\n"):
        line = line[:-1]
        if line.endswith("\r"):
            line = line[:-1]
    return line


def read_text_lines(stream: IO[bytes], name: str = STDIN_NAME) -> Iterator[str]:
    """Lines of a binary stream (``name``: what messages call it) as text (see :func:`_decode_line`),
    so the line count is exactly ``wc -l``'s (plus an unterminated last line)."""
    for number, raw in enumerate(stream, start=1):
        yield _decode_line(raw, name, number)


def read_ready_lines(fd: int, before_wait: Callable[[], None] | None = None,
                     chunk_size: int = 1 << 16, name: str = STDIN_NAME) -> Iterator[str | None]:
    """Lines of a pipe or terminal as they arrive, and None whenever no more input is ready.

    :meth:`Engine.translate` translates what it holds at a None, so a program that
    writes one line and waits for its answer gets it, while a pipe that keeps up still
    fills whole chunks. ``before_wait`` runs before blocking for more input (the command
    flushes its output there). Reads with ``os.read``: a buffered reader would hold back
    lines it has already read.
    """
    pending = bytearray()
    number = 0
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
            number += 1
            yield _decode_line(bytes(pending[begin : end + 1]), name, number)
            begin = end + 1
            end = pending.find(b"\n", begin)
        del pending[:begin]
    if pending:
        yield _decode_line(bytes(pending), name, number + 1)


def clean_output(text: str) -> str:
    """``text`` with any line-break character replaced by a space, and no whitespace at either end
    (a last piece ``▁`` would leave a trailing space)."""
    return text.translate(_LINE_BREAKS).strip()


def _number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _hypothesis(c, alignments: bool) -> dict:
    """One hypothesis as the json format writes it."""
    found = {"text": clean_output(c.text), "score": _number(c.score), "logprob": _number(c.logprob),
             "confidence": _number(c.mean_logprob), "tokens": list(c.pieces)}
    if alignments and c.alignment is not None:
        found["alignment"] = [list(pair) for pair in c.alignment]
    return found


def _aligned(text: str, c, alignments: bool) -> str:
    """``text``, and `` ||| `` with the Pharaoh alignment of ``c`` when it has one (and ``alignments``)."""
    if not alignments or c.alignment is None:
        return text
    return f"{text} ||| {pharaoh(c.alignment)}".rstrip()


def format_translation(t: Translation, output_format: str = "text", nbest: int = 1, qe: bool = False,
                       quality: float | None = None, alignments: bool = True, sentences: list | None = None
                       ) -> list[str]:
    """The output lines (without newline) of one translation; see the module docstring. ``qe``: with its
    quality estimate ``quality`` (:mod:`mtkit.engines.quality`), a column of ``text``, a key of ``json``.
    ``alignments``: with the candidates' word alignments, where they have them (False: written elsewhere).
    ``sentences``: json's key ``sentences``, each sentence's report (:func:`mtkit.text.pipeline.sentence_reports`),
    or None: no such key."""
    best = t.best
    if output_format == "text":
        if qe:
            return [f"{_aligned(clean_output(best.text), best, alignments)}\t"
                    f"{'' if quality is None else f'{quality:.4f}'}"]
        return [_aligned(clean_output(best.text), best, alignments)]
    if output_format == "tokens":
        return [clean_output(" ".join(best.pieces))]
    if output_format == "scores":
        return [f"{best.score:.4f}\t{clean_output(best.text)}"]
    if output_format == "nbest":
        cands = list(t.candidates[:nbest])
        cands += [cands[-1]] * (nbest - len(cands))
        return [_aligned(f"{t.index} ||| {clean_output(c.text)} ||| {c.score:.4f}", c, alignments) for c in cands]
    if output_format == "json":
        # an empty line: no hypothesis
        hypotheses = [_hypothesis(c, alignments) for c in t.candidates[:nbest]] if t.src_ids else []
        best = hypotheses[0] if hypotheses else {"text": "", "score": None, "logprob": None, "confidence": None,
                                                 "tokens": []}
        if not hypotheses and alignments and t.best.alignment is not None:
            best["alignment"] = []
        extra = {"qe": None if quality is None else _number(quality)} if qe else {}
        if sentences is not None:
            extra["sentences"] = sentences
        return [json.dumps({"line": t.index + 1, **best, "nbest": hypotheses, "unmet": list(t.unmet), **extra},
                           ensure_ascii=False)]
    raise MtkitError(f"unknown output format {output_format!r}; expected one of {', '.join(OUTPUT_FORMATS)}")

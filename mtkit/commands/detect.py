"""``mtkit detect``: the language of each line of a text (:mod:`mtkit.langid`, lingua).

Writes one line per input line to stdout, in input order: ``LANG<TAB>CONFIDENCE``, LANG an ISO 639-1
code, CONFIDENCE lingua's confidence in it on a 0-100 scale with one decimal (LibreTranslate's scale, as
``POST /detect`` answers); an empty line for a line without letters (empty, digits, punctuation), so
that output line N is always input line N's. The candidates are ``--languages`` (default
:data:`mtkit.langid.COMMON`): a line in another language gets the closest of them.

Each line is judged on its first :data:`mtkit.langid.PREFIX_CHARS` characters, and only they
are kept: the rest of a line is read in pieces of :data:`PIECE_BYTES` (and checked to be UTF-8), so a
gigabyte without a newline costs no more memory than a paragraph. Lines are detected
:data:`CHUNK_LINES` at a time, and each chunk's answers written before the next is read. Invalid
UTF-8 is an error naming the input and the line, after the lines before it have been written.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from mtkit import langid
from mtkit.errors import MtkitError
from mtkit.io import STDIN_NAME, open_binary, standard_input, standard_output

CHUNK_LINES = 256
PIECE_BYTES = 1 << 16


@dataclass(frozen=True)
class DetectOptions:
    """What ``mtkit detect`` takes besides its input (the CLI's flags)."""

    languages: tuple[str, ...] = langid.COMMON  # the candidates (ISO 639-1)


def parse_languages(value: str | None) -> tuple[str, ...]:
    """``--languages en,de,fr`` as codes (None: the default set); an empty list is an error."""
    if value is None:
        return langid.COMMON
    codes = tuple(code.strip() for code in value.split(",") if code.strip())
    if not codes:
        raise MtkitError("--languages: give ISO 639-1 codes separated by commas, e.g. en,de,fr")
    return codes


def bounded_lines(stream: IO[bytes], name: str, keep: int = langid.PREFIX_CHARS) -> Iterator[str]:
    """Each line of ``stream`` (its line ending stripped), only its first ``keep`` characters; the whole line
    is checked to be UTF-8 (an error naming ``name`` and the line), read in pieces of :data:`PIECE_BYTES`."""
    number = 0
    while True:
        piece = stream.readline(PIECE_BYTES)
        if not piece:
            return
        number += 1
        decoder = codecs.getincrementaldecoder("utf-8")()
        kept, seen = [], 0
        while True:
            ends = piece.endswith(b"\n")
            try:
                text = decoder.decode(piece, final=ends or len(piece) < PIECE_BYTES)
            except UnicodeDecodeError as e:
                raise MtkitError(f"{name}: line {number}: invalid UTF-8 (byte {seen + e.start + 1} of the "
                                 "line)") from None
            if sum(len(k) for k in kept) < keep:
                kept.append(text)
            seen += len(piece)
            if ends or len(piece) < PIECE_BYTES:
                break
            piece = stream.readline(PIECE_BYTES)
            if not piece:
                decoder.decode(b"", final=True)
                break
        line = "".join(kept)
        if line.endswith("\n"):
            line = line[:-1].removesuffix("\r")
        yield line[:keep]


def format_detection(found: list[tuple[str, float]]) -> str:
    """One output line (without newline): ``LANG<TAB>CONFIDENCE``, or empty when nothing was detected."""
    if not found:
        return ""
    code, value = found[0]
    return f"{code}\t{100 * value:.1f}"


def detect(path: str, options: DetectOptions) -> None:
    """Write the language of each line of ``path`` (``-``: stdin) to stdout (see the module's docstring)."""
    candidates = langid.candidates_of(options.languages, "--languages")  # checked before any reading
    out = standard_output()
    if path == "-":
        _detect_stream(standard_input(), STDIN_NAME, candidates, out)
        return
    with open_binary(path, stream=True) as f:
        _detect_stream(f, path, candidates, out)


def _detect_stream(stream: IO[bytes], name: str, candidates: tuple[str, ...], out: IO[bytes]) -> None:
    chunk: list[str] = []

    def flush() -> None:
        for found in langid.detect(chunk, candidates):
            out.write(format_detection(found).encode() + b"\n")
        out.flush()
        chunk.clear()

    try:
        for line in bounded_lines(stream, name):
            chunk.append(line)
            if len(chunk) == CHUNK_LINES:
                flush()
    finally:  # the lines before an error are answered
        if chunk:
            flush()

"""Sentence splitting inside a line: a paragraph on one line becomes sentences, each translated alone, and the
translations are joined with the line's own whitespace between them.

:func:`sentence_spans` gives the (start, end) character offsets of each sentence: in order, without overlap,
each without leading or trailing whitespace, together covering every character of the line that is not
whitespace; ``line[end_i:start_{i+1}]`` is the whitespace between two sentences (empty between sentences of
a script written without spaces, e.g. ``今日は晴れです。明日は雨です。``).

The boundaries are sentencex's (Wikimedia's rule-based splitter, in Rust: many languages, each with its
abbreviations and a fallback chain to English; see docs/real-text.md for the comparison with pysbd), read
through windows (:data:`WINDOW` characters) so that no line costs more than time linear in its length,
however long or hostile. Two rules are mtkit's own: a boundary between two characters that are not
whitespace is kept only after a full stop of a script without spaces (``。``), so that ``example.com`` or
``v1.2.3`` never come apart, and a piece without a letter or a digit (a lone ``...``, ``*``) stays with the
sentence before it.
"""

from __future__ import annotations

import logging

import sentencex

logger = logging.getLogger(__name__)

# A window of the line handed to the splitter at once: a paragraph of ordinary length fits in one, and a
# longer line is read window after window, each boundary judged with MARGIN characters of context or more
# on both sides (boundaries in a window's last MARGIN characters wait for the next window, which starts at
# the last boundary kept), so that the time is linear in the line's length whatever the splitter's own cost.
WINDOW = 8192
MARGIN = 512

# Full stops of scripts written without spaces between sentences: a boundary right after one needs no space.
_NO_SPACE_STOPS = frozenset("。．｡！？!?")


def sentence_spans(line: str, lang: str | None = None) -> list[tuple[int, int]]:
    """The sentences of ``line`` as (start, end) character offsets, in order.

    Args:
        line: one line of text (a paragraph, a sentence, or blank); any ``str``.
        lang: the text's language as an ISO 639-1 code (``"de"``, ``"pt-BR"``); None or a code the splitter
            does not know: English rules.

    Returns:
        One (start, end) per sentence, ``line[start:end]`` without leading or trailing whitespace; [] for a
        blank line. A line that cannot be read as UTF-8 (a lone surrogate) is one sentence.
    """
    first = len(line) - len(line.lstrip())
    last = len(line.rstrip())
    if first >= last:
        return []
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # the splitter takes UTF-8 only: a lone surrogate keeps the line whole
        return [(first, last)]
    cuts = _cuts(line, _language(lang))
    return _spans(line, cuts)


def _language(lang: str | None) -> str:
    """``"pt-BR"`` -> ``"pt"``; None or an empty code -> ``"en"`` (sentencex falls back to English for a code
    it does not know)."""
    code = (lang or "").strip().lower().replace("_", "-").split("-")[0]
    return code if code.isascii() and code.isalpha() else "en"


def _cuts(line: str, lang: str) -> list[int]:
    """The positions where the splitter ends a sentence (0 < cut < len(line)), read window by window."""
    cuts: list[int] = []
    start, settled = 0, True  # settled: the window starts at a boundary (or the line's start)
    n = len(line)
    while start < n:
        end = min(start + WINDOW, n)
        found = _boundaries(line[start:end], lang)
        low = 0 if settled else MARGIN  # a boundary needs context on its left too
        high = end - start if end == n else end - start - MARGIN
        kept = [start + b for b in found if low < b < high and _acceptable(line, start + b)]
        if end == n:
            cuts.extend(kept)
            break
        if kept:
            cuts.extend(kept)
            start, settled = kept[-1], True
        else:  # no boundary before the margin: go on with the next window, overlapping this one by 2 margins
            start, settled = end - 2 * MARGIN, False
    return cuts


def _boundaries(text: str, lang: str) -> list[int]:
    """The splitter's sentence ends in ``text`` (character offsets, the text's end left out)."""
    try:
        found = sentencex.get_sentence_boundaries(lang, text)
    except Exception:  # the splitter failing on some text never fails a translation: the window stays whole
        logger.debug("sentencex failed on a window of %d characters", len(text), exc_info=True)
        return []
    return [b["end_index"] for b in found[:-1]]


def _acceptable(line: str, cut: int) -> bool:
    """A boundary lies at whitespace, or right after a full stop of a script without spaces."""
    before, after = line[cut - 1], line[cut]
    return before.isspace() or after.isspace() or (
        before in _NO_SPACE_STOPS and not (after.isascii() and after.isalnum()))


def _spans(line: str, cuts: list[int]) -> list[tuple[int, int]]:
    """The pieces between the cuts, without their whitespace; a piece without a letter or a digit joins the one
    before it (or, first in the line, the one after it)."""
    spans: list[tuple[int, int]] = []
    orphan: int | None = None  # the start of leading pieces without a word, waiting for one
    bounds = [0, *sorted(set(cuts)), len(line)]
    for a, b in zip(bounds, bounds[1:]):
        piece = line[a:b]
        lead = len(piece) - len(piece.lstrip())
        s, e = a + lead, a + len(piece.rstrip())
        if s >= e:
            continue
        if not any(c.isalnum() for c in line[s:e]):
            if spans:
                spans[-1] = (spans[-1][0], e)
            elif orphan is None:
                orphan = s
            continue
        if orphan is not None:
            s, orphan = orphan, None
        spans.append((s, e))
    if orphan is not None:  # no piece has a word: the line is one sentence
        spans.append((orphan, len(line.rstrip())))
    return spans

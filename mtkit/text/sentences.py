"""Sentence splitting inside a line: a paragraph on one line becomes sentences, each translated alone, and the
translations are joined with the line's own whitespace between them.

:func:`sentence_spans` gives the (start, end) character offsets of each sentence: in order, without overlap,
each without leading or trailing whitespace, together covering every character of the line that is not
whitespace; ``line[end_i:start_{i+1}]`` is the whitespace between two sentences (empty between sentences of
a script written without spaces, e.g. ``今日は晴れです。明日は雨です。``).

The boundaries are sentencex's (Wikimedia's rule-based splitter, in Rust: many languages, each with its
abbreviations, and English rules for a language it lacks; docs/real-text.md compares it with pysbd), read
through windows (:data:`WINDOW`) so that a line costs time linear in its length, however long or hostile.
mtkit adds a few rules of its own, each for a kind of mistake sentencex makes on the hand-written cases of
benchmarks/data/sentence_split.tsv or on joined Multi30k captions:

* ``…`` reads as ``...`` (sentencex takes the one character for no full stop at all), and whitespace beyond
  ASCII as a space (:data:`WIDE_SPACES`: sentencex panics on some);
* no boundary after a title before a name (:data:`TITLES`: ``M. Dupont``, ``Dr. Leroy`` in French) or a
  capital initial (``J. Smith``), nor after a reference word before its number (:data:`NUMBERED`:
  ``vol. 2``, ``Hauptstr. 5``);
* a boundary after a sentence closed inside brackets when a capital follows (``(He was tired.) We``), and
  after a word of five letters or more and its full stop when a number follows (``Landschaft. 2 Mädchen``,
  which sentencex leaves joined in German and Czech);
* a boundary between two characters that are not whitespace only after a full stop of a script written
  without spaces (``。``), so that ``example.com`` or ``v1.2.3`` never come apart;
* no boundary after a full stop when a small letter follows (``3 févr. au soir``: an abbreviation sentencex
  does not know);
* a piece without a letter or a digit (a lone ``...``, ``*``) stays with the sentence before it, an item's
  number (``2.``, ``(b)``) with the sentence after it.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import re

import sentencex

logger = logging.getLogger(__name__)

# A window of the line handed to sentencex at once: a paragraph of ordinary length fits in one, and a longer
# line is read window after window, each boundary judged with MARGIN characters of context or more on both
# sides (a boundary in a window's last MARGIN characters waits for the next window, which starts at the last
# boundary kept), so that the time is linear in the line's length whatever the splitter's own cost (which grows
# with the text at 。). Windows also bound sentencex's quotation pairing: it pairs an opening „ with the next “,
# however far, and splits nothing between them (a Polish „…” and a German „…“ pages apart).
WINDOW = 1024
MARGIN = 192

# Full stops of scripts written without spaces between sentences: a boundary right after one needs no space.
_NO_SPACE_STOPS = frozenset("。．｡！？!?")
# Titles written before a name, in the languages sentencex knows them in or not: never a sentence's end.
TITLES = frozenset({"Dr", "Mr", "Mrs", "Ms", "Messrs", "Prof", "Mme", "Mmes", "Mlle", "Mlles", "Mgr", "Amb",
                    "Gov", "Sen", "Rep", "Gen", "Col", "Lt", "Sgt", "Capt", "Cmdr", "Adm", "Rev", "Hon", "Pres",
                    "Fr", "Sr", "Sra", "Srta", "Sres", "Sig", "Hr", "Hrn", "Ing", "Mag", "Dipl"})
# Words that take a number after them (lowercased): ``vol. 2``, ``Nr. 5``, ``S. 12``; and ``...str. 5``.
NUMBERED = frozenset({"vol", "vols", "no", "nos", "nr", "nrs", "fig", "figs", "p", "pp", "ch", "chap", "art",
                      "abb", "sec", "eq", "tab", "bd", "s", "str", "č", "hl", "kap", "par", "ed"})
_OPENERS = "\"'“‘«„‚‹([{¿¡"
# A sentence closed inside brackets, a capital after it: ``(He was tired.) We``; the capital is checked apart.
_CLOSED_IN_BRACKETS = re.compile(r"[.!?…][\"'”’»]{0,3}[)\]](?=\s+[\"'“‘«„(]?(\w))")
# A long word, a full stop, a number: a sentence that begins with a digit, which sentencex leaves joined to the
# one before in German or Czech (``... Landschaft. 2 Mädchen ...``); no abbreviation is so long.
_WORD_BEFORE_NUMBER = re.compile(r"(?<![\w.])([^\W\d_]{5,})\.(?=\s+\d)")
_DIGIT_AFTER_STOP = re.compile(r"\.\s+\d")  # where _WORD_BEFORE_NUMBER can match: most lines have none
# Whitespace beyond ASCII, read as a space by sentencex: it panics on a capital, such a space and a full stop
# (``"vitamine C\u00a0."``, sentencex 1.0.32). One character for one, so that the offsets stay.
WIDE_SPACES = (0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000)
_WIDE_SPACE = re.compile("[" + "".join(map(chr, WIDE_SPACES)) + "]")
_LOOK_BACK = 24  # characters read before a boundary to find the word it follows
_LETTER_OR_DIGIT = re.compile(r"[^\W_]")
_ITEM_NUMBER = re.compile(r"\(?(?:\d{1,3}|[a-z]|[IVX]{1,4})[.)]")  # "2." "(b)" "IV.": joins the item after it
_ITEM_FIRST = frozenset("(0123456789IVXabcdefghijklmnopqrstuvwxyz")


def sentence_spans(line: str, lang: str | None = None) -> list[tuple[int, int]]:
    """The sentences of ``line`` as (start, end) character offsets, in order.

    Args:
        line: one line of text (a paragraph, a sentence, or blank); any ``str``.
        lang: the text's language as an ISO 639-1 code (``"de"``, ``"pt-BR"``); None or a code sentencex does
            not know: English rules.

    Returns:
        One (start, end) per sentence, ``line[start:end]`` without leading or trailing whitespace; [] for a
        blank line. A line that is no valid Unicode (a lone surrogate) is one sentence.
    """
    first = len(line) - len(line.lstrip())
    last = len(line.rstrip())
    if first >= last:
        return []
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # sentencex takes UTF-8 only: a lone surrogate keeps the line whole
        return [(first, last)]
    if not _LETTER_OR_DIGIT.search(line):  # no word: one sentence, whatever marks it holds
        return [(first, last)]
    cuts = {c for c in _cuts(line, _language(lang)) if _acceptable(line, c)}
    if ")" in line or "]" in line:
        cuts.update(m.end() for m in _CLOSED_IN_BRACKETS.finditer(line) if m.group(1).isupper())
    if _DIGIT_AFTER_STOP.search(line):
        cuts.update(m.end() for m in _WORD_BEFORE_NUMBER.finditer(line)
                    if m.group(1)[-1].islower() and not _numbered(m.group(1)))
    return _spans(line, sorted(cuts))


def _language(lang: str | None) -> str:
    """``"pt-BR"`` -> ``"pt"``; None or no code -> ``"en"`` (sentencex has English rules for a code it does not
    know)."""
    code = (lang or "").strip().lower().replace("_", "-").split("-")[0]
    return code if code.isascii() and code.isalpha() else "en"


def _cuts(line: str, lang: str) -> list[int]:
    """The positions where sentencex ends a sentence (0 < cut < len(line)), read window by window."""
    cuts: list[int] = []
    start, settled = 0, True  # settled: the window starts at a boundary (or the line's start)
    n = len(line)
    while True:
        end = min(start + WINDOW, n)
        found = _boundaries(line[start:end], lang)
        low = 0 if settled else MARGIN  # a boundary needs context on its left too
        high = end - start if end == n else end - start - MARGIN
        kept = [start + b for b in found if low < b < high]
        cuts.extend(kept)
        if end == n:
            return cuts
        if kept:
            start, settled = kept[-1], True
        else:  # no boundary before the margin: on to the next window, overlapping this one by two margins
            start, settled = end - 2 * MARGIN, False


def _boundaries(text: str, lang: str) -> list[int]:
    """sentencex's sentence ends in ``text`` (character offsets, the text's end left out), ``…`` read as
    ``...`` and any whitespace as a space."""
    ellipses = [i for i, c in enumerate(text) if c == "…"] if "…" in text else []
    read = _WIDE_SPACE.sub(" ", text)
    try:
        pieces = sentencex.segment(lang, read.replace("…", "...") if ellipses else read)
    except Exception:  # sentencex failing on some text never fails a translation: the window stays whole
        logger.debug("sentencex failed on a window of %d characters", len(text), exc_info=True)
        return []
    except BaseException as e:  # a panic in its Rust code (pyo3's PanicException is no Exception): the same
        if type(e).__name__ != "PanicException":
            raise
        logger.debug("sentencex panicked on a window of %d characters: %s", len(text), e)
        return []
    ends = list(itertools.accumulate(map(len, pieces[:-1])))
    if ellipses:  # back to the offsets of ``text``: each "..." read took two characters more than its "…"
        starts = [p + 2 * i for i, p in enumerate(ellipses)]  # where each "..." starts in the text read
        moved = []
        for e in ends:
            k = bisect.bisect_right(starts, e - 3)  # the "..." that end at or before e
            moved.append(ellipses[k] + 1 if k < len(starts) and starts[k] < e else e - 2 * k)
        ends = moved
    return ends


def _acceptable(line: str, cut: int) -> bool:
    """A boundary lies at whitespace (or right after a full stop of a script without spaces), and follows no
    title, initial or numbered reference word."""
    before, after = line[cut - 1], line[cut]
    if not (before.isspace() or after.isspace()):
        return before in _NO_SPACE_STOPS and not (after.isascii() and after.isalnum())
    seen = line[max(cut - _LOOK_BACK, 0):cut].rstrip()
    if not seen.endswith("."):
        return True
    word = seen.rsplit(None, 1)[-1]
    if len(word) == len(seen) and cut > _LOOK_BACK:  # a word longer than the look-back: no title
        return True
    word = word.lstrip(_OPENERS)
    stem = word[:-1]
    if stem in TITLES or (len(stem) == 1 and stem.isupper() and stem != "I"):  # "So am I." ends sentences
        return False
    following = line[cut:cut + _LOOK_BACK].lstrip().lstrip(_OPENERS)[:1]
    if following.islower():  # a full stop before a small letter ends a word, not a sentence: "févr. au soir"
        return False
    return not (_numbered(stem) and following.isdigit())


def _numbered(word: str) -> bool:
    """A word that takes a number after it, abbreviated: ``vol``, ``Nr``, ``Hauptstr``."""
    return word.lower() in NUMBERED or word.endswith("str") and word[:1].isupper()


def _spans(line: str, cuts: list[int]) -> list[tuple[int, int]]:
    """The pieces between the cuts, without their whitespace; a piece without a letter or a digit stays with the
    one before it (or, first in the line, with the one after it): a cut is kept with a letter or a digit both
    before it and between it and the next cut."""
    first = _LETTER_OR_DIGIT.search(line)
    ends = [*cuts[1:], len(line)]
    cuts = [c for c, e in zip(cuts, ends) if first and c > first.start() and _LETTER_OR_DIGIT.search(line, c, e)]
    bounds = [0, *cuts, len(line)]
    spans: list[tuple[int, int]] = []
    joined: int | None = None  # the start of an item's number, waiting for its item: "2." in "2. Pour it."
    for a, b in zip(bounds, bounds[1:]):
        start, end = a, b  # trimmed in place: a cut lies at whitespace, so a piece has little to trim
        while start < end and line[start].isspace():
            start += 1
        while end > start and line[end - 1].isspace():
            end -= 1
        if start == end:
            continue
        if joined is not None:
            start, joined = joined, None
        if end - start <= 5 and b < len(line) and line[start] in _ITEM_FIRST and _ITEM_NUMBER.fullmatch(
                line, start, end):
            joined = start
            continue
        spans.append((start, end))
    if joined is not None:  # no item after it (a kept cut has a word after it: never so)
        spans.append((joined, len(line.rstrip())))
    return spans

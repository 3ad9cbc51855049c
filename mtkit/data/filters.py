"""The filters of ``data.clean.filters``: tests on a normalized training pair that say why it should go.

Each filter is a function ``(source, target) -> str | None``: None keeps the pair, a string drops it and says
why, in a few words the report shows beside the example ("target is fr", "'the' 8 times in the source").
:func:`make_filters` builds the configured ones, in :data:`ORDER` (cheap tests first, language ID last);
the dual cross-entropy filter is no per-pair test but a ranking of the whole corpus by two models' scores,
read from files (:func:`dual_xent_keep`).
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from mtkit import langid as langid_module
from mtkit.config import FiltersConfig, LangIdFilter
from mtkit.errors import MtkitError, counted
from mtkit.io import read_lines

ORDER = ("nonprinting", "alpha", "repeats", "copy", "numbers", "urls", "langid", "dual_xent")

Filter = Callable[[str, str], "str | None"]

# Private use, unassigned, surrogates, format characters other than the joiners scripts need (ZWJ, ZWNJ)
# and the word joiner, C0/C1 controls (when normalization kept them), and U+FFFD (a decoder's replacement).
_ALLOWED_FORMAT = {"\u200c", "\u200d", "\u2060"}
_NUMBER = re.compile(r"\d+(?:[.,\u00a0\u202f' ]\d{3})*(?:[.,]\d+)?")
_NOT_LETTERS = re.compile(r"[\W\d_]+")  # what is left is letters (str.isalpha, in C)
_NOT_ALNUM = re.compile(r"[\W_]+")
_URL_HINT = re.compile(r"@|://|www\.", re.IGNORECASE)
_URL = re.compile(r"(?:https?://|www\.)[^\s<>\"']+|[\w.+-]+@[\w-]+(?:\.[\w-]+)+", re.IGNORECASE)


def _side(index: int) -> str:
    return ("source", "target")[index]


def nonprinting(src: str, tgt: str) -> str | None:
    """Drops a pair with a character that prints nothing a reader can use (see ``_ALLOWED_FORMAT``)."""
    for i, text in enumerate((src, tgt)):
        if text.isprintable() and "\ufffd" not in text:  # the common case, in C
            continue
        for ch in text:
            if ch == "\ufffd" or (unicodedata.category(ch) in ("Co", "Cn", "Cs", "Cc", "Cf")
                                  and ch not in _ALLOWED_FORMAT and ch != "\t"):
                return f"U+{ord(ch):04X} in the {_side(i)}"
    return None


def alpha(minimum: float) -> Filter:
    """Drops a pair where a side's letters are under ``minimum`` of its non-space characters."""

    def test(src: str, tgt: str) -> str | None:
        for i, text in enumerate((src, tgt)):
            chars = len(text) - text.count(" ")
            if chars and (letters := _letters(text)) < minimum * chars:
                return f"{_side(i)} {letters / chars:.0%} letters"
        return None

    return test


def repeats(maximum: int) -> Filter:
    """Drops a pair where a side has the same word (case aside) more than ``maximum`` times in a row."""

    def test(src: str, tgt: str) -> str | None:
        for i, text in enumerate((src, tgt)):
            run, last = 0, None
            for word in text.casefold().split():
                run = run + 1 if word == last else 1
                last = word
                if run > maximum:
                    return f"{word!r} over {maximum} times in a row in the {_side(i)}"
        return None

    return test


def _letters(text: str) -> int:
    return len(_NOT_LETTERS.sub("", text))


def _letters_digits(text: str) -> str:
    return _NOT_ALNUM.sub("", text.casefold())


def copy(min_chars: int) -> Filter:
    """Drops a pair whose target is its source, case, spaces and punctuation aside (``min_chars`` letters and
    digits or more)."""

    def test(src: str, tgt: str) -> str | None:
        s = _letters_digits(src)
        if len(s) >= min_chars and s == _letters_digits(tgt):
            return "target = source"
        return None

    return test


def _numbers(text: str) -> list[str]:
    return sorted(re.sub(r"\D", "", m) for m in _NUMBER.findall(text))


def numbers(src: str, tgt: str) -> str | None:
    """Drops a pair whose sides have different numbers (digit runs; thousands separators and the decimal
    mark aside, so 1,000.5 = 1.000,5)."""
    a, b = _numbers(src), _numbers(tgt)
    if a != b:
        return f"numbers {' '.join(a) or '(none)'} | {' '.join(b) or '(none)'}"
    return None


def urls(src: str, tgt: str) -> str | None:
    """Drops a pair whose sides have different URLs or e-mail addresses (case aside; a final . , ; : ) aside)."""
    if not (_URL_HINT.search(src) or _URL_HINT.search(tgt)):  # the common case, in C
        return None
    a, b = (sorted(u.rstrip(".,;:)").casefold() for u in _URL.findall(text)) for text in (src, tgt))
    if a != b:
        return f"URLs/e-mails {' '.join(a) or '(none)'} | {' '.join(b) or '(none)'}"
    return None


def _lingua_language(code: str, key: str) -> str:
    if not langid_module.available():
        raise MtkitError("data.clean.filters.langid: needs lingua (pip install 'mtkit[clean]')")
    return langid_module.check_code(code, key)


def langid(config: LangIdFilter, src_lang: str, tgt_lang: str) -> Filter:
    """Drops a pair whose source is identified as a language other than ``src_lang`` (or target, ``tgt_lang``),
    among those and ``config.languages`` (:mod:`mtkit.langid`); a side with fewer than ``config.min_chars``
    letters, or that lingua cannot tell, is kept."""
    src_code = _lingua_language(src_lang, "data.src_lang")
    tgt_code = _lingua_language(tgt_lang, "data.tgt_lang")
    codes = {src_code, tgt_code}
    codes.update(_lingua_language(x, "data.clean.filters.langid.languages") for x in config.languages)
    if len(codes) == 1:  # a same-language pair and no other candidate: nothing to tell apart
        return lambda src, tgt: None
    candidates, low = tuple(sorted(codes)), config.accuracy == "low"

    def test(src: str, tgt: str) -> str | None:
        for i, (text, want) in enumerate(((src, src_code), (tgt, tgt_code))):
            if _letters(text) < config.min_chars:
                continue
            found = langid_module.best(text, candidates, low)
            if found is not None and found != want:
                return f"{_side(i)} is {found}"
        return None

    return test


def check_filters(config: FiltersConfig | None, src_lang: str, tgt_lang: str) -> None:
    """What the filters need that settings alone do not tell, checked before any work: lingua installed, and
    knowing the languages."""
    if config is not None and config.langid is not None:
        _lingua_language(src_lang, "data.src_lang")
        _lingua_language(tgt_lang, "data.tgt_lang")
        for code in config.langid.languages:
            _lingua_language(code, "data.clean.filters.langid.languages")


def make_filters(config: FiltersConfig | None, src_lang: str, tgt_lang: str) -> list[tuple[str, Filter]]:
    """The configured per-pair filters as (name, test), in :data:`ORDER`."""
    if config is None:
        return []
    built: dict[str, Filter] = {}
    if config.nonprinting is not None:
        built["nonprinting"] = nonprinting
    if config.alpha is not None:
        built["alpha"] = alpha(config.alpha.min)
    if config.repeats is not None:
        built["repeats"] = repeats(config.repeats.max)
    if config.copy is not None:
        built["copy"] = copy(config.copy.min_chars)
    if config.numbers is not None:
        built["numbers"] = numbers
    if config.urls is not None:
        built["urls"] = urls
    if config.langid is not None:
        built["langid"] = langid(config.langid, src_lang, tgt_lang)
    return [(name, built[name]) for name in ORDER if name in built]


def filter_names(config: FiltersConfig | None) -> tuple[str, ...]:
    """The names of the configured filters, in :data:`ORDER` (dual_xent included)."""
    if config is None:
        return ()
    return tuple(name for name in ORDER if getattr(config, name) is not None)


# ---------------------------------------------------------------- dual cross-entropy


def read_scores(path: Path) -> np.ndarray:
    """The mean log-probability per token of each line of ``mtkit score``'s output (text or JSON), ``(N,)``
    float64; nan where the scorer gave nan. One line of error (file: line) for anything else."""
    if not path.exists():
        raise MtkitError(f"{path}: no such file (`mtkit score` output for data.train)")
    means: list[float] = []
    # a regular file's lines (a FIFO, /dev/zero refused), UTF-8: otherwise one line naming the file
    for number, line in enumerate(read_lines(path), 1):
        try:
            if line.startswith("{"):
                value = json.loads(line)["mean"]
                value = math.nan if value is None else float(value)
            else:
                fields = line.split("\t")
                if len(fields) != 3:
                    raise ValueError
                value = float(fields[1])
        except (ValueError, KeyError, TypeError, RecursionError):
            raise MtkitError(f"{path}: line {number}: not a line of `mtkit score` output "
                             "(LOGPROB<TAB>MEAN<TAB>TOKENS, or its JSON)") from None
        if math.isinf(value) or value > 0:
            raise MtkitError(f"{path}: line {number}: a mean log-probability must be <= 0, not {value}")
        means.append(value)
    return np.asarray(means, dtype=np.float64)


def dual_xent_scores(forward: np.ndarray, backward: np.ndarray) -> np.ndarray:
    """Junczys-Dowmunt (2018), eq. 2 without the exp: |H_f - H_b| + (H_f + H_b) / 2, where H is the negated mean
    log-probability per token of the target under the forward model and of the source under the backward one.
    Lower is better; a nan (a pair the models could not score) is worst (inf)."""
    h_f, h_b = -forward, -backward
    score = np.abs(h_f - h_b) + 0.5 * (h_f + h_b)
    return np.where(np.isnan(score), np.inf, score)


def dual_xent_keep(forward: Path, backward: Path, keep: float) -> tuple[np.ndarray, np.ndarray]:
    """Which pairs the dual cross-entropy filter keeps, ``(N,)`` bool: the best ``keep`` share (ties broken by
    position), and their scores ``(N,)``."""
    f, b = read_scores(forward), read_scores(backward)
    if len(f) != len(b):
        raise MtkitError(f"data.clean.filters.dual_xent: {forward} has {counted(len(f), 'line')}, {backward} {len(b)}; "
                         "both score every pair of data.train")
    score = dual_xent_scores(f, b)
    order = np.argsort(score, kind="stable")
    mask = np.zeros(len(score), dtype=bool)
    mask[order[: round(keep * len(score))]] = True
    return mask, score


def with_dual_xent(items: Iterator, mask: np.ndarray, score: np.ndarray, where: str) -> Iterator:
    """Each item of ``items`` with its (kept, score), in order; errors when the counts differ."""
    n = 0
    for n, item in enumerate(items, 1):
        if n > len(mask):
            raise MtkitError(f"{where}: scores {counted(len(mask), 'pair')}, but data.train has more")
        yield item, (bool(mask[n - 1]), float(score[n - 1]))
    if n != len(mask):
        raise MtkitError(f"{where}: scores {counted(len(mask), 'pair')}, but data.train has {n}")

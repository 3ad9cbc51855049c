"""Sentence splitters compared: the share of lines split exactly right and lines/s, per splitter and test set.

    .venv/bin/python benchmarks/sentence_split.py [--multi30k DIR] [--repeat 3] [--hostile]

Splitters: ``mtkit`` (:func:`mtkit.text.sentences.sentence_spans`: sentencex through windows, plus mtkit's own
rules), ``sentencex`` and ``pysbd`` as they are (``clean=False``; a language pysbd lacks, cs or pt, gets its
English rules; pysbd is no dependency of mtkit's, ``pip install pysbd``, left out when missing), and
``regex``, a naive baseline (a break after ``.``, ``!``, ``?`` or ``…``, closing quotes or brackets, then
whitespace and a capital, digit or opening quote).

Test sets:
  * ``m30k-LANG``: Multi30k test_2016_flickr captions joined three to a line with one space (en, de, fr, cs),
    each caption as written (one lacking a final full stop keeps lacking it: such a join is ambiguous to any
    splitter, and counts as wrong unless split right);
  * ``hand-CATEGORY``: benchmarks/data/sentence_split.tsv, cases written by hand (abbreviations, numbers,
    ellipses, quotes and brackets, URLs and e-mails, plain sentences in ten languages); mtkit's own rules
    were written for sentencex's mistakes on these, so its figures here flatter it;
  * ``held-out``: benchmarks/data/sentence_split_holdout.tsv, more cases of the same kinds written after
    mtkit's rules and never used to tune them;
  * ``one-per-line``: test_2016_flickr.en as it is, one caption a line (what splitting costs on text that
    needs none; right = left whole).

A line is right when the splitter's sentences, each stripped of whitespace, are exactly the expected ones.
lines/s: the best of ``--repeat`` passes over the set. ``--hostile``: seconds per hostile line (1 MB without
a full stop, 100,000 "." / "Dr. " / "..." / quotes, 10,000 placeholders, 1 MB of short sentences, in Latin
and in Chinese script) for mtkit, sentencex and pysbd (the libraries alone on a prefix, :data:`LIBRARY_CAP`,
where their time grows faster than the text).
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MULTI30K = Path(os.environ.get("MTKIT_MULTI30K", REPO.parent / "shared/data/multi30k"))
HAND_CASES = REPO / "benchmarks/data/sentence_split.tsv"
HELD_OUT = REPO / "benchmarks/data/sentence_split_holdout.tsv"
Splitter = Callable[[str, str], list[str]]


def read_hand_cases(path: Path = HAND_CASES) -> list[tuple[str, str, list[str]]]:
    """(lang, category, expected sentences) per case of the hand-written file."""
    cases = []
    for row in path.read_text(encoding="utf-8").splitlines():
        if row.strip() and not row.startswith("#"):
            lang, category, sentences = row.split("\t")
            cases.append((lang, category, [s.strip() for s in sentences.split(" ||| ")]))
    return cases


def multi30k_joined(directory: Path, lang: str, group: int = 3) -> list[list[str]]:
    captions = [c.strip() for c in (directory / f"test_2016_flickr.{lang}").read_text(encoding="utf-8").splitlines()]
    return [captions[i:i + group] for i in range(0, len(captions) - group + 1, group)]


def mtkit_splitter() -> Splitter:
    from mtkit.text.sentences import sentence_spans

    return lambda line, lang: [line[a:b] for a, b in sentence_spans(line, lang)]


def sentencex_splitter() -> Splitter:
    import sentencex

    return lambda line, lang: [s.strip() for s in sentencex.segment(lang, line) if s.strip()]


def pysbd_splitter() -> Splitter:
    import pysbd
    from pysbd.languages import LANGUAGE_CODES

    segmenters: dict[str, pysbd.Segmenter] = {}

    def split(line: str, lang: str) -> list[str]:
        code = lang if lang in LANGUAGE_CODES else "en"
        if code not in segmenters:
            segmenters[code] = pysbd.Segmenter(language=code, clean=False)
        return [s.strip() for s in segmenters[code].segment(line) if s.strip()]

    return split


_NAIVE = re.compile(r"(?<=[.!?…])[\"'”’»)\]]*\s+(?=[\"'“‘«(¿¡]?[A-ZÀ-ÞА-ЯČŠŽŘŁŚŻ0-9])")


def regex_splitter() -> Splitter:
    return lambda line, lang: [s.strip() for s in _NAIVE.split(line) if s.strip()]


SPLITTERS = {"mtkit": mtkit_splitter, "sentencex": sentencex_splitter, "pysbd": pysbd_splitter,
             "regex": regex_splitter}


def evaluate(split: Splitter, cases: list[tuple[str, list[str]]], repeat: int) -> tuple[float, float, list]:
    """(share exactly right, lines/s, the wrong cases as (expected, got))."""
    lines = [(lang, " ".join(expected)) for lang, expected in cases]
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        got = [split(line, lang) for lang, line in lines]
        best = min(best, time.perf_counter() - start)
    wrong = [(expected, g) for (_, expected), g in zip(cases, got) if g != expected]
    return 1 - len(wrong) / len(cases), len(cases) / best, wrong


def hostile_lines() -> dict[str, str]:
    return {"1 MB, no full stop": "word " * 200_000, '100,000 "."': "." * 100_000,
            '100,000 "Dr. "': "Dr. " * 100_000, '100,000 "..."': "..." * 100_000, '100,000 quotes': '"' * 100_000,
            "10,000 placeholders": " ".join(f"{{p{i}}} <x id=\"{i}\"/>" for i in range(10_000)),
            '250,000 "Hi. "': "Hi. " * 250_000, '500,000 "」。"': "」。" * 500_000,
            '333,334 "你好。"': "你好。" * 333_334}


# The most of a hostile line each library is handed alone (mtkit takes it whole): pysbd's time grows faster
# than the text on most of them, sentencex's on full stops of scripts without spaces (。).
LIBRARY_CAP = {"pysbd": 20_000, "sentencex": 32_768}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--multi30k", type=Path, default=DEFAULT_MULTI30K)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--splitters", default=",".join(SPLITTERS))
    parser.add_argument("--show-wrong", default="", help="print the wrong cases of this splitter")
    parser.add_argument("--hostile", action="store_true")
    args = parser.parse_args()

    sets: dict[str, list[tuple[str, list[str]]]] = {}
    notes = []
    if args.multi30k.is_dir():
        for lang in ("en", "de", "fr", "cs"):
            groups = multi30k_joined(args.multi30k, lang)
            sets[f"m30k-{lang}"] = [(lang, group) for group in groups]
            stopped = sum(all(c.rstrip("\"'”’»)")[-1:] in ".!?" for c in g[:-1]) for g in groups)
            notes.append(f"# m30k-{lang}: {stopped / len(groups):.1%} of the lines have a full stop (. ! ?) after "
                         "each caption but the last: about the most a splitter can get right")
    else:
        print(f"# no Multi30k at {args.multi30k}: its sets are left out")
    hand = read_hand_cases()
    sets["hand-all"] = [(lang, expected) for lang, _, expected in hand]
    for category in sorted({c for _, c, _ in hand}):
        sets[f"hand-{category}"] = [(lang, expected) for lang, c, expected in hand if c == category]
    held_out = read_hand_cases(HELD_OUT)
    sets["held-out"] = [(lang, expected) for lang, _, expected in held_out]
    if args.multi30k.is_dir():
        sets["one-per-line"] = [("en", [c.strip()]) for c in
                                (args.multi30k / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()]

    splitters = {}
    for name in args.splitters.split(","):
        try:
            splitters[name] = SPLITTERS[name]()
        except ImportError as e:  # pysbd is no dependency of mtkit's
            print(f"# {name} left out: {e} (pip install {e.name})")
    names = list(splitters)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {len(hand)} hand cases, {len(held_out)} held out")
    print(f"{'set':<16} {'lines':>6}  " + "  ".join(f"{n + ' right':>15} {'lines/s':>9}" for n in names))
    for set_name, cases in sets.items():
        row = f"{set_name:<16} {len(cases):>6}  "
        for name, split in splitters.items():
            right, speed, wrong = evaluate(split, cases, args.repeat)
            row += f"{right:>15.1%} {speed:>9.0f}  "
            if name == args.show_wrong and set_name != "hand-all":
                for expected, got in wrong:
                    print(f"  [{set_name}] expected {expected}\n  {' ' * len(set_name)}   got      {got}")
        print(row.rstrip(), flush=True)
    print("\n".join(notes))
    if args.hostile:
        print("\nhostile line           " + "".join(f"{n + ' s (chars)':>24}" for n in names if n != "regex"))
        for label, line in hostile_lines().items():
            row = f"{label:<22}"
            for name, split in splitters.items():
                if name == "regex":
                    continue
                text = line
                if name in LIBRARY_CAP and ("。" in line or name == "pysbd"):
                    text = line[:LIBRARY_CAP[name]]
                start = time.perf_counter()
                split(text, "zh" if "。" in line else "en")
                row += f"{time.perf_counter() - start:>12.3f} ({len(text):>9,})"
            print(row, flush=True)
        print(f"# the libraries alone on the first {LIBRARY_CAP['pysbd']:,} characters (pysbd) or "
              f"{LIBRARY_CAP['sentencex']:,} (sentencex, lines of 。): on more, their time grows faster than the text")


if __name__ == "__main__":
    main()

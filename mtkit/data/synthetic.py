"""The built-in demo corpus: English number words -> German number words (and French, for a multilingual demo).

``"three hundred forty-two and seven"`` -> ``"dreihundertzweiundvierzig und sieben"``.
Each sentence holds one to three numbers in 0..999 joined by "and"/"und", so
it is at most 14 words long. The task needs what translation needs (reordering:
"forty-two" -> "zweiundvierzig"; German writes a number as one compound word,
which SentencePiece must split into pieces), yet a tiny Transformer learns it
in a couple of minutes on two CPU cores.

The corpus is deterministic in ``(seed, split)``. The splits are disjoint by
construction: every sentence is assigned to one split by a hash of its English
side, and a split's generator keeps only the sentences assigned to it.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator

_EN_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
            "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_EN_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_DE_ONES = ["null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun", "zehn",
            "elf", "zwölf", "dreizehn", "vierzehn", "fünfzehn", "sechzehn", "siebzehn", "achtzehn", "neunzehn"]
_DE_TENS = ["", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig", "neunzig"]

_FR_ONES = ["zéro", "un", "deux", "trois", "quatre", "cinq", "six", "sept", "huit", "neuf", "dix", "onze", "douze",
            "treize", "quatorze", "quinze", "seize", "dix-sept", "dix-huit", "dix-neuf"]
_FR_TENS = ["", "", "vingt", "trente", "quarante", "cinquante", "soixante"]

MAX_NUMBER = 999
SPLITS = ("train", "valid", "test")


def english(n: int) -> str:
    """0 <= n <= 999 in American English words: 342 -> 'three hundred forty-two'."""
    if not 0 <= n <= MAX_NUMBER:
        raise ValueError(f"number out of range: {n}")
    hundreds, rest = divmod(n, 100)
    words = []
    if hundreds:
        words.append(f"{_EN_ONES[hundreds]} hundred")
    if rest or not hundreds:
        if rest < 20:
            words.append(_EN_ONES[rest])
        else:
            tens, ones = divmod(rest, 10)
            words.append(_EN_TENS[tens] + (f"-{_EN_ONES[ones]}" if ones else ""))
    return " ".join(words)


def german(n: int) -> str:
    """0 <= n <= 999 as one German word: 342 -> 'dreihundertzweiundvierzig'."""
    if not 0 <= n <= MAX_NUMBER:
        raise ValueError(f"number out of range: {n}")
    hundreds, rest = divmod(n, 100)
    word = ""
    if hundreds:
        word = ("ein" if hundreds == 1 else _DE_ONES[hundreds]) + "hundert"
    if rest or not hundreds:
        if rest < 20:
            word += _DE_ONES[rest]
        else:
            tens, ones = divmod(rest, 10)
            unit = "ein" if ones == 1 else _DE_ONES[ones]
            word += (f"{unit}und" if ones else "") + _DE_TENS[tens]
    return word


def _french_below_100(n: int) -> str:
    if n < 20:
        return _FR_ONES[n]
    tens, ones = divmod(n, 10)
    if tens in (7, 9):  # 70-79: soixante-dix …, 90-99: quatre-vingt-dix …
        if n == 71:
            return "soixante et onze"
        return ("soixante-" if tens == 7 else "quatre-vingt-") + _FR_ONES[10 + ones]
    if tens == 8:
        return "quatre-vingts" if not ones else f"quatre-vingt-{_FR_ONES[ones]}"
    if not ones:
        return _FR_TENS[tens]
    return f"{_FR_TENS[tens]} et un" if ones == 1 else f"{_FR_TENS[tens]}-{_FR_ONES[ones]}"


def french(n: int) -> str:
    """0 <= n <= 999 in French words (the traditional spelling): 342 -> 'trois cent quarante-deux'."""
    if not 0 <= n <= MAX_NUMBER:
        raise ValueError(f"number out of range: {n}")
    hundreds, rest = divmod(n, 100)
    words = []
    if hundreds:
        words.append("cent" if hundreds == 1 else f"{_FR_ONES[hundreds]} cent" + ("" if rest else "s"))
    if rest or not hundreds:
        words.append(_french_below_100(rest))
    return " ".join(words)


# The demo's languages: how each writes a number, and the word that joins two.
LANGUAGES = {"en": (english, " and "), "de": (german, " und "), "fr": (french, " et ")}


def split_of(sentence: str) -> str:
    """The split a sentence belongs to: 80% train, 10% valid, 10% test, by hash."""
    bucket = hashlib.blake2b(sentence.encode("utf-8"), digest_size=8).digest()[0] % 10
    return "test" if bucket == 0 else "valid" if bucket == 1 else "train"


def demo_pairs(size: int, seed: int = 1, split: str = "train", src: str = "en",
               tgt: str = "de") -> Iterator[tuple[str, str]]:
    """Yield ``size`` (English, German) pairs of ``split``, deterministic in ``(seed, split)``; or
    the same numbers in ``src`` and ``tgt``, two of :data:`LANGUAGES` (a multilingual demo, whose
    pairs then hold the same sentences and splits)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}")
    (src_words, src_and), (tgt_words, tgt_and) = LANGUAGES[src], LANGUAGES[tgt]
    rng = random.Random(f"mtkit-demo-{seed}-{split}")
    made = 0
    while made < size:
        numbers = [rng.randint(0, MAX_NUMBER) for _ in range(rng.randint(1, 3))]
        en = " and ".join(english(n) for n in numbers)
        if split_of(en) != split:
            continue
        made += 1
        yield src_and.join(src_words(n) for n in numbers), tgt_and.join(tgt_words(n) for n in numbers)

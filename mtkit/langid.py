"""Language identification: which language a text is in, among candidate languages (lingua).

One identifier serves every part of mtkit that asks: the cleaning filter ``langid``
(:mod:`mtkit.data.filters`), ``mtkit detect``, and the server's ``POST /detect`` and ``source: auto``.
It is lingua (``lingua-language-detector``, the extras ``[clean]`` and ``[serve]``), which ships its
language models in its wheel (no download) and is accurate on short texts such as one caption.

Languages are ISO 639-1 codes (``de``); a code with a region or script (``pt-BR``, ``zh_Hant``) stands
for its base language. lingua is told one text's language among the candidates only: a text in
another language gets the closest candidate, so give every language that may come.

Each text is judged on its first :data:`PREFIX_CHARS` characters: the language of a long text shows
in its beginning, and a stranger's 1 MB text costs no more than a paragraph. A text without letters
(empty, digits, punctuation), or in a script no candidate is written in, has no language: lingua gives
every candidate zero, and :func:`detect` gives it an empty list.

lingua holds Python's GIL while it works: a caller that must stay responsive (the server's event loop)
calls it one text at a time from a worker thread.

A detector for a set of candidates is built once and kept (:func:`identifier`, a few sets at most), with
its languages' models loaded as it is built (~3 s and ~650 MB for :data:`COMMON` on one core; held for the
life of the process and shared by every detector): left to lingua, each language would load at the first
text that could be in it, holding the GIL for seconds (4.5 s at a server's first ``/detect``, every other
request waiting), and loading the Latin-script ones alone that way takes longer than loading all at once.
:func:`prepare` builds one ahead (the server does at its start). Loading them, and detecting several texts at
once, takes lingua's thread pool; a process forked after that (``prepare``'s cleaning workers) must not use the
pool, whose threads it lacks: it detects one text at a time instead (:func:`_may_use_pool`).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence

from mtkit.errors import MtkitError

PREFIX_CHARS = 1000  # characters of a text that are judged

# The candidates when none are given (``mtkit detect``; the server adds its models' source languages):
# widely used languages that lingua knows, one per close family where it can (no Slovak beside Czech, no
# Norwegian beside Danish and Swedish), since every candidate more is one more way to be wrong on a short text.
COMMON = ("ar", "cs", "da", "de", "el", "en", "es", "fi", "fr", "hi", "hu", "it", "ja", "ko", "nl", "pl", "pt",
          "ro", "ru", "sv", "tr", "uk", "zh")

NEEDS_LINGUA = "language identification needs lingua (pip install 'mtkit[serve]' or 'mtkit[clean]')"


def base_code(code: str) -> str:
    """A code's base language, lower-cased: ``pt-BR`` -> ``pt``, ``zh_Hant`` -> ``zh``."""
    return re.split(r"[-_]", code, maxsplit=1)[0].lower()


# ISO 639-3 (NLLB's codes are ``fra_Latn``: language_Script) -> ISO 639-1, where the language has one.
ISO_639_1 = dict(pair.split(":") for pair in (
    "afr:af amh:am arb:ar asm:as azj:az bak:ba bel:be ben:bn bod:bo bos:bs bul:bg cat:ca ces:cs cym:cy dan:da "
    "deu:de ell:el eng:en epo:eo est:et eus:eu ewe:ee fao:fo fij:fj fin:fi fra:fr gla:gd gle:ga glg:gl grn:gn "
    "guj:gu hat:ht hau:ha heb:he hin:hi hrv:hr hun:hu hye:hy ibo:ig ind:id isl:is ita:it jav:jv jpn:ja kan:kn "
    "kas:ks kat:ka kaz:kk khk:mn khm:km kik:ki kin:rw kir:ky kon:kg kor:ko lao:lo lin:ln lit:lt ltz:lb lug:lg "
    "lvs:lv mal:ml mar:mr mkd:mk mlt:mt mri:mi mya:my nld:nl nno:nn nob:nb npi:ne nya:ny oci:oc ory:or pan:pa "
    "pes:fa pol:pl por:pt pbt:ps ron:ro run:rn rus:ru sag:sg san:sa sin:si slk:sk slv:sl smo:sm sna:sn snd:sd "
    "som:so sot:st spa:es als:sq srd:sc srp:sr ssw:ss sun:su swe:sv swh:sw tam:ta tat:tt tel:te tgk:tg tgl:tl "
    "tha:th tir:ti tsn:tn tso:ts tuk:tk tur:tr twi:tw uig:ug ukr:uk urd:ur uzn:uz vie:vi wol:wo xho:xh ydd:yi "
    "yor:yo zho:zh zsm:ms zul:zu").split())


def short_codes(codes: Sequence[str]) -> dict[str, str]:
    """code -> its ISO 639-1 code, for the codes of ``codes`` (``fra_Latn``, M2M100's ``__fr__``) that have one
    no other code of ``codes`` shares (``zho_Hans`` and ``zho_Hant`` keep theirs)."""
    found = {}
    for code in codes:
        base = code.strip("_").split("_")[0].lower()
        short = base if len(base) == 2 else ISO_639_1.get(base)
        if short:
            found[code] = short
    shared = [s for s in found.values() if list(found.values()).count(s) > 1]
    return {code: short for code, short in found.items() if short not in shared and short not in codes}


def available() -> bool:
    """Whether lingua is installed."""
    try:
        import lingua  # noqa: F401 - installed or not
    except ImportError:
        return False
    return True


def knows(code: str) -> bool:
    """Whether lingua identifies the language of ``code`` (False without lingua)."""
    if not available():
        return False
    from lingua import IsoCode639_1

    try:
        IsoCode639_1.from_str(base_code(code))
    except ValueError:
        return False
    return True


def check_code(code: str, key: str = "languages") -> str:
    """``code``'s base language when lingua identifies it; else an error naming ``key`` (where the code came
    from: ``data.tgt_lang``, ``--languages``) and the code. Also the error when lingua is not installed."""
    if not available():
        raise MtkitError(f"{key}: {NEEDS_LINGUA}")
    if not knows(code):
        raise MtkitError(f"{key}: lingua does not identify the language {code!r}")
    return base_code(code)


@functools.lru_cache(maxsize=8)  # a few candidate sets per process (the server's, a filter's, a command's)
def identifier(codes: tuple[str, ...], low_accuracy: bool = False):
    """lingua's detector among ``codes`` (base ISO 639-1 codes, sorted, at least two), built once per set.
    ``low_accuracy``: lingua's low-accuracy mode (trigrams only: faster, worse on short texts)."""
    try:
        from lingua import IsoCode639_1, LanguageDetectorBuilder
    except ImportError:
        raise MtkitError(NEEDS_LINGUA) from None
    builder = LanguageDetectorBuilder.from_iso_codes_639_1(*(IsoCode639_1.from_str(c) for c in codes))
    if low_accuracy:
        builder = builder.with_low_accuracy_mode()
    if _may_use_pool():  # loading the models takes lingua's thread pool
        _pool_used()
        builder = builder.with_preloaded_language_models()
    return builder.build()


# The process whose lingua has started its thread pool (rayon's), or None. A process forked from it (the cleaning
# workers of prepare are) inherits the pool's state without its threads: lingua's parallel work there would wait
# for them for ever, so it detects one text at a time and loads models as texts need them, as a fresh process may.
_POOL_PID: int | None = None


def _may_use_pool() -> bool:
    return _POOL_PID is None or _POOL_PID == os.getpid()


def _pool_used() -> None:
    global _POOL_PID
    _POOL_PID = os.getpid()


def prepare(candidates: Sequence[str], low_accuracy: bool = False) -> None:
    """Build the detector :func:`detect` uses for ``candidates`` now, its languages' models loaded."""
    identifier(_pair_of(_candidates(candidates)), low_accuracy)


def candidates_of(codes: Sequence[str], key: str = "languages") -> tuple[str, ...]:
    """``codes`` as :func:`identifier` takes them: base codes, checked, without repeats, sorted."""
    return tuple(sorted({check_code(c, key) for c in codes}))


@functools.lru_cache(maxsize=32)  # the check once per set: the cleaning filter asks once per line
def _checked(codes: tuple[str, ...]) -> tuple[str, ...]:
    return candidates_of(codes)


def detect(texts: Sequence[str], candidates: Sequence[str] = COMMON,
           low_accuracy: bool = False) -> list[list[tuple[str, float]]]:
    """Each text's language among ``candidates`` (ISO 639-1 codes).

    Args:
        texts: the texts; each is judged on its first :data:`PREFIX_CHARS` characters.
        candidates: the languages a text may be in (one alone is every text's language that has letters).
        low_accuracy: lingua's low-accuracy mode.

    Returns:
        Per text, ``(code, confidence)`` for each candidate with a confidence above zero, best first
        (confidences in 0..1, lingua's relative ones: they sum to 1); empty for a text without letters, or
        whose letters no candidate is written in.
    """
    codes = _candidates(candidates)
    prefixes = [text[:PREFIX_CHARS] for text in texts]
    if len(codes) == 1:  # lingua needs two candidates; one language is the only answer a text with letters has
        found = _detect(prefixes, _pair_of(codes), low_accuracy)
        return [[(codes[0], 1.0)] if values else [] for values in found]
    return _detect(prefixes, codes, low_accuracy)


def _candidates(candidates: Sequence[str]) -> tuple[str, ...]:
    """``candidates`` checked (:func:`candidates_of`), at least one."""
    codes = _checked(tuple(candidates))
    if not codes:
        raise MtkitError("languages: give at least one language to tell apart")
    return codes


def _pair_of(codes: tuple[str, ...]) -> tuple[str, ...]:
    """The candidates lingua is given: ``codes``, or a lone code with a second (lingua needs two)."""
    if len(codes) > 1:
        return codes
    only = codes[0]
    return tuple(sorted((only, "en" if only != "en" else "de")))


def _detect(texts: list[str], codes: tuple[str, ...], low_accuracy: bool) -> list[list[tuple[str, float]]]:
    detector = identifier(codes, low_accuracy)
    if len(texts) > 1 and _may_use_pool():
        _pool_used()
        found = detector.compute_language_confidence_values_in_parallel(texts)
    else:
        found = [detector.compute_language_confidence_values(text) for text in texts]
    return [[(v.language.iso_code_639_1.name.lower(), v.value) for v in values if v.value > 0] for values in found]


def best(text: str, candidates: Sequence[str] = COMMON, low_accuracy: bool = False) -> str | None:
    """``text``'s most likely language among ``candidates`` (None for a text without letters)."""
    found = detect([text], candidates, low_accuracy)[0]
    return found[0][0] if found else None

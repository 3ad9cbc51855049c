"""Literature-comparable tokenized BLEU: lowercased Moses-tokenized text (``BLEU-lc-tok``, what
Multi30k papers quote) and cased Moses tokens with compound splitting (``BLEU-tok-compound``, the
Transformer paper's WMT14 en-de number); :mod:`mtkit.metrics.scores` says when each applies."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version

# Share of reference lines that must survive the lc-tok pipeline unchanged for the
# stream to count as already tokenized (English official refs: 983/1000, because
# the pipeline splits "&apos;s" that the original run kept whole).
_PRETOKENIZED_MIN_FIXED = 0.9

# ---------------------------------------------------------------- tokenized BLEU


@lru_cache(maxsize=8)
def _moses(lang: str):
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    return MosesPunctNormalizer(lang), MosesTokenizer(lang)


def lc_tok(line: str, lang: str) -> str:
    """Lowercase, normalize punctuation and Moses-tokenize one line like Multi30k's ``*.lc.norm.tok.*``."""
    normalizer, tokenizer = _moses(lang)
    return tokenizer.tokenize(normalizer.normalize(line.strip().lower()), escape=True, return_str=True)


def compound_split_tok(line: str, lang: str) -> str:
    """Cased Moses tokenization plus ``##AT##-##AT##`` compound splitting (t2t ``get_ende_bleu.sh``)."""
    _, tokenizer = _moses(lang)
    tokenized = tokenizer.tokenize(line.strip(), escape=True, return_str=True)
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", tokenized)


def looks_lc_tok(lines: Sequence[str], lang: str) -> bool:
    """True if a reference stream is already lowercased and tokenized (e.g. an official ``*.lc.norm.tok.*``)."""
    if not lines or any(line != line.lower() for line in lines):
        return False
    fixed = sum(lc_tok(html.unescape(line), lang) == line.strip() for line in lines)
    return fixed >= _PRETOKENIZED_MIN_FIXED * len(lines)


def _sacremoses_version() -> str:
    try:
        return version("sacremoses")
    except PackageNotFoundError:  # pragma: no cover - the dependency is declared
        return "unknown"

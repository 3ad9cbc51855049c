"""Cleaning rules for parallel text, each switchable in ``data.clean`` and counted.

Training pairs go through every rule that is on, in this order (``mtkit.data.encode.rule_names``; a rule that is
off is left out of the manifest and the report):

  invalid_utf8  a line that is not UTF-8 (only with ``clean.invalid_utf8: skip``)
  empty         one side empty after normalization
  (filters)     the configured ``clean.filters``, in their order (:mod:`mtkit.data.filters`)
  too_long      a side longer than ``clean.max_len`` SentencePiece tokens
  ratio         longer/shorter side (in tokens) above ``clean.max_ratio``
  duplicate     the exact pair was seen before (``clean.dedup``)

Validation and test pairs are only normalized (strip, control characters,
NFKC): evaluation must cover every line of the reference.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Callable

import numpy as np

from mtkit.config import CleanConfig

# C0 and C1 control characters except tab (which becomes a space), and the BOM.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\ufeff]")


def make_normalizer(clean: CleanConfig) -> Callable[[str], str]:
    """The per-line normalization ``clean`` asks for (control chars, NFKC, strip)."""
    steps: list[Callable[[str], str]] = []
    if clean.remove_control:
        steps.append(lambda s: _CONTROL.sub("", s).replace("\t", " "))
    if clean.nfkc:
        steps.append(lambda s: unicodedata.normalize("NFKC", s))
    if clean.strip:
        steps.append(str.strip)
    if not steps:
        return lambda s: s
    if len(steps) == 1:
        return steps[0]

    def normalize(text: str) -> str:
        for step in steps:
            text = step(text)
        return text

    return normalize


def pair_hash(src: str, tgt: str) -> int:
    """A 64-bit hash of a pair, stable across processes (unlike ``hash``)."""
    digest = hashlib.blake2b(src.encode("utf-8") + b"\0" + tgt.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def within_words(src: str, tgt: str, max_len: int) -> bool:
    """Whether both sides have at most ``max_len`` words (filters the SentencePiece sample)."""
    return max_len <= 0 or (src.count(" ") < max_len and tgt.count(" ") < max_len)


def length_mask(src_lens: np.ndarray, tgt_lens: np.ndarray, clean: CleanConfig) -> tuple[np.ndarray, int, int]:
    """Keep-mask for token lengths (both ``(N,)`` ints), and the too_long and ratio drop counts."""
    keep = np.ones(len(src_lens), dtype=bool)
    too_long = ratio = 0
    if clean.max_len > 0:
        long = (src_lens > clean.max_len) | (tgt_lens > clean.max_len)
        too_long = int(long.sum())
        keep &= ~long
    if clean.max_ratio > 0:
        lo = np.maximum(np.minimum(src_lens, tgt_lens), 1)
        hi = np.maximum(src_lens, tgt_lens)
        bad = keep & (hi > clean.max_ratio * lo)
        ratio = int(bad.sum())
        keep &= ~bad
    return keep, too_long, ratio


class Deduplicator:
    """Remembers 8-byte pair hashes (about 70 bytes of RAM per distinct pair in a set)."""

    def __init__(self) -> None:
        self._seen: set[int] = set()

    def keep(self, hashes: np.ndarray) -> np.ndarray:
        """Keep-mask over ``hashes`` ``(N,)`` uint64: False for a pair seen before."""
        seen = self._seen
        mask = np.ones(len(hashes), dtype=bool)
        for i, h in enumerate(hashes.tolist()):
            if h in seen:
                mask[i] = False
            else:
                seen.add(h)
        return mask

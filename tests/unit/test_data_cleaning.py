"""Cleaning rules: normalization, token-length and ratio masks, deduplication."""

import numpy as np

from mtkit.config import CleanConfig
from mtkit.data.cleaning import Deduplicator, length_mask, make_normalizer, pair_hash, within_words


def test_normalizer():
    assert make_normalizer(CleanConfig())("  a\x00b\tc\ufeff \r") == "ab c"
    assert make_normalizer(CleanConfig(nfkc=True))(" ｆｕｌｌ ") == "full"
    assert make_normalizer(CleanConfig(strip=False, remove_control=False))(" a\x01 ") == " a\x01 "


def test_length_mask_counts_each_rule_once():
    src = np.array([3, 300, 2, 10, 1])
    tgt = np.array([4, 5, 9, 10, 3])
    keep, too_long, ratio = length_mask(src, tgt, CleanConfig(max_len=250, max_ratio=3.0))
    assert keep.tolist() == [True, False, False, True, True]
    assert (too_long, ratio) == (1, 1)
    keep, too_long, ratio = length_mask(src, tgt, CleanConfig(max_len=0, max_ratio=0))
    assert keep.all() and too_long == ratio == 0


def test_dedup_and_words():
    dedup = Deduplicator()
    hashes = np.array([pair_hash("a", "b"), pair_hash("a", "c"), pair_hash("a", "b")], dtype=np.uint64)
    assert dedup.keep(hashes).tolist() == [True, True, False]
    assert dedup.keep(hashes[:1]).tolist() == [False]
    assert pair_hash("ab", "c") != pair_hash("a", "bc")
    assert within_words("a b", "c", 2) and not within_words("a b c", "c", 2)

"""Training-time augmentation (``train.augment``), OpusTrainer's modifiers: models trained on clean,
mostly lower-case captions break on ALL CAPS, Title Case and typos; seeing a few such pairs in training
teaches them to cope.

Each training pair read is, with its own probability each (in this order):

  merge       joined with another training pair drawn at random (source to source, target to target), when
              both fit the model's positions together: longer inputs of several sentences
  upper       both sides in UPPER CASE        }  at most one of the two
  title       both sides in Title Case        }
  typos       character typos on the source (a swap, a deletion, a doubled letter, a keyboard neighbour, a
              space removed or inserted), each letter with probability ``typo_rate``
  copy_noise  replaced by a string of random words, the same on both sides: the model learns to copy through
              what it cannot translate

The stored ids are decoded to text (lossless for SentencePiece), changed and encoded again; a pair with an
unknown piece before or after (an upper-case letter the vocabulary never saw), or longer than the model's
positions after, keeps its stored ids. Validation, test and translation never see a modifier.

Reproducibility: which pairs each modifier takes in an epoch is drawn once per epoch from a generator seeded
with (``train.seed``, the epoch), as an array indexed by pair; a typo's or noise's own choices from one seeded
with (``train.seed``, the epoch, the pair's index). A resumed run thus changes the same pairs in the same way as
an uninterrupted one, whatever the batch it lands in or the rank that reads it: resume stays bit-for-bit.

Modified pairs are longer (an upper-case word is several pieces, a merged pair two pairs): at the start of each
epoch the batch sampler is given every pair's length after that epoch's modifiers (:meth:`Augmenter.lengths`),
so that batches keep their token budget and are cut among pairs of like lengths (little padding).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mtkit.config import UNK_ID
from mtkit.config.schema import AugmentConfig
from mtkit.data.vocab import Vocab

ALPHABET_SAMPLE = 2000  # training pairs whose characters make copy_noise's alphabet

# QWERTY neighbours of each lower-case letter (a typo's "keyboard neighbour")
_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")
_NEIGHBOURS = {
    ch: "".join(row2[j] for row2 in _ROWS[max(0, r - 1): r + 2] for j in (i - 1, i, i + 1)
                if 0 <= j < len(row2) and row2[j] != ch)
    for r, row in enumerate(_ROWS) for i, ch in enumerate(row)
}


def title_case(text: str) -> str:
    """Each word's first letter in upper case, the rest as it was (``str.title`` would lower-case the rest and
    upper-case the letter after an apostrophe)."""
    return " ".join(w[:1].upper() + w[1:] for w in text.split(" "))


def typos(text: str, rate: float, rng: np.random.Generator) -> str:
    """``text`` with each letter, with probability ``rate``, swapped with the next character, deleted, doubled,
    replaced by a keyboard neighbour, or followed by a space; each space, with that probability, removed."""
    out: list[str] = []
    chars = list(text)
    i = 0
    while i < len(chars):
        ch = chars[i]
        if ch == " " and out and rng.random() < rate:
            i += 1
            continue
        if not ch.isalpha() or rng.random() >= rate:
            out.append(ch)
            i += 1
            continue
        kind = int(rng.integers(5))
        if kind == 0 and i + 1 < len(chars) and chars[i + 1] != " ":  # swap with the next character
            out += [chars[i + 1], ch]
            i += 2
            continue
        if kind == 1:  # deleted
            pass
        elif kind == 2:  # doubled
            out += [ch, ch]
        elif kind == 3 and ch.lower() in _NEIGHBOURS:  # a keyboard neighbour, in the letter's case
            near = _NEIGHBOURS[ch.lower()]
            wrong = near[int(rng.integers(len(near)))]
            out.append(wrong.upper() if ch.isupper() else wrong)
        elif kind == 4:  # a space inserted after it
            out += [ch, " "]
        else:
            out.append(ch)
        i += 1
    return "".join(out).strip() or text


def noise(alphabet: str, rng: np.random.Generator, words: int) -> str:
    """``words`` random words of 1 to 8 characters of ``alphabet``."""
    return " ".join("".join(alphabet[int(k)] for k in rng.integers(len(alphabet), size=int(rng.integers(1, 9))))
                    for _ in range(max(1, words)))


PLAN_CHUNK = 1 << 20  # pairs whose draws are made at once (bounds the temporary floats)
MERGE, UPPER, TITLE, TYPOS, NOISE = 1, 2, 4, 8, 16  # a pair's modifiers this epoch, as bits


class Augmenter:
    """Applies ``train.augment``'s modifiers to the pairs of a batch (one instance per training process)."""

    def __init__(self, vocab: Vocab, config: AugmentConfig, seed: int, max_len: int, tags: Sequence[int] = (),
                 tag_side: str = "src") -> None:
        """``max_len``: the most pieces a side may have (a longer result keeps the stored ids); ``tags``: a
        multilingual store's target-language tag ids, which lead its sources (or its targets: ``tag_side``
        "tgt") and stay as they are."""
        self.vocab = vocab
        self.config = config
        self.seed = seed
        self.max_len = max_len
        self.tags = frozenset(int(t) for t in tags)
        self.tag_side = tag_side
        self.alphabet = ""
        self._plans: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # the last two epochs' plans

    def plan(self, n: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Each of ``n`` pairs' modifiers in ``epoch`` (``(n,)`` uint8 of MERGE | UPPER | ...) and merge partner
        (``(n,)`` int64), drawn from a generator seeded with (seed, epoch): a function of the pair's index."""
        if epoch in self._plans and len(self._plans[epoch][0]) == n:
            return self._plans[epoch]
        c = self.config
        rng = np.random.default_rng([self.seed, epoch + 1])  # (growth's epoch is -1)
        flags = np.zeros(n, dtype=np.uint8)
        partner = np.zeros(n, dtype=np.int64)
        for lo in range(0, n, PLAN_CHUNK):
            u = rng.random((min(PLAN_CHUNK, n - lo), 5))
            part = flags[lo: lo + len(u)]
            part |= np.where(u[:, 0] < c.merge, MERGE, 0).astype(np.uint8)
            part |= np.where(u[:, 1] < c.upper, UPPER, np.where(u[:, 1] < c.upper + c.title, TITLE, 0)).astype(np.uint8)
            part |= np.where(u[:, 2] < c.typos, TYPOS, 0).astype(np.uint8)
            part |= np.where(u[:, 3] < c.copy_noise, NOISE, 0).astype(np.uint8)
            partner[lo: lo + len(u)] = np.minimum((u[:, 4] * n).astype(np.int64), n - 1)
        if len(self._plans) >= 2:
            self._plans.pop(min(self._plans))
        self._plans[epoch] = (flags, partner)
        return flags, partner

    def _split(self, ids: np.ndarray, side: str) -> tuple[list[int], list[int]]:
        """(leading tag or [], the rest) of a stored sentence."""
        ids = [int(i) for i in ids]
        if side == self.tag_side and self.tags and ids and ids[0] in self.tags:
            return ids[:1], ids[1:]
        return [], ids

    def _text(self, store, index: int) -> tuple[list[int], str, list[int], str] | None:
        """A pair's (source tag, source text, target tag, target text), or None with an unknown piece."""
        s_tag, s_ids = self._split(store.src(index), "src")
        t_tag, t_ids = self._split(store.tgt(index), "tgt")
        if UNK_ID in s_ids or UNK_ID in t_ids:
            return None
        return s_tag, self.vocab.decode_src(s_ids), t_tag, self.vocab.decode_tgt(t_ids)

    def learn_alphabet(self, store) -> None:
        """copy_noise's characters: the letters and digits of both sides of a seeded sample of training pairs."""
        n = len(store)
        rows = np.random.default_rng([self.seed, 0]).choice(n, size=min(n, ALPHABET_SAMPLE), replace=False) \
            if n else []
        src_chars: set[str] = set()
        tgt_chars: set[str] = set()
        for i in rows:
            pair = self._text(store, int(i))
            if pair is not None:
                src_chars.update(ch for ch in pair[1] if ch.isalnum())
                tgt_chars.update(ch for ch in pair[3] if ch.isalnum())
        self.alphabet = "".join(sorted(src_chars & tgt_chars)) or "abcdefghijklmnopqrstuvwxyz"

    def pair(self, store, index: int, epoch: int) -> tuple[list[int], list[int]] | None:
        """Pair ``index`` as this epoch's modifiers change it: (source ids, target ids), or None when no
        modifier applies (or the result would not fit ``max_len``, or has a piece the vocabulary lacks)."""
        flags, partner = self.plan(len(store), epoch)
        todo = int(flags[index])
        if not todo:
            return None
        pair = self._text(store, index)
        if pair is None:
            return None
        s_tag, src, t_tag, tgt = pair
        rng = np.random.default_rng([self.seed, epoch + 1, index])  # typos' and noise's own draws
        changed = False
        if todo & MERGE:
            other = self._text(store, int(partner[index]))
            if other is not None and other[0] == s_tag and other[2] == t_tag:
                src, tgt, changed = f"{src} {other[1]}", f"{tgt} {other[3]}", True
        if todo & UPPER:
            src, tgt, changed = src.upper(), tgt.upper(), True
        elif todo & TITLE:
            src, tgt, changed = title_case(src), title_case(tgt), True
        if todo & TYPOS:
            src, changed = typos(src, self.config.typo_rate, rng), True
        if todo & NOISE:
            src = tgt = noise(self.alphabet or "abcdefghijklmnopqrstuvwxyz", rng, len(src.split()))
            changed = True
        if not changed:
            return None
        s_ids = s_tag + self.vocab.encode_src(src)
        t_ids = t_tag + self.vocab.encode_tgt(tgt)
        if len(s_ids) > self.max_len or len(t_ids) > self.max_len or UNK_ID in s_ids or UNK_ID in t_ids:
            return None  # (a character the vocabulary lacks, such as an upper-case letter never seen)
        return s_ids, t_ids

    def __call__(self, store, indices: Sequence[int], epoch: int) -> tuple[list, list]:
        """The source and target ids of the pairs ``indices`` of ``store``, this epoch's modifiers applied."""
        srcs, tgts = [], []
        for i in indices:
            changed = self.pair(store, int(i), epoch)
            if changed is None:
                srcs.append(store.src(int(i)))
                tgts.append(store.tgt(int(i)))
            else:
                srcs.append(changed[0])
                tgts.append(changed[1])
        return srcs, tgts

    def lengths(self, store, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Every pair's source and target length in ``epoch``, its modifiers applied: what the batch sampler
        cuts that epoch's batches by, so that they keep their token budget and little padding."""
        src, tgt = store.src_lengths.copy(), store.tgt_lengths.copy()
        flags, _ = self.plan(len(store), epoch)
        for i in np.flatnonzero(flags).tolist():
            changed = self.pair(store, i, epoch)
            if changed is not None:
                src[i], tgt[i] = len(changed[0]), len(changed[1])
        return src, tgt

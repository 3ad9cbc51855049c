"""A vocabulary shortlist: per source piece, the target pieces a translation of it may hold (issue #65).

The file, ``RUN/shortlist.txt``, is CTranslate2's vocabulary map (its ``use_vmap``, exported as ``vmap.txt``
unchanged): one line per source piece, ``piece<TAB>t1 t2 ...``, and a first line with an empty key,
``<TAB>f1 f2 ...``, of the pieces that are candidates for every sentence.

* :func:`count_cooccurrence` counts, over (source ids, target ids) pairs, in how many pairs each source piece
  and each target piece occur together (sparse: keys ``s · V_tgt + t``, never a dense V × V table);
* :func:`select` keeps the ``frequent`` most frequent target pieces for every sentence and, per source
  piece, the ``per_source`` most likely others given it (p(t|s) = cooc(s, t) / count(s));
* :func:`write_shortlist` writes the file (a temporary, then a rename), :func:`read_shortlist` reads one
  from elsewhere: bounded in size, every piece in the vocabulary, each key once, a bad line one error
  ``FILE:LINE: problem``;
* :meth:`Shortlist.allowed` is a sentence's allowed target ids: the always-candidates, its source
  pieces' candidates, its own pieces (copies: names, numbers; the same ids in a joint vocabulary, the same
  piece strings in separate ones), PAD/UNK/BOS/EOS and the call's decoder start and prefix ids.

Per sentence, never per batch (Bergamot's per-batch shortlist changes a sentence's translation with the
batch it is in): :mod:`mtkit.decoding.shortlist` restricts each sentence to its own ids.
"""

from __future__ import annotations

import logging
import reprlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mtkit.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from mtkit.errors import MtkitError, counted
from mtkit.io import atomic_path, read_bounded

logger = logging.getLogger(__name__)

SHORTLIST_FILE = "shortlist.txt"  # in a run directory
VMAP_FILE = "vmap.txt"  # the same file in a CTranslate2 export (its use_vmap reads it)
MAX_SHORTLIST_BYTES = 256 << 20  # a 58k-piece vocabulary with 100 candidates each is about 50 MiB
SPECIAL_IDS = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
_MERGE_KEYS = 1 << 24  # counted keys held apart before they are merged into the running table


def shortlist_path(model_path: str | Path) -> Path:
    """The shortlist of a run directory, or of the run a checkpoint file belongs to (``RUN/checkpoints/x.pt``)."""
    path = Path(model_path)
    if path.is_dir():
        return path / SHORTLIST_FILE
    run = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    return run / SHORTLIST_FILE


# ------------------------------------------------------------------- counting


@dataclass
class Cooccurrence:
    """Counts over ``pairs`` pairs: ``keys`` (K,) int64 sorted, ``s · tgt_size + t``, with ``counts`` (K,) the
    pairs that hold both; ``source_pairs`` (V_src,) the pairs that hold each source piece; ``target_tokens``
    (V_tgt,) each target piece's occurrences."""

    keys: np.ndarray
    counts: np.ndarray
    source_pairs: np.ndarray
    target_tokens: np.ndarray
    tgt_size: int
    pairs: int


def _merge(keys: list[np.ndarray], counts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Sum the counts of equal keys over several (keys, counts) arrays: sorted unique keys and their counts."""
    all_keys, inverse = np.unique(np.concatenate(keys), return_inverse=True)
    return all_keys, np.bincount(inverse, weights=np.concatenate(counts), minlength=all_keys.size).astype(np.int64)


def count_cooccurrence(pairs: Iterable[tuple[Sequence[int], Sequence[int]]], src_size: int, tgt_size: int,
                       progress=None) -> Cooccurrence:
    """Count, over (source ids, target ids) pairs, the pairs holding each (source piece, target piece) pair.

    Special ids (PAD, UNK, BOS, EOS) are not counted. ``progress``: a tqdm-like bar updated per pair, or None.
    """
    source_pairs = np.zeros(src_size, dtype=np.int64)
    target_tokens = np.zeros(tgt_size, dtype=np.int64)
    held_keys: list[np.ndarray] = []
    held_counts: list[np.ndarray] = []
    pending: list[np.ndarray] = []
    n_pending = n = 0
    special = np.asarray(SPECIAL_IDS)

    def flush() -> None:
        nonlocal n_pending
        if pending:
            keys, counts = np.unique(np.concatenate(pending), return_counts=True)
            held_keys.append(keys)
            held_counts.append(counts.astype(np.int64))
            pending.clear()
            n_pending = 0
        if sum(k.size for k in held_keys) > _MERGE_KEYS and len(held_keys) > 1:
            merged = _merge(held_keys, held_counts)
            held_keys[:], held_counts[:] = [merged[0]], [merged[1]]

    for src, tgt in pairs:
        n += 1
        if progress is not None:
            progress.update(1)
        s = np.asarray(src, dtype=np.int64)
        t = np.asarray(tgt, dtype=np.int64)
        if t.size:
            np.add.at(target_tokens, t, 1)
        s = np.setdiff1d(s, special)  # unique, sorted
        t = np.setdiff1d(t, special)
        source_pairs[s] += 1
        if s.size and t.size:
            pending.append((s[:, None] * tgt_size + t[None, :]).ravel())  # (|s|·|t|,)
            n_pending += pending[-1].size
            if n_pending > _MERGE_KEYS // 4:
                flush()
    flush()
    if held_keys:
        keys, counts = _merge(held_keys, held_counts) if len(held_keys) > 1 else (held_keys[0], held_counts[0])
    else:
        keys, counts = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    target_tokens[list(SPECIAL_IDS)] = 0
    return Cooccurrence(keys, counts, source_pairs, target_tokens, tgt_size, n)


# ------------------------------------------------------------------ the shortlist


class Shortlist:
    """Per source id its candidate target ids, and the target ids every sentence may use.

    Args:
        always: (F,) target ids, candidates for every sentence.
        offsets: (V_src + 1,) int64: source id ``s``'s candidates are ``targets[offsets[s]:offsets[s + 1]]``.
        targets: (C,) int64 target ids.
        src_to_tgt: (V_src,) int64: the target id of each source piece's string (-1: none); None for a joint
            vocabulary (the same ids).
        tgt_size: V_tgt.
    """

    def __init__(self, always: np.ndarray, offsets: np.ndarray, targets: np.ndarray,
                 src_to_tgt: np.ndarray | None, tgt_size: int) -> None:
        self.always = np.asarray(always, dtype=np.int64)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.targets = np.asarray(targets, dtype=np.int64)
        self.src_to_tgt = src_to_tgt
        self.tgt_size = tgt_size

    @property
    def src_size(self) -> int:
        return self.offsets.size - 1

    def candidates(self, src_id: int) -> np.ndarray:
        """The candidate target ids of source id ``src_id`` (its line's), in the file's order."""
        return self.targets[self.offsets[src_id]: self.offsets[src_id + 1]]

    def keys(self) -> int:
        """The source pieces that have candidates."""
        return int(np.count_nonzero(np.diff(self.offsets)))

    def allowed(self, src_ids: Sequence[int], extra: Iterable[int] = ()) -> np.ndarray:
        """The sorted target ids a translation of ``src_ids`` (a sentence's source ids) may hold: see the
        module docstring; ``extra``: the call's own (its decoder start and forced prefix)."""
        src = np.unique(np.asarray(src_ids, dtype=np.int64))
        src = src[(src >= 0) & (src < self.src_size)]
        own = src if self.src_to_tgt is None else self.src_to_tgt[src]
        parts = [self.always, np.asarray(SPECIAL_IDS, dtype=np.int64), own[(own >= 0) & (own < self.tgt_size)],
                 np.asarray([i for i in extra if i is not None], dtype=np.int64)]
        parts += [self.targets[a:b] for a, b in zip(self.offsets[src], self.offsets[src + 1]) if b > a]
        return np.unique(np.concatenate(parts))

    def mask(self, sentences: Sequence[Sequence[int]], extra: Iterable[int] = ()) -> np.ndarray:
        """(B, V_tgt) bool: row ``b`` the allowed ids of sentence ``b`` (:meth:`allowed`)."""
        extra = list(extra)
        out = np.zeros((len(sentences), self.tgt_size), dtype=bool)
        for b, ids in enumerate(sentences):
            out[b, self.allowed(ids, extra)] = True
        return out


def select(counts: Cooccurrence, per_source: int, frequent: int, src_to_tgt: np.ndarray | None = None
           ) -> Shortlist:
    """The shortlist of ``counts``: the ``frequent`` most frequent target pieces for every sentence, and per
    source piece the ``per_source`` target pieces of the highest p(t|s) = cooc(s, t) / count(s) among the
    others (ties: the lower id first)."""
    if per_source < 0 or frequent < 0:
        raise MtkitError("the shortlist's per-source and frequent counts must be at least 0")
    V = counts.tgt_size
    by_frequency = np.lexsort((np.arange(V), -counts.target_tokens))  # most frequent first, ties by id
    by_frequency = by_frequency[counts.target_tokens[by_frequency] > 0]
    always = np.sort(by_frequency[:frequent])
    taken = np.zeros(V, dtype=bool)
    taken[always] = True
    taken[list(SPECIAL_IDS)] = True
    s, t = counts.keys // V, counts.keys % V
    keep = ~taken[t]
    s, t, c = s[keep], t[keep], counts.counts[keep]
    # p(t|s) orders the targets of one s as cooc(s, t) does: count(s) is the same for all of them.
    order = np.lexsort((t, -c, s))
    s, t = s[order], t[order]
    starts = np.searchsorted(s, s, side="left")  # (K,) the first key of each key's source piece
    rank = np.arange(s.size) - starts
    keep = rank < per_source
    s, t = s[keep], t[keep]
    src_size = counts.source_pairs.size
    offsets = np.zeros(src_size + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(np.bincount(s, minlength=src_size))
    return Shortlist(always, offsets, t, src_to_tgt, V)


# ------------------------------------------------------------------ the file


def source_to_target(vocab) -> np.ndarray | None:
    """For separate vocabularies, each source piece's target id of the same string (-1: none); None for a
    joint vocabulary (:attr:`mtkit.data.vocab.Vocab.joint`: the same ids)."""
    if getattr(vocab, "joint", True):
        return None
    table = {p: i for i, p in enumerate(vocab.tgt_pieces(range(vocab.tgt_size)))}
    return np.asarray([table.get(p, -1) for p in vocab.src_pieces(range(vocab.src_size))], dtype=np.int64)


def shortlist_text(shortlist: Shortlist, vocab) -> str:
    """The file's text: ``<TAB>always ...``, then ``piece<TAB>candidates ...`` per source piece that has some."""
    src = vocab.src_pieces(range(shortlist.src_size))
    tgt = vocab.tgt_pieces(range(shortlist.tgt_size))
    lines = ["\t" + " ".join(tgt[i] for i in shortlist.always)]
    for s in range(shortlist.src_size):
        found = shortlist.candidates(s)
        if found.size:
            lines.append(src[s] + "\t" + " ".join(tgt[i] for i in found))
    return "\n".join(lines) + "\n"


def write_shortlist(path: str | Path, shortlist: Shortlist, vocab) -> None:
    """Write ``shortlist`` to ``path`` (a temporary beside it, then a rename)."""
    text = shortlist_text(shortlist, vocab)
    with atomic_path(path, owned=True) as tmp:
        tmp.write_text(text, encoding="utf-8")


def read_shortlist(path: str | Path, vocab) -> Shortlist:
    """Read a shortlist file written by :func:`write_shortlist` or by anyone (CTranslate2's vocabulary map of
    single pieces), checked against ``vocab``: at most :data:`MAX_SHORTLIST_BYTES`, UTF-8, each line
    ``key<TAB>pieces`` with a key that is a source piece (or empty: the always-candidates) given once and
    target pieces of the vocabulary; anything else is one error ``FILE:LINE: problem``."""
    path = Path(path)
    data = read_bounded(path, MAX_SHORTLIST_BYTES, "shortlist")
    short = reprlib.Repr()
    short.maxstring = 40
    src_table = {p: i for i, p in enumerate(vocab.src_pieces(range(vocab.src_size)))}
    tgt_table = {p: i for i, p in enumerate(vocab.tgt_pieces(range(vocab.tgt_size)))}
    always: np.ndarray | None = None
    per_source: dict[int, np.ndarray] = {}
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        try:
            line = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError:
            raise MtkitError(f"{where}: not UTF-8 text") from None
        if line.count("\t") != 1:
            raise MtkitError(f"{where}: expected 'source piece<TAB>target pieces' (one tab), got "
                             f"{short.repr(line)}")
        key, values = line.split("\t")
        ids = []
        for piece in values.split():
            found = tgt_table.get(piece)
            if found is None:
                raise MtkitError(f"{where}: {short.repr(piece)} is no target piece of the model's vocabulary")
            ids.append(found)
        if key == "":
            if always is not None:
                raise MtkitError(f"{where}: a second line of always-candidates (the empty key)")
            always = np.unique(np.asarray(ids, dtype=np.int64))
            continue
        src_id = src_table.get(key)
        if src_id is None:
            raise MtkitError(f"{where}: {short.repr(key)} is no source piece of the model's vocabulary")
        if src_id in per_source:
            raise MtkitError(f"{where}: {short.repr(key)} has a line already")
        per_source[src_id] = np.asarray(ids, dtype=np.int64)
    offsets = np.zeros(vocab.src_size + 1, dtype=np.int64)
    for s, ids in per_source.items():
        offsets[s + 1] = ids.size
    offsets = np.cumsum(offsets)
    targets = np.concatenate([per_source[s] for s in sorted(per_source)] or [np.zeros(0, dtype=np.int64)])
    return Shortlist(np.zeros(0, dtype=np.int64) if always is None else always, offsets, targets,
                     source_to_target(vocab), vocab.tgt_size)


def describe(shortlist: Shortlist) -> str:
    """``8,123 source pieces, 512 always-candidates, 301 candidates a piece on average``, for the logs."""
    keys = shortlist.keys()
    mean = shortlist.targets.size / keys if keys else 0.0
    return (f"{counted(keys, 'source piece', spec=',')}, {counted(shortlist.always.size, 'always-candidate', spec=',')}"
            f", {mean:.1f} candidates a piece on average")

"""Word alignments out of cross-attention, in the Pharaoh format of Moses, fast_align, eflomal and Marian.

A word is a whitespace token (``str.split``'s) of the input line and of the detokenized output. The
engines give, for each (source, output) pair, one attention matrix over pieces: row ``t`` the decoder
position that predicted output piece ``t``, column ``s`` source position ``s`` (tags and EOS included).
:func:`word_alignment` aggregates it to words as Garg et al. (2019) and fairseq do: a source word's
weight is the sum over its pieces, a target word's row the mean over its pieces; columns of no word
(a tag, EOS) are left out and each row renormalized. Then either ``hard`` (each target word aligned to
its most attended source word) or ``soft`` (every pair of weight at least a threshold).

Which attention: the guided-alignment head of a model trained with one
(``train.guided_alignment``), else the mean of the heads of one decoder layer (the penultimate by
default: Garg et al. find it best for a 6-layer model; :func:`default_layer`).

The word of each piece comes from SentencePiece's own offsets (:meth:`mtkit.data.vocab.Vocab.src_words`,
``tgt_words``), so normalization (NFKC, case folding, collapsed spaces) never shifts a word.

No torch here: the CTranslate2 path never loads it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from mtkit.errors import MtkitError

ALIGNMENTS = ("off", "hard", "soft")


def word_spans(text: str, encoding: str | None = None) -> list[tuple[int, int]]:
    """The spans ``[begin, end)`` of ``text.split()``'s words, in characters, or in bytes of ``encoding``."""
    spans, begin, offset = [], None, 0
    for ch in text:
        if ch.isspace():
            if begin is not None:
                spans.append((begin, offset))
                begin = None
        elif begin is None:
            begin = offset
        offset += len(ch.encode(encoding, "surrogatepass")) if encoding else 1
    if begin is not None:
        spans.append((begin, offset))
    return spans


def piece_words(text: str, pieces: Sequence[tuple[int, int]]) -> list[int]:
    """The word (index into ``text.split()``) of each piece, from the pieces' UTF-8 byte spans in ``text``:
    the word holding the piece's first non-space byte; a piece of spaces only (a lone ``▁``) belongs to the
    word after it; -1 where there is none."""
    spans = word_spans(text, "utf-8")
    encoded = text.encode("utf-8", "surrogatepass")
    found, w = [], 0
    for begin, end in pieces:
        first = begin
        while first < end and first < len(encoded) and encoded[first:first + 1].isspace():
            first += 1
        while w < len(spans) and spans[w][1] <= first:
            w += 1
        found.append(w if w < len(spans) else -1)
    return found


def default_layer(layers: int) -> int:
    """The decoder layer whose mean attention aligns when none is asked: the penultimate (Garg et al. 2019,
    Table 2: layer 5 of 6), the only one of a one-layer decoder. 0-based."""
    return max(0, layers - 2)


def guided_head(config) -> tuple[int, int] | None:
    """The (layer, head) a model was trained to align with (``train.guided_alignment`` of its config), 0-based;
    None for one trained without."""
    guided = getattr(getattr(config, "train", None), "guided_alignment", None)
    if guided is None or not guided.weight:
        return None
    return guided.layer % config.model.decoder_layers, guided.head


def check_layer(layer: int, layers: int, flag: str = "--alignment-layer") -> int:
    """``layer`` (negative counts from the end) as a 0-based index, or a one-line error naming ``flag``."""
    if not -layers <= layer < layers:
        raise MtkitError(f"{flag} {layer}: the model has {layers} decoder layers "
                         f"(0 to {layers - 1}, or -{layers} to -1 from the end)")
    return layer % layers


def word_alignment(attention: np.ndarray, src_words: Sequence[int], tgt_words: Sequence[int],
                   mode: str = "hard", threshold: float = 0.5) -> list[tuple[int, int]]:
    """The (source word, target word) pairs of one sentence, sorted.

    Args:
        attention: (T, S) weights, rows the output pieces (an EOS row beyond ``len(tgt_words)`` is ignored),
            columns the source positions.
        src_words: the source word of each column (-1: none, e.g. a tag or EOS).
        tgt_words: the target word of each output piece (-1: none).
        mode: ``hard`` (one source word per target word, its most attended) or ``soft`` (every pair whose
            renormalized weight is at least ``threshold``).
    """
    n_src = max(src_words, default=-1) + 1
    n_tgt = max(tgt_words, default=-1) + 1
    if n_src == 0 or n_tgt == 0:
        return []
    weights = np.asarray(attention, dtype=np.float64)[: len(tgt_words), : len(src_words)]
    cols = np.asarray(src_words)
    rows = np.asarray(tgt_words[: weights.shape[0]])
    by_src = np.zeros((weights.shape[0], n_src))
    keep = cols >= 0
    np.add.at(by_src.T, cols[keep], weights[:, keep].T)  # sum over each source word's pieces
    grid = np.zeros((n_tgt, n_src))
    counts = np.zeros(n_tgt)
    has = rows >= 0
    np.add.at(grid, rows[has], by_src[has])
    np.add.at(counts, rows[has], 1)
    grid /= np.maximum(counts, 1)[:, None]  # mean over each target word's pieces
    grid /= np.maximum(grid.sum(axis=1, keepdims=True), 1e-30)
    if mode == "hard":
        pairs = [(int(s), t) for t, s in enumerate(grid.argmax(axis=1)) if counts[t] > 0]
    elif mode == "soft":
        pairs = [(int(s), int(t)) for t, s in zip(*np.nonzero(grid >= threshold), strict=True)]
    else:
        raise MtkitError(f"unknown alignment mode {mode!r}; expected hard or soft")
    return sorted(pairs)


def pharaoh(pairs: Sequence[tuple[int, int]]) -> str:
    """``0-0 1-2 ...``: source word - target word, 0-based."""
    return " ".join(f"{s}-{t}" for s, t in pairs)


_PHARAOH_ITEM = re.compile(r"\S+")


def parse_pharaoh(line: str, n_src: int, n_tgt: int, where: str) -> list[tuple[int, int]]:
    """The distinct pairs of one Pharaoh line, sorted, each checked against the sentence's word counts; a
    one-line error naming ``where`` (file and line) otherwise. A pair given twice counts once, so that what a
    line yields is at most ``n_src * n_tgt`` pairs however long the line (memory bounded by the sentence)."""
    pairs: set[tuple[int, int]] = set()
    for match in _PHARAOH_ITEM.finditer(line):  # not split(): a long line of repeats stays one string
        item = match.group()
        s, sep, t = item.partition("-")
        if not (sep and (s + t).isascii() and s.isdigit() and t.isdigit() and len(s) <= 9 and len(t) <= 9):
            raise MtkitError(f"{where}: {item[:40]!r} is not a Pharaoh pair (source-target, e.g. 0-1)")
        if int(s) >= n_src or int(t) >= n_tgt:
            raise MtkitError(f"{where}: pair {item} names a word beyond the sentence "
                             f"({n_src} source and {n_tgt} target words)")
        pairs.add((int(s), int(t)))
    return sorted(pairs)


_NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def symmetrize(forward: Sequence[tuple[int, int]], backward: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """grow-diag-final-and (Koehn et al. 2005, Moses' and fast_align's ``atools``) of two directional
    alignments of one sentence pair, both as (source, target) pairs: their intersection, grown by the union's
    neighbouring points (diagonals included) that align a word not yet aligned, then the union's points whose
    two words are both still unaligned."""
    fwd, bwd = set(forward), set(backward)
    union = fwd | bwd
    found = fwd & bwd
    src_aligned = {s for s, _ in found}
    tgt_aligned = {t for _, t in found}

    def add(s: int, t: int) -> None:
        found.add((s, t))
        src_aligned.add(s)
        tgt_aligned.add(t)

    grown = True
    while grown:
        grown = False
        for s, t in sorted(found):
            for ds, dt in _NEIGHBOURS:
                point = (s + ds, t + dt)
                if point in union and point not in found and (
                        point[0] not in src_aligned or point[1] not in tgt_aligned):
                    add(*point)
                    grown = True
    for directional in (fwd, bwd):
        for s, t in sorted(directional):
            if s not in src_aligned and t not in tgt_aligned:
                add(s, t)
    return sorted(found)


def scores(found: Sequence[Sequence[tuple[int, int]]], reference: Sequence[Sequence[tuple[int, int]]]) -> dict:
    """Precision, recall, F1 and the alignment error rate of ``found`` against ``reference`` (per sentence
    pair sets; every reference link taken as sure and possible: AER = 1 - F1, Och & Ney 2003)."""
    hits = sum(len(set(a) & set(r)) for a, r in zip(found, reference, strict=True))
    n_found = sum(len(set(a)) for a in found)
    n_ref = sum(len(set(r)) for r in reference)
    precision = hits / n_found if n_found else 0.0
    recall = hits / n_ref if n_ref else 0.0
    f1 = 2 * hits / (n_found + n_ref) if n_found + n_ref else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "aer": 1 - f1}

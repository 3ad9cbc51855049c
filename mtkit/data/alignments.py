"""Word alignments of the training pairs, for guided-alignment training (``data.alignments``,
``train.guided_alignment``; Garg et al. 2019).

Where they come from: eflomal (Östling & Tiedemann 2016; ``data.alignments: eflomal``), run on blocks of
:data:`EFLOMAL_BLOCK` normalized pairs in both directions and symmetrized with grow-diag-final-and
(:func:`mtkit.data.word_alignment.symmetrize`), so that memory stays bounded whatever the corpus size; or a
Pharaoh file given by the user (a line per pair of ``data.train``, in order).

How they are stored: per kept training pair, the (source piece, target piece) links that its word links
imply (every piece of an aligned source word with every piece of the target word), in a store beside the
pairs' own, three files::

  train.align.bin       uint16 (source piece, target piece) pairs, all pairs' links concatenated
  train.align.idx.npy   int64 offsets in links, (N + 1,): pair i is bin[idx[i]:idx[i+1]]
  train.align.json      format and count

:class:`AlignmentStore` maps them and checks that they agree with the pairs' store (sizes, offsets, and
every link of a pair read inside its sentence lengths) with work bounded by the files' sizes.
"""

from __future__ import annotations

import itertools
import json
import tempfile
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from mtkit.data.store import _load_array
from mtkit.data.word_alignment import parse_pharaoh, pharaoh, symmetrize
from mtkit.errors import MtkitError, counted, shown
from mtkit.io import MAX_CONFIG_BYTES, decode_line, open_binary, read_json_file

EFLOMAL = "eflomal"
EFLOMAL_BLOCK = 100_000  # pairs aligned together (eflomal holds a block in memory; more pairs, better links)
ALIGN_FORMAT = 1
LINK_DTYPE = np.uint16  # piece positions: sentences are at most MAX_LENGTH = 2**16 pieces
_RERUN = "run mtkit prepare again"
_CHECK_BLOCK = 1 << 16  # pairs whose links are checked together when a store opens


def piece_links(word_pairs: Iterable[tuple[int, int]], src_words: Sequence[int], tgt_words: Sequence[int]
                ) -> np.ndarray:
    """The (source piece, target piece) links of word links, given the word of each piece (-1: none), (K, 2)
    :data:`LINK_DTYPE`. Distinct word links give distinct piece links: K is at most the pair's source pieces
    times its target pieces, whatever the word links repeat."""
    src_pieces: dict[int, list[int]] = {}
    tgt_pieces: dict[int, list[int]] = {}
    for k, w in enumerate(src_words):
        src_pieces.setdefault(w, []).append(k)
    for k, w in enumerate(tgt_words):
        tgt_pieces.setdefault(w, []).append(k)
    blocks = [np.stack(np.meshgrid(src_pieces[ws], tgt_pieces[wt], indexing="ij"), axis=-1).reshape(-1, 2)
              for ws, wt in dict.fromkeys(word_pairs) if ws in src_pieces and wt in tgt_pieces]
    return np.concatenate(blocks).astype(LINK_DTYPE) if blocks else np.zeros((0, 2), dtype=LINK_DTYPE)


def eflomal_blocks(pairs: Iterable[tuple[str, str]], block: int = EFLOMAL_BLOCK
                   ) -> Iterator[tuple[tuple[str, str], str]]:
    """Each pair with its symmetrized eflomal alignment (a Pharaoh line), ``block`` pairs aligned at a time."""
    it = iter(pairs)
    while chunk := list(itertools.islice(it, block)):
        yield from zip(chunk, eflomal_align([s for s, _ in chunk], [t for _, t in chunk]), strict=True)


def eflomal_align(srcs: Sequence[str], tgts: Sequence[str]) -> list[str]:
    """grow-diag-final-and of eflomal's forward and reverse alignments of whitespace words, a Pharaoh line each.
    eflomal's Gibbs sampler takes no seed from outside: two runs may differ in a few links."""
    try:
        import eflomal
    except ImportError:
        raise MtkitError("data.alignments: eflomal is not installed; pip install 'mtkit[align]' "
                         "(or give a Pharaoh file)") from None

    with tempfile.TemporaryDirectory(prefix="mtkit-eflomal-") as tmp:
        fwd, rev = Path(tmp, "fwd"), Path(tmp, "rev")
        # eflomal's tokens are whitespace words; an empty side gives an empty line (no links)
        eflomal.Aligner().align([" ".join(s.split()) for s in srcs], [" ".join(t.split()) for t in tgts],
                                links_filename_fwd=str(fwd), links_filename_rev=str(rev), quiet=True)
        forward = fwd.read_text(encoding="utf-8").split("\n")
        backward = rev.read_text(encoding="utf-8").split("\n")
    found = []
    for k, (s, t) in enumerate(zip(srcs, tgts, strict=True)):
        n_src, n_tgt = len(s.split()), len(t.split())
        one = parse_pharaoh(forward[k], n_src, n_tgt, f"eflomal's forward alignment of pair {k + 1}")
        other = parse_pharaoh(backward[k], n_src, n_tgt, f"eflomal's reverse alignment of pair {k + 1}")
        found.append(pharaoh(symmetrize(one, other)))
    return found


def file_alignments(pairs: Iterable[tuple[str, str]], path: Path) -> Iterator[tuple[tuple[str, str], str]]:
    """Each pair with its line of the Pharaoh file ``path`` (checked when the pair is encoded); a file with
    fewer or more lines than there are pairs is a one-line error."""
    with open_binary(path) as f:
        lines = (decode_line(raw, str(path), number).rstrip("\r\n") for number, raw in enumerate(f, start=1))
        count = 0
        for pair in pairs:
            line = next(lines, None)
            if line is None:
                raise MtkitError(f"data.alignments {path}: {counted(count, 'line')}, fewer than data.train's pairs")
            count += 1
            yield pair, line
        if next(lines, None) is not None:
            raise MtkitError(f"data.alignments {path}: more lines than data.train's {counted(count, 'pair')}")


class AlignmentWriter:
    """Appends the links of encoded pairs; ``close()`` writes the index (only the link counts stay in memory)."""

    def __init__(self, out_dir: Path, split: str) -> None:
        self.out_dir = Path(out_dir)
        self.split = split
        self._file = open(self.out_dir / f"{split}.align.bin", "wb")
        self._counts = array("q")

    def add_batch(self, links: np.ndarray, counts: np.ndarray) -> None:
        """Links (K, 2) of a batch of pairs, ``counts`` (B,) of them per pair."""
        self._file.write(np.ascontiguousarray(links, dtype=LINK_DTYPE).tobytes())
        self._counts.extend(np.asarray(counts, dtype=np.int64).tolist())

    def close(self) -> dict:
        self._file.close()
        counts = np.frombuffer(self._counts, dtype=np.int64) if len(self._counts) else np.zeros(0, np.int64)
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        np.save(self.out_dir / f"{self.split}.align.idx.npy", offsets)
        meta = {"format": ALIGN_FORMAT, "count": len(counts)}
        (self.out_dir / f"{self.split}.align.json").write_text(json.dumps(meta) + "\n", encoding="utf-8")
        return {"links": int(offsets[-1]), "aligned_pairs": int((counts > 0).sum())}


class AlignmentStore:
    """Read-only, memory-mapped links of one split, checked against its pairs' store."""

    def __init__(self, links: np.ndarray, offsets: np.ndarray) -> None:
        self._links = links  # (K, 2) uint16
        self._offsets = offsets  # (N + 1,) int64

    @classmethod
    def open(cls, out_dir: Path, split: str, pairs) -> AlignmentStore:
        """Map the links of ``split`` for ``pairs`` (its :class:`mtkit.data.store.ParallelStore`); a missing or
        damaged store is a one-line error. The checks read the metadata, the index and the links once,
        bounded by the files' own sizes."""
        out_dir = Path(out_dir)
        meta_path = out_dir / f"{split}.align.json"
        if not meta_path.is_file():
            raise MtkitError(f"{out_dir}: no word alignments of the '{split}' pairs ({meta_path.name} missing); "
                             "set data.alignments (eflomal or a Pharaoh file) and run mtkit prepare")
        meta = read_json_file(meta_path, MAX_CONFIG_BYTES, "alignment store metadata")
        if not isinstance(meta, dict) or meta.get("format") != ALIGN_FORMAT:
            raise MtkitError(f"{meta_path}: not an mtkit alignment store of format {ALIGN_FORMAT}; {_RERUN}")
        count = meta.get("count")
        if type(count) is not int or count != len(pairs):
            raise MtkitError(f"{meta_path}: count {shown(count)}, but the '{split}' store holds "
                             f"{counted(len(pairs), 'pair')}; {_RERUN}")

        offsets = _load_array(out_dir / f"{split}.align.idx.npy", np.int64, count + 1, meta_path.name, count)
        bin_path = out_dir / f"{split}.align.bin"
        size = bin_path.stat().st_size if bin_path.is_file() else -1
        total = int(offsets[-1]) if len(offsets) else 0
        if int(offsets[0]) != 0 or size != total * 2 * np.dtype(LINK_DTYPE).itemsize or np.any(np.diff(offsets) < 0):
            raise MtkitError(f"{bin_path}: {size} bytes and offsets from {int(offsets[0])} to {total} disagree "
                             f"(truncated or damaged; {_RERUN})")
        links = (np.memmap(bin_path, dtype=LINK_DTYPE, mode="r").view(np.ndarray).reshape(-1, 2) if size
                 else np.zeros((0, 2), dtype=LINK_DTYPE))
        # every link inside its pair's lengths (EOS is never linked), a block of pairs at a time
        for start in range(0, count, _CHECK_BLOCK):
            end = min(count, start + _CHECK_BLOCK)
            owner = np.repeat(np.arange(start, end), np.diff(offsets[start : end + 1]))
            block = links[int(offsets[start]) : int(offsets[end])]
            if np.any(block[:, 0] >= pairs.src_lengths[owner]) or np.any(block[:, 1] >= pairs.tgt_lengths[owner]):
                raise MtkitError(f"{bin_path}: a link points past its sentence (damaged; {_RERUN})")
        return cls(links, offsets)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def links(self, i: int) -> np.ndarray:
        """The (source piece, target piece) links of pair ``i``, (k, 2) int64."""
        start, end = self._offsets[i : i + 2].tolist()
        return self._links[start:end].astype(np.int64)

"""The binarized parallel store: token ids in flat memory-mapped files plus an offsets index.

One split is seven files in the prepared directory::

  {split}.src.bin  {split}.tgt.bin            all ids of a side, concatenated (no bos/eos)
  {split}.src.idx.npy  {split}.tgt.idx.npy    int64 offsets, (N + 1,): example i is bin[idx[i]:idx[i+1]]
  {split}.src.len.npy  {split}.tgt.len.npy    int32 lengths, (N,), precomputed for length bucketing
  {split}.store.json                          count and the id dtype (uint16 if the vocabulary fits)

``ParallelStore.open`` checks that these files agree (sizes and the first and
last offsets, a few page reads whatever the store's size), so that a truncated
or damaged store is a one-line error, not silently empty sentences in training.
The prepared directory's ``manifest.json`` is read by :func:`load_manifest`.

A NumPy memmap and not ``datasets`` Arrow files: both map the files and read only the
pages a batch touches, but the memmap measured several times faster at batch assembly, with
no pyarrow in every data-loader worker and no dependency beyond NumPy (benchmarks/README.md,
design measurements).
"""

from __future__ import annotations

import json
from array import array
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mtkit.errors import MtkitError, counted, shown
from mtkit.io import MAX_CONFIG_BYTES, read_json_file

SIDES = ("src", "tgt")
STORE_FORMAT = 1
ID_DTYPES = ("uint16", "int32")  # what id_dtype() chooses
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
_RERUN = "run mtkit prepare again"


def _read_json(path: Path, what: str) -> Any:
    if not path.exists() and not path.is_symlink():
        raise MtkitError(f"{path}: missing ({what}); {_RERUN}")
    try:
        return read_json_file(path, MAX_CONFIG_BYTES, "data manifest")
    except MtkitError as e:
        raise MtkitError(f"{e}; {_RERUN}") from None


def _check_format(path: Path, meta: Any, known: int) -> None:
    if not isinstance(meta, dict):
        raise MtkitError(f"{path}: expected a JSON object, found {type(meta).__name__}; {_RERUN}")
    version = meta.get("format")
    if type(version) is not int or version < 1:
        raise MtkitError(f"{path}: no valid 'format' key (found {shown(version)}); not written by mtkit prepare")
    if version > known:
        raise MtkitError(f"{path}: format {version} is newer than this mtkit reads ({known});"
                         f" upgrade mtkit or {_RERUN}")


def load_manifest(data_dir: Path) -> dict:
    """The ``manifest.json`` of a prepared directory, checked to be one mtkit can read.

    Raises :class:`MtkitError` (one line, naming the file) when the directory or its
    manifest is missing, the manifest is not a JSON object, or its format is unknown.
    """
    data_dir = Path(data_dir)
    path = data_dir / MANIFEST
    if not data_dir.is_dir():
        raise MtkitError(f"{data_dir}: no such directory; run mtkit prepare first")
    if not path.is_file():
        raise MtkitError(f"{data_dir}: not a prepared data directory (no {MANIFEST}); run mtkit prepare first")
    manifest = _read_json(path, "the prepared directory's manifest")
    _check_format(path, manifest, MANIFEST_FORMAT)
    return manifest


def id_dtype(vocab_size: int) -> np.dtype:
    """The smallest id dtype for a vocabulary: uint16 halves disk and page-cache traffic."""
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


class ParallelStoreWriter:
    """Appends encoded pairs to one split's files; ``close()`` writes the index (call it last).

    Only the lengths stay in memory (4 bytes per example and side).
    """

    def __init__(self, out_dir: Path, split: str, dtype: np.dtype) -> None:
        self.out_dir = Path(out_dir)
        self.split = split
        self.dtype = np.dtype(dtype)
        self._files: dict[str, BinaryIO] = {
            side: open(self.out_dir / f"{split}.{side}.bin", "wb") for side in SIDES
        }
        self._lengths = {side: array("i") for side in SIDES}

    def add_batch(self, src_ids: np.ndarray, src_lens: np.ndarray, tgt_ids: np.ndarray, tgt_lens: np.ndarray) -> None:
        """Append a batch given as flat ids ``(sum(lens),)`` and lengths ``(B,)`` per side."""
        for side, ids, lens in (("src", src_ids, src_lens), ("tgt", tgt_ids, tgt_lens)):
            self._files[side].write(np.asarray(ids, dtype=self.dtype).tobytes())
            self._lengths[side].extend(np.asarray(lens, dtype=np.int32).tolist())

    def add(self, src_ids: list[int], tgt_ids: list[int]) -> None:
        """Append one pair of id lists."""
        self.add_batch(np.asarray(src_ids), np.asarray([len(src_ids)]), np.asarray(tgt_ids), np.asarray([len(tgt_ids)]))

    def __len__(self) -> int:
        return len(self._lengths["src"])

    def close(self) -> dict:
        """Flush the ids and write the index; return the split's statistics."""
        stats: dict = {"pairs": len(self)}
        for side in SIDES:
            self._files[side].close()
            lens = np.frombuffer(self._lengths[side], dtype=np.int32) if len(self) else np.zeros(0, np.int32)
            offsets = np.zeros(len(lens) + 1, dtype=np.int64)
            np.cumsum(lens, out=offsets[1:])
            np.save(self.out_dir / f"{self.split}.{side}.idx.npy", offsets)
            np.save(self.out_dir / f"{self.split}.{side}.len.npy", lens)
            stats[f"{side}_tokens"] = int(offsets[-1])
            stats[f"{side}_mean_tokens"] = round(float(lens.mean()), 2) if len(lens) else 0.0
            stats[f"{side}_max_tokens"] = int(lens.max()) if len(lens) else 0
        meta = {"format": STORE_FORMAT, "count": len(self), "dtype": self.dtype.name}
        (self.out_dir / f"{self.split}.store.json").write_text(json.dumps(meta) + "\n", encoding="utf-8")
        return stats


class ParallelStore:
    """Read-only, memory-mapped view of one split: nothing is loaded whole into RAM."""

    def __init__(self, src: np.ndarray, tgt: np.ndarray, src_offsets: np.ndarray, tgt_offsets: np.ndarray,
                 src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> None:
        self._ids = {"src": src, "tgt": tgt}
        self._offsets = {"src": src_offsets, "tgt": tgt_offsets}
        self.src_lengths = src_lengths  # (N,) int32, memory-mapped
        self.tgt_lengths = tgt_lengths  # (N,) int32, memory-mapped

    @classmethod
    def open(cls, out_dir: Path, split: str) -> ParallelStore:
        """Map one split's files after checking that they agree; a damaged store raises MtkitError.

        The checks read only the metadata, the array headers and two offsets per side,
        so opening stays cheap for any store size.
        """
        out_dir = Path(out_dir)
        meta_path = out_dir / f"{split}.store.json"
        if not meta_path.is_file():
            raise MtkitError(f"{out_dir}: no '{split}' split ({meta_path.name} missing); run 'mtkit prepare' first")
        meta = _read_json(meta_path, f"the '{split}' store's metadata")
        _check_format(meta_path, meta, STORE_FORMAT)
        count, dtype_name = meta.get("count"), meta.get("dtype")
        if type(count) is not int or count < 0:
            raise MtkitError(f"{meta_path}: 'count' must be a non-negative integer, found {shown(count)}; {_RERUN}")
        if dtype_name not in ID_DTYPES:
            raise MtkitError(f"{meta_path}: 'dtype' must be one of {', '.join(ID_DTYPES)},"
                             f" found {shown(dtype_name)}; {_RERUN}")
        dtype = np.dtype(dtype_name)
        arrays = {}
        for side in SIDES:
            offsets = _load_array(out_dir / f"{split}.{side}.idx.npy", np.int64, count + 1, meta_path.name, count)
            lengths = _load_array(out_dir / f"{split}.{side}.len.npy", np.int32, count, meta_path.name, count)
            start, end = int(offsets[0]), int(offsets[-1])
            if start != 0 or end < 0:
                raise MtkitError(f"{out_dir / f'{split}.{side}.idx.npy'}: offsets run from {start} to {end},"
                                 f" expected 0 to the number of ids (damaged; {_RERUN})")
            bin_path = out_dir / f"{split}.{side}.bin"
            try:
                size = bin_path.stat().st_size
            except FileNotFoundError:
                raise MtkitError(f"{bin_path}: missing (the '{split}' store's ids); {_RERUN}") from None
            if size != end * dtype.itemsize:
                raise MtkitError(f"{bin_path}: {size} bytes, the index expects {end * dtype.itemsize}"
                                 f" (truncated or damaged; {_RERUN})")
            # np.memmap refuses empty files; an empty split is a valid (if useless) store.
            if size:
                # A plain ndarray view of the map: slicing a np.memmap subclass costs ~5x more.
                arrays[side] = np.memmap(bin_path, dtype=dtype, mode="r").view(np.ndarray)
            else:
                arrays[side] = np.zeros(0, dtype=dtype)
            arrays[f"{side}_idx"], arrays[f"{side}_len"] = offsets, lengths
        return cls(arrays["src"], arrays["tgt"], arrays["src_idx"], arrays["tgt_idx"],
                   arrays["src_len"], arrays["tgt_len"])

    def __len__(self) -> int:
        return len(self.src_lengths)

    def _get(self, side: str, i: int) -> np.ndarray:
        start, end = self._offsets[side][i:i + 2].tolist()
        return self._ids[side][start:end].astype(np.int64)

    def src(self, i: int) -> np.ndarray:
        """Source ids of example ``i``, ``(src_lengths[i],)`` int64, without bos/eos."""
        return self._get("src", i)

    def tgt(self, i: int) -> np.ndarray:
        """Target ids of example ``i``, ``(tgt_lengths[i],)`` int64, without bos/eos."""
        return self._get("tgt", i)


def _load_array(path: Path, dtype: type, entries: int, meta_name: str, count: int) -> np.ndarray:
    """Map a 1-D ``.npy`` file, checking its dtype and length against the store's metadata."""
    try:
        array_ = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise MtkitError(f"{path}: missing (part of the store's index); {_RERUN}") from None
    except (OSError, ValueError, EOFError) as e:
        # ValueError covers a bad header and data shorter than the header promises.
        raise MtkitError(f"{path}: not a readable NumPy array ({str(e).strip().splitlines()[0]});"
                         f" {_RERUN}") from None
    if array_.dtype != np.dtype(dtype) or array_.ndim != 1:
        raise MtkitError(f"{path}: a {array_.dtype} array of shape {array_.shape}, expected 1-D"
                         f" {np.dtype(dtype).name} (damaged; {_RERUN})")
    if len(array_) != entries:
        raise MtkitError(f"{path}: {counted(len(array_), 'entry', 'entries')}, expected {entries} for the "
                         f"{counted(count, 'pair')}"
                         f" {meta_name} records (damaged; {_RERUN})")
    return array_.view(np.ndarray)

"""The memory-mapped store: round trip, lengths, dtypes, empty splits, damage found on open; the manifest loader."""

import numpy as np
import pytest

from mtkit.data.store import ParallelStore, ParallelStoreWriter, id_dtype, load_manifest
from mtkit.errors import MtkitError


@pytest.mark.parametrize("vocab_size", [8000, 100_000])
def test_round_trip(tmp_path, vocab_size):
    rng = np.random.default_rng(0)
    def ids(min_len):
        return rng.integers(4, vocab_size, rng.integers(min_len, 20)).tolist()

    pairs = [(ids(0), ids(1)) for _ in range(300)]
    writer = ParallelStoreWriter(tmp_path, "train", id_dtype(vocab_size))
    for s, t in pairs[:100]:
        writer.add(s, t)
    rest = pairs[100:]
    writer.add_batch(
        np.concatenate([np.asarray(s, dtype=np.int64) for s, _ in rest]), np.array([len(s) for s, _ in rest]),
        np.concatenate([np.asarray(t, dtype=np.int64) for _, t in rest]), np.array([len(t) for _, t in rest]),
    )
    stats = writer.close()
    assert stats["pairs"] == 300
    assert stats["src_max_tokens"] == max(len(s) for s, _ in pairs)

    store = ParallelStore.open(tmp_path, "train")
    assert len(store) == 300
    assert store.src_lengths.tolist() == [len(s) for s, _ in pairs]
    assert store.tgt_lengths.tolist() == [len(t) for _, t in pairs]
    for i in (0, 99, 100, 157, 299):
        assert store.src(i).tolist() == pairs[i][0]
        assert store.tgt(i).tolist() == pairs[i][1]
        assert store.src(i).dtype in (np.int64, np.int32)


def test_empty_store_and_missing_split(tmp_path):
    ParallelStoreWriter(tmp_path, "valid", np.uint16).close()
    assert len(ParallelStore.open(tmp_path, "valid")) == 0
    with pytest.raises(MtkitError, match="no 'test' split"):
        ParallelStore.open(tmp_path, "test")


def test_id_dtype():
    assert id_dtype(65536) == np.uint16
    assert id_dtype(65537) == np.int32


def write_store(folder, n=50):
    rng = np.random.default_rng(1)
    writer = ParallelStoreWriter(folder, "train", np.uint16)
    for _ in range(n):
        writer.add(rng.integers(4, 100, rng.integers(1, 9)).tolist(), rng.integers(4, 100, rng.integers(1, 9)).tolist())
    writer.close()
    return folder


def truncate(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


DAMAGE = {
    "bin truncated": (lambda d: truncate(d / "train.src.bin", 10),
                      r"train\.src\.bin: 10 bytes, the index expects \d+"
                      r" \(truncated or damaged; run mtkit prepare again\)$"),
    "bin grown": (lambda d: (d / "train.tgt.bin").write_bytes((d / "train.tgt.bin").read_bytes() + b"\0\0"),
                  r"train\.tgt\.bin: \d+ bytes, the index expects \d+ \(truncated or damaged"),
    "bin missing": (lambda d: (d / "train.tgt.bin").unlink(), r"train\.tgt\.bin: missing"),
    "idx missing": (lambda d: (d / "train.src.idx.npy").unlink(), r"train\.src\.idx\.npy: missing"),
    "idx truncated": (lambda d: truncate(d / "train.tgt.idx.npy", 140),
                      r"train\.tgt\.idx\.npy: not a readable NumPy array"),
    "len not npy": (lambda d: (d / "train.src.len.npy").write_text("{broken"),
                    r"train\.src\.len\.npy: not a readable NumPy"),
    "len wrong length": (lambda d: np.save(d / "train.tgt.len.npy", np.zeros(3, np.int32)),
                         r"train\.tgt\.len\.npy: 3 entries, expected 50 for the 50 pairs train\.store\.json records"),
    "idx wrong dtype": (lambda d: np.save(d / "train.src.idx.npy", np.zeros(51, np.float32)),
                        r"train\.src\.idx\.npy: a float32 array of shape \(51,\), expected 1-D int64"),
    "idx not from 0": (lambda d: np.save(d / "train.src.idx.npy", np.load(d / "train.src.idx.npy") + 1),
                       r"train\.src\.idx\.npy: offsets run from 1 to"),
    "store.json broken": (lambda d: (d / "train.store.json").write_text("{broken"),
                          r"train\.store\.json: not valid JSON \(.*\); run mtkit prepare again$"),
    "store.json count": (lambda d: (d / "train.store.json").write_text('{"format": 1, "count": 60, "dtype": "uint16"}'),
                         r"train\.src\.idx\.npy: 51 entries, expected 61 for the 60 pairs"),
    "store.json dtype": (lambda d: (d / "train.store.json").write_text('{"format": 1, "count": 50, "dtype": "f8"}'),
                         r"train\.store\.json: 'dtype' must be one of uint16, int32, found 'f8'"),
    "store.json newer": (lambda d: (d / "train.store.json").write_text('{"format": 7, "count": 50, "dtype": "uint16"}'),
                         r"train\.store\.json: format 7 is newer than this mtkit reads \(1\)"),
    "store.json list": (lambda d: (d / "train.store.json").write_text("[1]"),
                        r"train\.store\.json: expected a JSON object, found list"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_store_is_a_one_line_error_naming_the_file(tmp_path, damage):
    folder = write_store(tmp_path)
    assert len(ParallelStore.open(folder, "train")) == 50
    harm, message = DAMAGE[damage]
    harm(folder)
    with pytest.raises(MtkitError, match=message) as e:
        ParallelStore.open(folder, "train")
    assert "\n" not in str(e.value) and str(folder) in str(e.value)


MANIFESTS = {
    "missing": (None, r"out: not a prepared data directory \(no manifest\.json\); run mtkit prepare first"),
    "broken": ("{broken", r"out/manifest\.json: not valid JSON \(.*\); run mtkit prepare again$"),
    "not a dict": ("[1, 2]", r"out/manifest\.json: expected a JSON object, found list"),
    "no format": ('{"splits": {}}', r"out/manifest\.json: no valid 'format' key \(found None\)"),
    "newer": ('{"format": 2}', r"out/manifest\.json: format 2 is newer than this mtkit reads \(1\)"),
}


@pytest.mark.parametrize("case", list(MANIFESTS))
def test_load_manifest_refuses_what_it_cannot_read(tmp_path, case):
    out = tmp_path / "out"
    out.mkdir()
    text, message = MANIFESTS[case]
    if text is not None:
        (out / "manifest.json").write_text(text)
    with pytest.raises(MtkitError, match=message):
        load_manifest(out)


def test_load_manifest_reads_a_good_one_and_names_a_missing_dir(tmp_path):
    (tmp_path / "manifest.json").write_text('{"format": 1, "splits": {"train": {"pairs": 3}}}')
    assert load_manifest(tmp_path)["splits"]["train"]["pairs"] == 3
    with pytest.raises(MtkitError, match=r"gone: no such directory"):
        load_manifest(tmp_path / "gone")

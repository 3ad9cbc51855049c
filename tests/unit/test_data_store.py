"""The memory-mapped store: round trip, lengths, dtypes, empty splits."""

import numpy as np
import pytest

from mtkit.data.store import ParallelStore, ParallelStoreWriter, id_dtype
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

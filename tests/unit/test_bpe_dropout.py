"""BPE-dropout of training sentences: real SentencePiece sampling, seeded per batch, lossless, sized batches."""

import numpy as np
import pytest
from conftest import ListStore

from mtkit.config import PAD_ID, UNK_ID, SpmConfig
from mtkit.data.synthetic import demo_pairs
from mtkit.data.vocab import Vocab, train_model
from mtkit.errors import MtkitError
from mtkit.training.batching import TokenBatchSampler, pad_batch, prefetch, repack
from mtkit.training.bpe_dropout import BPEDropout, scaled_lengths

PAIRS = list(demo_pairs(600, seed=11))


def encoded_store(vocab: Vocab, pairs) -> ListStore:
    return ListStore([(vocab.encode_src(s), vocab.encode_tgt(t)) for s, t in pairs])


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    return Vocab.from_bytes(train_model([s for p in PAIRS for s in p], SpmConfig(vocab_size=400)))


def test_sampled_segmentations_decode_to_the_same_text_and_differ(vocab):
    store = encoded_store(vocab, PAIRS[:200])
    dropout = BPEDropout(vocab, 0.1, seed=1)
    stored = [store.src(i) for i in range(200)]
    srcs, tgts = dropout(stored, [store.tgt(i) for i in range(200)])
    assert [vocab.decode_src(s) for s in srcs] == [p[0] for p in PAIRS[:200]]
    assert [vocab.decode_tgt(t) for t in tgts] == [p[1] for p in PAIRS[:200]]
    changed = sum(list(a) != list(b) for a, b in zip(srcs, stored))
    assert changed > 50  # most sentences get another segmentation
    assert sum(map(len, srcs)) > sum(map(len, stored))  # skipped merges: more, shorter pieces


def test_each_reading_draws_a_new_segmentation(vocab):
    store = encoded_store(vocab, PAIRS[:50])
    dropout = BPEDropout(vocab, 0.1, seed=1)
    batch = ([store.src(i) for i in range(50)], [store.tgt(i) for i in range(50)])
    as_lists = lambda pair: [[list(map(int, s)) for s in side] for side in pair]  # noqa: E731
    assert as_lists(dropout(*batch)) != as_lists(dropout(*batch))


def test_unknown_pieces_and_overlong_samples_keep_the_stored_ids(vocab):
    ids = np.asarray(vocab.encode_src(PAIRS[0][0]), dtype=np.uint16)
    with_unk = np.concatenate([ids, np.array([UNK_ID], dtype=np.uint16)])
    short = BPEDropout(vocab, 0.5, seed=1, max_len=len(ids))  # any longer segmentation is refused
    srcs, _ = short([with_unk, ids], [ids, ids])
    assert list(srcs[0]) == list(with_unk)
    assert all(len(s) <= len(ids) for s in srcs[1:])


def test_growth_sizes_the_batches_to_max_tokens(vocab):
    store = encoded_store(vocab, PAIRS)
    dropout = BPEDropout(vocab, 0.1, seed=1)
    src_growth, tgt_growth = dropout.growth(store)
    assert 1.05 < src_growth < 3.0 and 1.05 < tgt_growth < 3.0
    max_tokens = 300
    sampler = TokenBatchSampler(scaled_lengths(store.src_lengths, src_growth),
                                scaled_lengths(store.tgt_lengths, tgt_growth), max_tokens, seed=1)
    def wider_side(sampler, resegment):
        """Mean real tokens of a batch's wider side, and mean sentences per batch, over one epoch."""
        stream = prefetch(store, sampler, resegment=resegment)
        epoch = [next(stream) for _ in range(len(sampler.epoch_batches(1)))]
        stream.close()
        tokens = [max(int((b.src != PAD_ID).sum()), b.n_tgt_tokens) for b in epoch]
        return np.mean(tokens), np.mean([b.src.shape[0] for b in epoch])

    plain_tokens, plain_rows = wider_side(TokenBatchSampler(store.src_lengths, store.tgt_lengths, max_tokens, seed=1),
                                          None)
    tokens, rows = wider_side(sampler, dropout)
    grown, _ = wider_side(TokenBatchSampler(store.src_lengths, store.tgt_lengths, max_tokens, seed=1), dropout)
    # As many real tokens per batch as without BPE-dropout, in fewer sentences ...
    assert 0.9 < tokens / plain_tokens < 1.1 and rows < 0.8 * plain_rows
    # ... where unscaled lengths would have let the batches grow with the segmentations.
    assert grown / plain_tokens > 1.3


def test_unigram_models_and_bad_probabilities_are_refused():
    unigram = Vocab.from_bytes(train_model([s for p in PAIRS for s in p],
                                           SpmConfig(vocab_size=300, model_type="unigram")))
    with pytest.raises(MtkitError, match="BPE SentencePiece model"):
        BPEDropout(unigram, 0.1, seed=1)
    from mtkit.config import config_from_dict

    with pytest.raises(MtkitError, match="bpe_dropout"):
        config_from_dict({"train": {"bpe_dropout": 1.0}})


def test_repack_deals_the_pool_out_by_length_keeping_sizes_and_positions(vocab):
    store = encoded_store(vocab, PAIRS)
    dropout = BPEDropout(vocab, 0.1, seed=1)
    sampler = TokenBatchSampler(store.src_lengths, store.tgt_lengths, 300, seed=1)
    pool = [(ix, 1, k + 1) for k, ix in enumerate(sampler.epoch_batches(1)[:16])]
    batches = repack(store, pool, dropout)
    assert [b.src.shape[0] for b in batches] == [len(ix) for ix, _, _ in pool]
    assert [(b.epoch, b.position) for b in batches] == [(1, k + 1) for k in range(16)]
    texts = sorted(vocab.decode_src(row.tolist()) for b in batches for row in b.src)
    assert texts == sorted(PAIRS[int(i)][0] for ix, _, _ in pool for i in ix)
    # Far less padding than re-segmenting each batch on its own.
    alone = [pad_batch(*dropout([store.src(int(i)) for i in ix], [store.tgt(int(i)) for i in ix])) for ix, _, _ in pool]
    padding = lambda bs: np.mean([b.padding_fraction for b in bs])  # noqa: E731
    assert padding(batches) < 0.7 * padding(alone)

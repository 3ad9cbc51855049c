"""Training-time augmentation (train.augment): each modifier does what it says, with its probability, as a function
of (seed, epoch, pair) only; tags stay in front; too long results and unknown pieces keep the stored ids."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ListStore

from mtkit.config import UNK_ID, SpmConfig, load_config
from mtkit.config.schema import AugmentConfig
from mtkit.data.synthetic import english, german
from mtkit.data.vocab import Vocab, train_model
from mtkit.errors import MtkitError
from mtkit.training.augment import Augmenter, noise, title_case, typos


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    sentences = [english(n) for n in range(0, 1000, 3)] + [german(n) for n in range(0, 1000, 3)]
    sentences += [s.upper() for s in sentences[::2]] + [title_case(s) for s in sentences[1::2]]
    return Vocab.from_bytes(train_model(sentences, SpmConfig(vocab_size=200)))


@pytest.fixture(scope="module")
def store(vocab) -> ListStore:
    return ListStore([(vocab.encode_src(english(n)), vocab.encode_tgt(german(n))) for n in range(1, 400)])


def texts(vocab, srcs, tgts) -> list[tuple[str, str]]:
    return [(vocab.decode_src(s), vocab.decode_tgt(t)) for s, t in zip(srcs, tgts)]


def test_title_case_and_typos_and_noise():
    assert title_case("a man's dog, in new york") == "A Man's Dog, In New York"
    rng = np.random.default_rng(0)
    assert typos("a quiet morning", 0.0, rng) == "a quiet morning"
    changed = [typos("the quick brown fox jumps over the lazy dog", 0.3, np.random.default_rng(s)) for s in range(20)]
    assert all(c != "the quick brown fox jumps over the lazy dog" for c in changed)
    assert typos("hello world", 0.3, np.random.default_rng(7)) == typos("hello world", 0.3, np.random.default_rng(7))
    # about rate x letters changed: the edit count over many draws
    letters = sum(ch.isalpha() for ch in "the quick brown fox jumps over the lazy dog")
    diff = np.mean([sum(a != b for a, b in zip(c, "the quick brown fox jumps over the lazy dog")) > 0 for c in changed])
    assert diff == 1.0 and letters == 35
    words = noise("xyz", np.random.default_rng(1), 5).split()
    assert len(words) == 5 and set("".join(words)) <= set("xyz")


def test_without_modifiers_nothing_changes_and_with_upper_every_pair_is_upper_case(vocab, store):
    off = Augmenter(vocab, AugmentConfig(), seed=1, max_len=200)
    srcs, tgts = off(store, range(50), 0)
    assert all(np.array_equal(a, store.src(i)) and np.array_equal(b, store.tgt(i))
               for i, (a, b) in enumerate(zip(srcs, tgts)))
    upper = Augmenter(vocab, AugmentConfig(upper=1.0), seed=1, max_len=200)
    for i, (s, t) in enumerate(texts(vocab, *upper(store, range(50), 0))):
        assert (s, t) == (english(i + 1).upper(), german(i + 1).upper())
    title = Augmenter(vocab, AugmentConfig(title=1.0), seed=1, max_len=200)
    for i, (s, t) in enumerate(texts(vocab, *title(store, range(50), 0))):
        assert (s, t) == (title_case(english(i + 1)), title_case(german(i + 1)))


def test_each_modifier_applies_with_its_probability_and_typos_touch_only_the_source(vocab, store):
    aug = Augmenter(vocab, AugmentConfig(typos=0.3, typo_rate=0.2), seed=1, max_len=200)
    pairs = texts(vocab, *aug(store, range(len(store)), 0))
    changed = [i for i, (s, _) in enumerate(pairs) if s != english(i + 1)]
    assert all(pairs[i][1] == german(i + 1) for i in range(len(store)))  # the target untouched
    assert 0.2 < len(changed) / len(store) < 0.4  # 0.3, a few typos-free draws aside
    merge = Augmenter(vocab, AugmentConfig(merge=0.5), seed=1, max_len=200)
    merged = [i for i, (s, t) in enumerate(texts(vocab, *merge(store, range(len(store)), 0)))
              if s != english(i + 1)]
    assert 0.4 < len(merged) / len(store) < 0.6
    for i in merged:
        s, t = texts(vocab, *merge(store, [i], 0))[0]
        assert s.startswith(english(i + 1) + " ") and t.startswith(german(i + 1) + " ")
    copy = Augmenter(vocab, AugmentConfig(copy_noise=1.0), seed=1, max_len=200)
    copy.learn_alphabet(store)
    assert set(copy.alphabet) <= set("abcdefghijklmnopqrstuvwxyzäöüß")
    for s, t in texts(vocab, *copy(store, range(20), 0)):
        assert s == t and set(s) <= set(copy.alphabet + " ")


def test_a_pairs_changes_depend_on_seed_epoch_and_pair_only_not_on_its_batch(vocab, store):
    config = AugmentConfig(upper=0.2, title=0.2, typos=0.3, merge=0.2, copy_noise=0.1)
    aug = Augmenter(vocab, config, seed=1, max_len=200)
    aug.learn_alphabet(store)
    order = np.random.default_rng(0).permutation(len(store))
    a = dict(zip(range(len(store)), zip(*aug(store, range(len(store)), 3))))
    b = dict(zip(order.tolist(), zip(*aug(store, order, 3))))
    assert all(list(a[i][0]) == list(b[i][0]) and list(a[i][1]) == list(b[i][1]) for i in a)
    other_epoch = dict(zip(range(len(store)), zip(*aug(store, range(len(store)), 4))))
    assert any(list(a[i][0]) != list(other_epoch[i][0]) for i in a)
    other_seed = Augmenter(vocab, config, seed=2, max_len=200)
    other_seed.learn_alphabet(store)
    assert any(list(a[i][0]) != list(s) for i, s in enumerate(other_seed(store, range(len(store)), 3)[0]))


def test_tags_stay_in_front_and_too_long_or_unknown_pairs_keep_their_ids(vocab, store):
    tag = vocab.src_size - 1
    tagged = ListStore([([tag, *store.src(i)], store.tgt(i)) for i in range(20)])
    aug = Augmenter(vocab, AugmentConfig(upper=1.0), seed=1, max_len=200, tags=[tag])
    srcs, _ = aug(tagged, range(20), 0)
    assert all(s[0] == tag and vocab.decode_src(s[1:]) == english(i + 1).upper() for i, s in enumerate(srcs))
    short = Augmenter(vocab, AugmentConfig(upper=1.0), seed=1, max_len=3)
    srcs, tgts = short(store, range(20), 0)
    kept = [np.array_equal(s, store.src(i)) for i, s in enumerate(srcs)]
    assert all(k or (len(s) <= 3 and len(t) <= 3) for k, s, t in zip(kept, srcs, tgts)) and sum(kept) >= 15
    unknown = ListStore([([UNK_ID, *store.src(0)], store.tgt(0))])
    srcs, _ = aug(unknown, [0], 0)
    assert list(srcs[0]) == [UNK_ID, *store.src(0)]
    plain = [english(n) for n in range(0, 1000, 3)] + [german(n) for n in range(0, 1000, 3)]
    lower = Vocab.from_bytes(train_model(plain, SpmConfig(vocab_size=150)))
    lower_store = ListStore([(lower.encode_src(english(n)), lower.encode_tgt(german(n))) for n in range(1, 20)])
    srcs, _ = Augmenter(lower, AugmentConfig(upper=1.0), seed=1, max_len=200)(lower_store, range(19), 0)
    assert all(np.array_equal(s, lower_store.src(i)) for i, s in enumerate(srcs))  # no upper case in its vocabulary


def test_each_epochs_lengths_are_its_augmented_pairs_and_the_sampler_cuts_batches_by_them(vocab, store):
    from mtkit.training.batching import TokenBatchSampler

    aug = Augmenter(vocab, AugmentConfig(merge=0.3, upper=0.3), seed=1, max_len=400)
    src, tgt = aug.lengths(store, 2)
    srcs, tgts = aug(store, range(len(store)), 2)
    assert src.tolist() == [len(s) for s in srcs] and tgt.tolist() == [len(t) for t in tgts]
    assert (src > store.src_lengths).mean() > 0.3  # merged and upper-cased pairs are longer
    flags, partner = aug.plan(len(store), 2)
    assert flags.dtype == np.uint8 and 0 <= partner.min() and partner.max() < len(store)
    assert np.array_equal(aug.plan(len(store), 2)[0], Augmenter(vocab, aug.config, 1, 400).plan(len(store), 2)[0])
    sampler = TokenBatchSampler(store.src_lengths, store.tgt_lengths, max_tokens=300, seed=1)
    sampler.epoch_lengths = lambda epoch: aug.lengths(store, epoch)
    for batch in sampler.epoch_batches(2):
        s, t = aug(store, batch, 2)
        assert max(max(map(len, s)), max(map(len, t))) * len(batch) <= 300 + 2 * len(batch)  # (+ BOS/EOS)


@pytest.mark.parametrize(("sets", "problem"), [
    (["train.augment={upper: 1.5}"], "train.augment.upper: must be a probability in [0, 1], got 1.5"),
    (["train.augment={upper: 0.6, title: 0.6}"], "train.augment.title: must be at most 1 - train.augment.upper"),
    (["train.augment={typos: 0.1, typo_rate: 0}"], "train.augment.typo_rate: must be in (0, 1], got 0.0"),
    (["train.augment={upper: 0.1}", "train.bpe_dropout=0.1"], "train.augment: cannot go with train.bpe_dropout"),
])
def test_bad_augment_settings_are_one_line_errors(sets, problem):
    with pytest.raises(MtkitError) as error:
        load_config(None, sets)
    assert problem.split(": ", 1)[1].split(" (")[0] in str(error.value)

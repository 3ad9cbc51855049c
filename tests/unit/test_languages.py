"""Multilingual models' parts: the ``data.pairs`` schema, the training mixture, target-language tags."""

from __future__ import annotations

import numpy as np
import pytest

from mtkit.config import config_from_dict, load_config
from mtkit.errors import MtkitError

PAIRS = [{"src_lang": "en", "tgt_lang": "de", "train": {"kind": "demo", "size": 50}},
         {"src_lang": "en", "tgt_lang": "fr", "train": {"kind": "demo", "size": 50}}]


def config(**data):
    return config_from_dict({"data": {"pairs": PAIRS, **data}})


def test_pairs_load_strictly_and_default_to_one_pair():
    assert config_from_dict({}).data.pairs == ()
    assert [(p.src_lang, p.tgt_lang) for p in config().data.pairs] == [("en", "de"), ("en", "fr")]
    with pytest.raises(MtkitError, match=r"data\.pairs\[1\]\.trian: unknown config key \(did you mean 'train'\?\)"):
        config_from_dict({"data": {"pairs": [PAIRS[0], {**PAIRS[1], "trian": PAIRS[1]["train"]}]}})


@pytest.mark.parametrize("pairs, train, match", [
    ([PAIRS[0], PAIRS[0]], {}, r"data\.pairs\[1\]: en-de is listed twice"),
    ([{**PAIRS[0], "tgt_lang": "pt-BR"}], {}, r"data\.pairs\[0\]\.tgt_lang: must be a language code"),
    ([{**PAIRS[0], "tgt_lang": "en"}], {}, r"data\.pairs\[0\]\.tgt_lang: the same language"),
    ([{**PAIRS[0], "weight": 2.0}, PAIRS[1]], {}, r"data\.pairs\[1\]\.weight: missing"),
    ([{**PAIRS[0], "weight": 0}, {**PAIRS[1], "weight": 1}], {}, r"data\.pairs\[0\]\.weight: must be > 0"),
    (PAIRS, {"best_pair": "en-cs"}, r"train\.best_pair: must be mean or one of the pairs \(en-de, en-fr\)"),
    (PAIRS, {"pair_temperature": 0}, r"train\.pair_temperature: must be > 0"),
])
def test_bad_pairs_are_one_line_errors_naming_the_key(pairs, train, match):
    with pytest.raises(MtkitError, match=match):
        config_from_dict({"data": {"pairs": pairs}, "train": train})


def test_a_single_pair_split_beside_pairs_is_an_error_and_best_pair_needs_pairs():
    with pytest.raises(MtkitError, match=r"data\.train: give each pair's sources in data\.pairs"):
        config(train={"kind": "demo"})
    with pytest.raises(MtkitError, match=r"train\.best_pair: must be mean"):
        config_from_dict({"train": {"best_pair": "en-de"}})


def test_pairs_can_be_set_on_the_command_line(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data: {src_lang: en, tgt_lang: de}\n")
    loaded = load_config(recipe, ["data.pairs=[{src_lang: en, tgt_lang: 'no', train: {kind: demo}}]"])
    assert (loaded.data.pairs[0].tgt_lang, loaded.data.pairs[0].train.kind) == ("no", "demo")  # Norwegian


def test_temperature_sampling_flattens_the_mixture_and_weights_override_it():
    from mtkit.training.batching import mixture_probabilities

    sizes = [9000, 1000]
    assert np.allclose(mixture_probabilities(sizes, 1.0), [0.9, 0.1])  # T = 1: proportional
    assert np.allclose(mixture_probabilities(sizes, 2.0), [3 / 4, 1 / 4])  # sqrt: 94.9 vs 31.6
    assert np.allclose(mixture_probabilities(sizes, 1e9), [0.5, 0.5], atol=1e-6)  # towards uniform
    assert np.allclose(mixture_probabilities(sizes, 5.0, weights=[1, 3]), [0.25, 0.75])
    assert np.allclose(mixture_probabilities([100, 0], 3.0), [1.0, 0.0])  # no data, no share


@pytest.mark.parametrize("probs", [[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
def test_an_epoch_of_the_sampler_holds_the_requested_mixture(probs):
    """Counted over the batches of whole epochs: each pair's share of the examples is the one asked for,
    a pair drawn more often than its size repeats its examples evenly, and every epoch differs."""
    from mtkit.training.batching import PairMixture, TokenBatchSampler

    rng = np.random.default_rng(0)
    sizes = [3000, 1500, 500]
    starts = np.cumsum([0] + sizes[:-1])
    lengths = rng.integers(3, 20, size=sum(sizes))
    sampler = TokenBatchSampler(lengths, lengths, max_tokens=400, seed=5,
                                mixture=PairMixture(list(zip(starts, sizes)), probs))
    pair_of = np.repeat(np.arange(3), sizes)
    epochs = [np.concatenate(sampler.epoch_batches(epoch)) for epoch in (1, 2)]
    for drawn in epochs:
        counts = np.bincount(pair_of[drawn], minlength=3)
        assert counts.sum() == sum(sizes)  # an epoch keeps the store's size
        assert np.allclose(counts / counts.sum(), probs, atol=2e-3)
        for p in range(3):  # repeats are even: no example of a pair is drawn twice more than another
            seen = np.bincount(drawn[pair_of[drawn] == p] - starts[p], minlength=sizes[p])
            assert seen.max() - seen.min() <= 1
    assert not np.array_equal(epochs[0], epochs[1])


def test_the_tagged_vocabulary_leads_each_source_with_its_tag_and_keeps_empty_lines_empty(tmp_path):
    from mtkit.config import SpmConfig
    from mtkit.data.languages import TaggedVocab, tag_piece
    from mtkit.data.vocab import Vocab, train_model

    text = [f"{w} {v}" for w in ("one", "two", "three", "four", "five", "six") for v in ("eins", "zwei", "drei")]
    tagged = Vocab.from_bytes(train_model(text * 5, SpmConfig(vocab_size=40), 1, [tag_piece("de"), tag_piece("fr")]))
    plain = Vocab.from_bytes(train_model(text * 5, SpmConfig(vocab_size=40), 1))
    assert plain.src_piece_id("<2de>") is None
    de, fr = TaggedVocab(tagged, "de"), TaggedVocab(tagged, "fr")
    assert de.tag != fr.tag and tagged.src_pieces([de.tag, fr.tag]) == ["<2de>", "<2fr>"]
    assert de.encode_src_batch(["one eins", ""]) == [[de.tag, *tagged.encode_src("one eins")], []]
    assert de.decode_tgt(tagged.encode_tgt("two zwei")) == "two zwei"  # the rest is the vocabulary's
    with pytest.raises(MtkitError, match="no target-language tag <2cs>"):
        TaggedVocab(tagged, "cs")


def test_the_target_is_required_when_a_model_has_several_and_checked_when_it_has_one():
    from mtkit.data.languages import Pair, pick_target

    pairs = [Pair("en", "de"), Pair("en", "fr"), Pair("de", "en")]
    assert pick_target(pairs, None, "fr") == "fr"
    with pytest.raises(MtkitError, match=r"^--tgt-lang: missing; the model translates into de, fr, en \(pairs "
                                         r"en-de, en-fr, de-en\): say which, e.g. --tgt-lang de$"):
        pick_target(pairs, None, None)
    with pytest.raises(MtkitError, match=r"^--tgt-lang cs: the model does not translate into it"):
        pick_target(pairs, None, "cs")
    assert pick_target([Pair("en", "de")], None, None) == "de"  # one target: the flag is optional
    assert pick_target([], ("en", "de"), None) is None  # a single-pair model has no tag
    assert pick_target([], ("en", "de"), "de") is None
    with pytest.raises(MtkitError, match=r"^--tgt-lang fr: the model translates en-de only$"):
        pick_target([], ("en", "de"), "fr")


@pytest.mark.parametrize("n, words", [(0, "zéro"), (21, "vingt et un"), (71, "soixante et onze"),
                                      (77, "soixante-dix-sept"), (80, "quatre-vingts"), (81, "quatre-vingt-un"),
                                      (99, "quatre-vingt-dix-neuf"), (100, "cent"), (200, "deux cents"),
                                      (342, "trois cent quarante-deux"), (980, "neuf cent quatre-vingts")])
def test_the_demo_writes_french_numbers(n, words):
    from mtkit.data.synthetic import french

    assert french(n) == words


def test_the_demo_pairs_of_a_multilingual_recipe_are_the_same_sentences():
    from mtkit.data.synthetic import demo_pairs

    en_de = list(demo_pairs(50, 1, "valid"))
    assert list(demo_pairs(50, 1, "valid", "en", "de")) == en_de  # the single-pair demo, unchanged
    en_fr = list(demo_pairs(50, 1, "valid", "en", "fr"))
    de_en = list(demo_pairs(50, 1, "valid", "de", "en"))
    assert [s for s, _ in en_fr] == [s for s, _ in en_de] == [t for _, t in de_en]
    assert all(" und " not in t for _, t in en_fr) and any(" et " in t for _, t in en_fr)


def test_a_saved_multilingual_config_loads_back_as_itself(tmp_path):
    from mtkit.config import save_config

    pairs = [{**PAIRS[0], "tgt_lang": "no", "weight": 2.0}, {**PAIRS[1], "weight": 1.0, "lc_tok_ref": "1.50"}]
    saved = config_from_dict({"data": {"pairs": pairs}, "train": {"best_pair": "en-no", "pair_temperature": 5}})
    save_config(saved, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == saved


def test_a_single_pair_recipe_keeps_the_data_fingerprint_it_had(tmp_path):
    """A prepared single-pair directory is reused as before: its fingerprint is computed from the same
    settings as before data.pairs, data.alignments, data.corpora and the filters existed (the formula of
    mtkit.data.prepare.fingerprint then)."""
    import dataclasses
    import hashlib
    import json

    import mtkit
    from mtkit.config import config_to_dict
    from mtkit.data.prepare import fingerprint, resolve_data

    data = resolve_data(config_from_dict({"data": {"train": {"kind": "demo"}, "spm": {"vocab_size": 400}}}).data)
    settings = config_to_dict(dataclasses.replace(data, workers=0))
    settings.pop("pairs")
    settings.pop("alignments")  # nor data.alignments (None)
    settings.pop("corpora")  # nor data.corpora (empty)
    for key in ("filters", "examples", "warn_share"):  # nor data.clean's filters and report (their defaults)
        settings["clean"].pop(key)
    before = {"version": mtkit.__version__, "data": settings, "files": [], "vocab": None}
    assert fingerprint(data) == hashlib.sha256(json.dumps(before, sort_keys=True).encode("utf-8")).hexdigest()
    weighted = config().data, config_from_dict({"data": {"pairs": [{**p, "weight": 2.0} for p in PAIRS]}}).data
    assert fingerprint(weighted[0]) == fingerprint(weighted[1])  # weights change no prepared output


def test_bpe_dropout_resegments_a_tagged_source_behind_its_tag():
    from mtkit.config import SpmConfig
    from mtkit.data.languages import TaggedVocab, tag_piece
    from mtkit.data.vocab import Vocab, train_model
    from mtkit.training.bpe_dropout import BPEDropout

    text = [f"{w} {v}" for w in ("seventeen", "eighteen", "nineteen") for v in ("siebzehn", "achtzehn", "neunzehn")]
    vocab = Vocab.from_bytes(train_model(text * 20, SpmConfig(vocab_size=60), 1, [tag_piece("de")]))
    tagged = TaggedVocab(vocab, "de")
    sources = [np.asarray(ids) for ids in tagged.encode_src_batch(["seventeen eighteen", "nineteen neunzehn"])]
    new, _ = BPEDropout(vocab, 0.5, seed=1, tags=[tagged.tag])(sources, sources)
    for old, ids in zip(sources, new):
        assert ids[0] == tagged.tag and vocab.decode_src(ids[1:]) == vocab.decode_src(old[1:])

"""Corpus weights in a single pair's recipe (``data.corpora``): each corpus a segment of one store, a tagged
corpus's sources led by its tag, the report per corpus, and training drawing each corpus by its weight."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import TINY_MODEL, write_reverse_corpus

from mtkit.commands.prepare import prepare
from mtkit.config import config_from_dict, load_config
from mtkit.data.store import ParallelStore
from mtkit.data.vocab import Vocab
from mtkit.errors import MtkitError


def corpora_config(tmp_path, weights=(1.0, 3.0), tag="<BT>", **train) -> dict:
    original = write_reverse_corpus(tmp_path / "original", n_train=600, n_valid=30, seed=1)
    back = write_reverse_corpus(tmp_path / "back", n_train=300, n_valid=30, seed=2)
    return {
        "data": {
            "src_lang": "en", "tgt_lang": "de", "workers": 1, "spm": {"vocab_size": 100},
            "valid": {"src": str(original["valid"][0]), "tgt": str(original["valid"][1])},
            "corpora": [
                {"name": "original", "weight": weights[0],
                 "train": {"src": str(original["train"][0]), "tgt": str(original["train"][1])}},
                {"name": "bt", "weight": weights[1], "tag": tag,
                 "train": {"src": str(back["train"][0]), "tgt": str(back["train"][1])}},
            ],
        },
        "model": TINY_MODEL,
        "train": {"max_tokens": 600, "lr_schedule": "inverse_sqrt", "lr": 3e-3, "warmup": 10, "log_every": 1,
                  "valid_every": 0, "save_every": 0, "max_steps": 4, "seed": 3, **train},
    }


def test_corpora_are_segments_of_one_store_and_a_tagged_corpus_leads_with_its_tag(tmp_path):
    config = config_from_dict(corpora_config(tmp_path))
    manifest = prepare(config, tmp_path / "prepared", progress=False)
    vocab = Vocab.load(tmp_path / "prepared")
    tag = vocab.src_piece_id("<BT>")
    assert tag is not None
    original, bt = manifest["corpora"]
    assert (original["name"], original["tag"], original["tag_id"]) == ("original", None, None)
    assert (bt["name"], bt["tag"], bt["tag_id"]) == ("bt", "<BT>", tag)
    assert original["splits"]["train"] == {"start": 0, "pairs": 600, "read": 600}
    assert bt["splits"]["train"] == {"start": 600, "pairs": 300, "read": 300}
    store = ParallelStore.open(tmp_path / "prepared", "train")
    assert len(store) == 900 == manifest["splits"]["train"]["pairs"]
    assert all(int(store.src(i)[0]) != tag for i in range(600))
    assert all(int(store.src(i)[0]) == tag for i in range(600, 900))
    assert all(tag not in store.tgt(i) for i in range(900))
    # the tag is never made of text: "<BT>" written in a sentence is encoded as characters
    assert tag not in vocab.encode_src("a <BT> b")
    assert vocab.decode_src(store.src(600)[1:]) == (tmp_path / "back" / "train.src").read_text().splitlines()[0]
    # the report has a section per corpus
    from mtkit.data.report import cleaning_report

    assert [s["corpus"] for s in cleaning_report(manifest)] == ["train original", "train bt"]


def test_training_draws_each_corpus_by_its_weight(tmp_path):
    from mtkit.training.trainer import Trainer

    config = config_from_dict(corpora_config(tmp_path, weights=(1.0, 3.0)))
    prepare(config, tmp_path / "prepared", progress=False)
    trainer = Trainer(config, tmp_path / "prepared", tmp_path / "run", progress=False)
    assert trainer.mixture_shares == pytest.approx({"original": 0.25, "bt": 0.75})
    epoch = trainer.sampler.epoch_batches(0)
    drawn = np.concatenate(epoch)
    share_bt = float(np.mean(drawn >= 600))
    assert 0.7 < share_bt < 0.8  # 75 % of every epoch from the 300 pairs of bt: each drawn 2.25 times


def test_a_run_with_corpora_trains_and_a_recipe_with_other_corpora_is_refused(tmp_path):
    from mtkit.training.trainer import train

    raw = corpora_config(tmp_path)
    config = config_from_dict(raw)
    prepare(config, tmp_path / "prepared", progress=False)
    result = train(config, tmp_path / "prepared", tmp_path / "run", progress=False)
    assert result.step == 4
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["pair_shares"] == pytest.approx({"original": 0.25, "bt": 0.75})
    raw["data"]["corpora"][1]["name"] = "backtranslated"
    with pytest.raises(MtkitError, match="was prepared with the corpora original, bt; the recipe names original, "
                                         "backtranslated"):
        train(config_from_dict(raw), tmp_path / "prepared", tmp_path / "run2", progress=False)


@pytest.mark.parametrize(("sets", "problem"), [
    (["data.train={src: a, tgt: b}", "data.corpora=[{name: x, train: {src: a, tgt: b}}]"],
     "give the training sources in data.corpora"),
    (["data.corpora=[{name: x, train: {src: a, tgt: b}}, {name: x, train: {src: c, tgt: d}}]"], "x is given twice"),
    (["data.corpora=[{name: x}]"], "missing: each corpus needs its training source"),
    (["data.corpora=[{name: x, weight: 0, train: {src: a, tgt: b}}]"], "must be > 0, got 0"),
    (["data.corpora=[{name: x, tag: '<2de>', train: {src: a, tgt: b}}]"], "not <2xx>: those are language tags"),
    (["data.corpora=[{name: x, tag: 'BT', train: {src: a, tgt: b}}]"], "a piece such as <BT>"),
    (["data.corpora=[{name: x, train: {src: a, tgt: b}}]", "data.alignments=eflomal"],
     "takes a single data.train, not data.corpora"),
])
def test_bad_corpora_are_one_line_errors(sets, problem):
    with pytest.raises(MtkitError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, sets)

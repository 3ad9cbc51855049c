"""Checkpoints written by earlier code keep loading: a format-1 file made by `mtkit train` before the layer
norms were named by role (tests/fixtures/checkpoint_format1) translates and scores as it did then."""

import json
import math
from pathlib import Path

import pytest

import mtkit

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "checkpoint_format1"


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads((FIXTURE / "format1.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def model():
    return mtkit.load(FIXTURE / "format1.pt", threads=1)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)


@pytest.mark.parametrize("name, options", [("beam 2, nbest 2", {"beam": 2, "nbest": 2}), ("greedy", {"beam": 1})])
def test_a_format1_checkpoint_translates_as_it_did(model, recorded, name, options):
    results = model.translate(recorded["sources"], **options, guard=False)  # the search's own outputs
    got = [[{"text": h.text, "tokens": list(h.tokens), "score": h.score, "logprob": h.logprob} for h in r.hypotheses]
           for r in results]
    want = recorded[name]
    assert [[(h["text"], h["tokens"]) for h in r] for r in got] == [[(h["text"], h["tokens"]) for h in r] for r in want]
    for g, w in zip((h for r in got for h in r), (h for r in want for h in r)):
        assert close(g["score"], w["score"]) and close(g["logprob"], w["logprob"]), (g, w)


def test_a_format1_checkpoint_scores_as_it_did(model, recorded):
    got = model.score(recorded["sources"], recorded["targets"])
    assert [s.tokens for s in got] == [s["tokens"] for s in recorded["forced"]]
    for g, w in zip(got, recorded["forced"]):
        assert close(g.logprob, w["logprob"]), (g, w)


def test_the_fixture_is_format1_with_norms_named_by_position():
    """The file stands for what users hold: keep it as the older code wrote it."""
    from mtkit.checkpoints.file import read_payload

    payload = read_payload(FIXTURE / "format1.pt")
    assert payload["format_version"] == 1
    assert "decoder.layers.0.sublayer.2.norm.weight" in payload["model"]
    assert not any(name.endswith("_norm.weight") for name in payload["model"])


def test_the_upgrade_names_norms_by_role_and_keeps_the_parameters_order():
    """A resumed format-1 training's Adam moments are kept by parameter index: the upgraded names must come in
    the order of the model's parameters, and each norm must land on its own sub-layer."""
    from mtkit.checkpoints.io import CHECKPOINT_FORMAT, checkpoint_config, load_checkpoint
    from mtkit.model import Transformer

    ckpt = load_checkpoint(FIXTURE / "format1.pt")
    assert ckpt["format_version"] == CHECKPOINT_FORMAT
    config = checkpoint_config(ckpt, FIXTURE / "format1.pt")
    model = Transformer(config.model, ckpt["src_vocab_size"], ckpt["tgt_vocab_size"])
    params = [name for name, _ in model.named_parameters()]
    assert [name for name in ckpt["model"] if name in params] == params
    assert len(ckpt["optimizer"]["param_groups"][0]["params"]) == len(params)
    raw = __import__("torch").load(FIXTURE / "format1.pt", weights_only=True)["model"]
    for old, new in (("encoder.layers.0.sublayer.0.norm", "encoder.layers.0.self_attn_norm"),
                     ("encoder.layers.0.sublayer.1.norm", "encoder.layers.0.feed_forward_norm"),
                     ("decoder.layers.0.sublayer.0.norm", "decoder.layers.0.self_attn_norm"),
                     ("decoder.layers.0.sublayer.1.norm", "decoder.layers.0.cross_attn_norm"),
                     ("decoder.layers.0.sublayer.2.norm", "decoder.layers.0.feed_forward_norm")):
        for tensor in ("weight", "bias"):
            assert ckpt["model"][f"{new}.{tensor}"].equal(raw[f"{old}.{tensor}"])


def test_averaging_format1_checkpoints_writes_the_current_format(tmp_path, recorded):
    """`mtkit average` reads through the upgrade and writes today's format; the average of a file with itself
    translates as the file does."""
    from mtkit.checkpoints.file import read_payload
    from mtkit.checkpoints.io import CHECKPOINT_FORMAT
    from mtkit.training.average import average_checkpoints

    out = average_checkpoints([FIXTURE / "format1.pt", FIXTURE / "format1.pt"], tmp_path / "averaged.pt")
    payload = read_payload(out)
    assert payload["format_version"] == CHECKPOINT_FORMAT
    assert "decoder.layers.0.cross_attn_norm.weight" in payload["model"]
    results = mtkit.load(out, threads=1).translate(recorded["sources"], beam=1, guard=False)
    assert [r.hypotheses[0].text for r in results] == [r[0]["text"] for r in recorded["greedy"]]

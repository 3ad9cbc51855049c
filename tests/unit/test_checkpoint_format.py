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
    results = model.translate(recorded["sources"], **options)
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

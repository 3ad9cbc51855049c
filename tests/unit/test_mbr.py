"""Minimum-Bayes-risk decoding: the candidate of the highest expected utility, judged by the utility's own
metric (sacreBLEU's sentence chrF / BLEU), from both engines' n-best lists and from samples."""

from __future__ import annotations

from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU, CHRF

import mtkit
from mtkit.config import ConfigError, DecodeConfig, config_from_dict
from mtkit.engines.mbr import expected_utilities, mbr_order
from mtkit.errors import MtkitError

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "checkpoint_format1" / "format1.pt"
SOURCES = ["india echo lima juliet", "delta kilo bravo", "", "alpha golf lima india foxtrot", "hotel lima",
           "juliet kilo kilo foxtrot", "kilo india", "bravo"]


def judged(texts: list[str], utility: str) -> list[float]:
    """Each text's mean sentence score against every text, computed here with sacreBLEU itself."""
    metric = CHRF() if utility == "chrf" else BLEU(effective_order=True)
    return [sum(metric.sentence_score(h, [r]).score for r in texts) / len(texts) for h in texts]


@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_mbr_orders_by_expected_utility(utility):
    texts = ["a man rides a bike", "a man is riding a bike", "a man riding a bicycle", "two dogs play", "a man"]

    class C:
        def __init__(self, text):
            self.text = text

    ranked = [c.text for c in mbr_order([C(t) for t in texts], DecodeConfig(mbr=utility))]
    scores = judged(texts, utility)
    assert expected_utilities(texts, utility) == pytest.approx(scores)
    assert ranked == [texts[i] for i in sorted(range(len(texts)), key=lambda i: -scores[i])]
    assert ranked[0] != "two dogs play" and ranked[-1] in ("two dogs play", "a man")


@pytest.fixture(scope="module")
def model():
    return mtkit.load(FIXTURE, threads=1)


@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_mbr_picks_from_the_torch_engines_n_best_list(model, utility):
    plain = model.translate(SOURCES, beam=6, nbest=6, guard=False)
    chosen = model.translate(SOURCES, mbr=utility, mbr_candidates=6, nbest=6, guard=False)
    assert [r.source for r in chosen] == SOURCES  # one result per line, in order
    for p, c in zip(plain, chosen):
        texts = [h.text for h in p.hypotheses]
        assert sorted(h.text for h in c.hypotheses) == sorted(texts)  # the same candidates ...
        if len(texts) > 1:
            scores = judged(texts, utility)  # ... ordered by their expected utility
            assert [h.text for h in c.hypotheses] == [texts[i] for i in sorted(range(len(texts)),
                                                                                 key=lambda i: -scores[i])]
    best = model.translate(SOURCES, mbr=utility, mbr_candidates=6, guard=False)
    assert [r.text for r in best] == [r.hypotheses[0].text for r in chosen] and all(
        len(r.hypotheses) == 1 for r in best)
    assert any(r.text != p.text for r, p in zip(best, plain))  # MBR changed some choices on this model


def test_mbr_picks_from_samples(model):
    results = model.translate(SOURCES, sampling=True, mbr="chrf", mbr_candidates=5, guard=False)
    assert len(results) == len(SOURCES) and all(len(r.hypotheses) == 1 for r in results)
    assert results[2].text == ""  # an empty line stays empty


def test_mbr_picks_from_ctranslate2s_n_best_list(tmp_path, monkeypatch):
    pytest.importorskip("ctranslate2")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    import shutil

    shutil.copy(FIXTURE, tmp_path / "format1.pt")
    ct2 = mtkit.load(tmp_path / "format1.pt", engine="ctranslate2", threads=1)
    plain = ct2.translate(SOURCES, beam=6, nbest=6, guard=False)
    chosen = ct2.translate(SOURCES, mbr="chrf", mbr_candidates=6, nbest=6, guard=False)
    for p, c in zip(plain, chosen):
        texts = [h.text for h in p.hypotheses]
        scores = judged(texts, "chrf")
        assert [h.text for h in c.hypotheses] == [texts[i] for i in sorted(range(len(texts)), key=lambda i: -scores[i])]


@pytest.mark.parametrize(("decode", "message"), [
    ({"mbr": "chrf", "mbr_candidates": 0}, "decode.mbr_candidates: must be >= 1"),
    ({"mbr": "chrf", "mbr_candidates": 2, "nbest": 3, "beam": 4}, "decode.nbest: must be between 1 and "
                                                                  "decode.mbr_candidates (2)"),
    ({"mbr": "mbrs"}, "decode.mbr: "),
])
def test_mbr_settings_are_checked(decode, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config_from_dict({"decode": decode})


def test_the_api_names_a_bad_mbr_option(model):
    with pytest.raises(MtkitError, match=r"^mbr_candidates: must be >= 1, got 0$"):
        model.translate("india", mbr="chrf", mbr_candidates=0)


def test_translate_json_lines_carry_each_hypothesis_and_its_confidence(model):
    """--format json: one object per input line, its numbers the engine's (confidence = mean log-probability
    per token, EOS included, as the server's), every n-best hypothesis; an empty line has none."""
    import json

    from mtkit.text.lines import format_translation

    translations = list(model.engine.translate(SOURCES, options=model.options(beam=3, nbest=3, guard=False)))
    lines = [format_translation(t, "json", 3) for t in translations]
    assert all(len(x) == 1 for x in lines)
    for t, (line,) in zip(translations, lines):
        got = json.loads(line)
        assert got["line"] == t.index + 1
        if not t.src_ids:
            assert got == {"line": 3, "text": "", "score": None, "logprob": None, "confidence": None, "tokens": [],
                           "nbest": [], "unmet": []}
            continue
        assert [h["text"] for h in got["nbest"]] == [c.text for c in t.candidates[:3]]
        assert got["text"] == t.best.text and got["logprob"] == pytest.approx(t.best.logprob)
        assert got["confidence"] == pytest.approx(t.best.logprob / (len(t.best.ids) + 1))
        assert got["tokens"] == t.best.pieces


def test_epsilon_sampling_keeps_only_likely_tokens(model):
    greedy = [r.text for r in model.translate(SOURCES, beam=1, guard=False)]  # (no loop searched again)
    # epsilon near 1: only the likeliest token passes at every step, so every sample is the greedy output
    narrow = model.translate(SOURCES, sampling=True, epsilon=0.999, nbest=4, guard=False)
    assert all({h.text for h in r.hypotheses} == {g} for r, g in zip(narrow, greedy))
    free = model.translate(SOURCES, sampling=True, nbest=4, guard=False)
    assert any({h.text for h in r.hypotheses} != {g} for r, g in zip(free, greedy))  # plain sampling strays
    with pytest.raises(MtkitError, match=r"epsilon: must be in \[0, 1\)"):
        model.translate("india", sampling=True, epsilon=1.0)
    with pytest.raises(MtkitError, match="epsilon needs sampling|needs --sampling"):
        model.translate("india", epsilon=0.1)

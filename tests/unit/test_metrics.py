"""mtkit.metrics: sacrebleu scores, lc-tok BLEU, compound splitting, paired bootstrap, test-set errors."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mtkit.errors import MtkitError
from mtkit.metrics import (
    COMPOUND_NAME,
    LC_TOK_NAME,
    BleuScore,
    ChrfScore,
    MetricOptions,
    TerScore,
    compound_split_tok,
    lc_tok,
    load_pairs_refs,
    load_testset,
    looks_lc_tok,
    paired_bootstrap,
    score,
)


def _multi30k() -> Path | None:
    root = Path(os.environ.get("MTKIT_MULTI30K", Path(__file__).resolve().parents[2].parent / "shared/data/multi30k"))
    return root if (root / "tok/test_2016_flickr.lc.norm.tok.de").exists() else None


MULTI30K = _multi30k()
needs_multi30k = pytest.mark.skipif(
    MULTI30K is None, reason="Multi30k test files not found (set MTKIT_MULTI30K to the multi30k folder)"
)


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_default_metrics_carry_details_and_signatures():
    hyps = ["Der Hund läuft schnell.", "", "东京今天天气很好。"]
    refs = [["Ein Hund läuft schnell.", "Etwas.", "东京今天天气很好。"]]
    bleu, chrf, ter = score(hyps, refs)
    assert isinstance(bleu, BleuScore) and isinstance(chrf, ChrfScore) and isinstance(ter, TerScore)
    assert (bleu.metric, chrf.metric, ter.metric) == ("BLEU", "chrF2", "TER")
    assert len(bleu.counts) == len(bleu.totals) == len(bleu.precisions) == 4
    assert 0 < bleu.score < 100 and bleu.sys_len > 0 and bleu.ref_len > 0
    assert "tok:13a" in bleu.signature and "version:" in bleu.signature
    assert "nw:0" in chrf.signature and "tok:tercom" in ter.signature


def test_chrf_plus_and_metric_order():
    results = score(["a b c"], [["a b d"]], metrics=["ter", "chrf"], options=MetricOptions(chrf_plus=True))
    assert [r.metric for r in results] == ["TER", "chrF2++"]
    assert results[1].word_order == 2


def test_identical_output_scores_perfectly_with_two_references():
    hyps = ["Grüße aus Köln.", "日本語のテキスト。"]
    refs = [hyps, ["Viele Grüße aus Köln.", "別の参照。"]]
    bleu, chrf, ter = score(hyps, refs)
    assert bleu.score == pytest.approx(100.0) and chrf.score == pytest.approx(100.0) and ter.score == 0.0
    assert "nrefs:2" in bleu.signature


def test_errors_are_one_line_user_errors():
    with pytest.raises(MtkitError, match="reference 1 has 2 lines but the hypotheses have 1"):
        score(["a"], [["a", "b"]])
    with pytest.raises(MtkitError, match="unknown metric 'meteor'"):
        score(["a"], [["a"]], metrics=["meteor"])
    with pytest.raises(MtkitError, match="--lang"):
        score(["a"], [["a"]], options=MetricOptions(lowercase_tok=True))
    with pytest.raises(MtkitError, match="empty"):
        score([], [[]])


def test_lc_tok_bleu_hand_checked():
    # After lowercase + Moses tokenization:
    #   hyp 1 "ein mann fährt ein fahrrad ."  ref 1 "ein mann fährt fahrrad ."
    #   hyp 2 "zwei kinder spielen im park ." = ref 2 (the hypothesis was in capitals)
    # matches/totals:  1-grams 5/6 + 6/6 = 11/12   ("ein" clipped to 1)
    #                  2-grams 3/5 + 5/5 =  8/10   (ein mann, mann fährt, fahrrad .)
    #                  3-grams 1/4 + 4/4 =  5/8    (ein mann fährt)
    #                  4-grams 0/3 + 3/3 =  3/6
    # hyp_len 12 > ref_len 11, so BP = 1 and BLEU = 100 * (11/12 * 8/10 * 5/8 * 3/6) ** (1/4) = 69.19.
    hyps = ["Ein Mann fährt ein Fahrrad.", "ZWEI KINDER SPIELEN IM PARK."]
    refs = [["Ein Mann fährt Fahrrad.", "Zwei Kinder spielen im Park."]]
    cased, lctok = score(hyps, refs, metrics=["bleu"], options=MetricOptions(lowercase_tok=True, lang="de"))
    assert lctok.metric == LC_TOK_NAME
    assert lctok.counts == [11, 8, 5, 3] and lctok.totals == [12, 10, 8, 6]
    assert (lctok.sys_len, lctok.ref_len, lctok.bp) == (12, 11, 1.0)
    assert lctok.score == pytest.approx(100 * (11 / 12 * 8 / 10 * 5 / 8 * 3 / 6) ** 0.25)
    assert lctok.score == pytest.approx(69.19, abs=0.01)
    assert cased.score < 25  # the capitals cost sacreBLEU dearly: the two are not comparable
    assert "tok:none" in lctok.signature and "case:lc" in lctok.signature and "pre:lc.norm.tok.de" in lctok.signature


def test_lc_tok_escapes_like_the_official_references():
    expected = "ein &quot; test &quot; für kids &apos; food &amp; co ."
    assert lc_tok('Ein "Test" für Kids\' Food & Co. ', "de") == expected
    assert lc_tok("A man's hat.", "en") == "a man &apos;s hat ."
    # Lowercasing comes first: the German tokenizer keeps "Bart." whole (a non-breaking prefix), "bart." not.
    assert lc_tok("Er rasiert seinen Bart.", "de") == "er rasiert seinen bart ."


def test_compound_split_matches_the_perl_one_liner():
    # perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g': matches do not overlap, so "b-c" after "a-b" stays.
    assert compound_split_tok("Rich-Text-Format", "de") == "Rich ##AT##-##AT## Text ##AT##-##AT## Format"
    assert compound_split_tok("a-b-c", "en") == "a ##AT##-##AT## b-c"
    (result,) = [r for r in score(["Ein E-Mail-Konto."], [["Ein E-Mail-Konto."]], ["bleu"],
                                  MetricOptions(compound_split=True, lang="de")) if r.metric == COMPOUND_NAME]
    assert result.score == pytest.approx(100.0) and result.sys_len == 7  # Ein E ##AT##-##AT## Mail ... Konto .


@needs_multi30k
@pytest.mark.parametrize("lang", ["de", "en"])
def test_lc_tok_reproduces_official_multi30k_references(lang):
    raw = _lines(MULTI30K / f"test_2016_flickr.{lang}")
    official = _lines(MULTI30K / f"tok/test_2016_flickr.lc.norm.tok.{lang}")
    assert len(raw) == len(official) == 1000
    mismatches = [(r, o) for r, o in zip(raw, official) if lc_tok(r, lang) != o]
    assert mismatches == []
    assert looks_lc_tok(official, lang) and not looks_lc_tok(raw, lang)
    # The raw references as a hypothesis: 100 lc-tok BLEU, against the official files and against raw refs.
    for refs in (official, raw):
        scores = score(raw, [refs], ["bleu"], MetricOptions(lowercase_tok=True, lang=lang))
        (lctok,) = [r for r in scores if r.metric == LC_TOK_NAME]
        assert lctok.score == pytest.approx(100.0)


def test_paired_bootstrap_gives_p_values_and_intervals():
    refs = [f"Satz Nummer {i} über einen Hund im Park ." for i in range(60)]
    good = list(refs)
    bad = [r.replace("Hund", "Katze").replace("Park", "Garten") if i % 2 else r for i, r in enumerate(refs)]
    table = paired_bootstrap([("base", bad), ("new", good)], [refs], metrics=["bleu", "chrf"], n_samples=200)
    assert [[s.system for s in row] for row in table] == [["base", "base"], ["new", "new"]]
    base_bleu, new_bleu = table[0][0], table[1][0]
    assert base_bleu.p_value is None and 0.0 <= new_bleu.p_value <= 0.05
    assert new_bleu.score == pytest.approx(100.0) and base_bleu.score < 100
    assert base_bleu.ci95 > 0 and "bs:200" in base_bleu.signature and "seed:" in base_bleu.signature
    with pytest.raises(MtkitError, match="at least two"):
        paired_bootstrap([("base", bad)], [refs])


def test_load_pairs_refs():
    assert load_pairs_refs([("a", "x"), ("b", "y")]) == (["a", "b"], [["x", "y"]])


def test_load_testset_rejects_unknown_names():
    with pytest.raises(MtkitError, match="did you mean wmt14/full"):
        load_testset("wmt14/ful", "en-de")
    with pytest.raises(MtkitError, match="no language pair 'xx-yy'"):
        load_testset("wmt14/full", "xx-yy")


def test_load_testset_offline_error_is_fast_and_says_what_to_do(tmp_path):
    # A fresh sacrebleu cache and a proxy that refuses connections: a real, immediate network failure.
    code = (
        "from mtkit.metrics import load_testset\n"
        "from mtkit.errors import MtkitError\n"
        "try:\n    load_testset('wmt14/full', 'en-de', timeout=3)\n"
        "except MtkitError as e:\n    print(e)\n"
    )
    env = {**os.environ, "SACREBLEU": str(tmp_path / "cache"), "https_proxy": "http://127.0.0.1:9",
           "HTTPS_PROXY": "http://127.0.0.1:9", "no_proxy": "", "NO_PROXY": ""}
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - start < 30
    message = out.stdout.strip()
    assert "\n" not in message
    assert str(tmp_path / "cache") in message and "SACREBLEU" in message and "~/.sacrebleu" in message
    assert "--src/--ref" in message


def test_load_testset_without_download():
    from sacrebleu import DATASETS

    from mtkit.metrics import _cached

    if _cached(DATASETS["wmt14/full"], "en-de"):
        pytest.skip("wmt14/full is in the local sacrebleu cache")
    with pytest.raises(MtkitError, match="downloads disabled.*--src/--ref"):
        load_testset("wmt14/full", "en-de", download=False)


def test_explicit_chinese_target_uses_sacrebleus_zh_tokenizer():
    (bleu,) = score(["东京今天天气很好。"], [["东京今天天气很好。"]], ["bleu"], MetricOptions(lang="zh"))
    assert "tok:zh" in bleu.signature and bleu.score == pytest.approx(100.0)
    (bleu,) = score(["东京今天天气很好。"], [["东京今天天气很好。"]], ["bleu"])
    assert "tok:13a" in bleu.signature

"""Real text on the Multi30k model (../shared/models/multi30k-en-de): paragraphs (test captions joined three to a
line) translate as well as their sentences one per line, in the CLI, the Python API and both server APIs
(mtkit.text.pipeline splits them); without splitting they lose whole sentences."""

from __future__ import annotations

from pathlib import Path

import pytest
import sacrebleu
from conftest import MODELS, MULTI30K
from inprocess import run_mtkit

import mtkit

pytestmark = pytest.mark.slow  # the real model: seconds per call
MODEL = MODELS / "multi30k-en-de"
CAPTIONS = 90  # 30 paragraphs


@pytest.fixture(scope="module")
def texts():
    if not (MODEL / "checkpoints").is_dir():
        pytest.skip(f"the Multi30k model is not at {MODEL} (set MTKIT_MODELS to the folder holding multi30k-en-de)")
    if not (MULTI30K / "test_2016_flickr.en").is_file():
        pytest.skip(f"Multi30k is not at {MULTI30K}")
    src = (MULTI30K / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()[:CAPTIONS]
    ref = (MULTI30K / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:CAPTIONS]
    return src, ref


def paragraphs(lines: list[str]) -> list[str]:
    return [" ".join(lines[i:i + 3]) for i in range(0, len(lines), 3)]


def bleu(hyps: list[str], refs: list[str]) -> float:
    return sacrebleu.corpus_bleu(hyps, [refs]).score


@pytest.fixture(scope="module")
def model():
    return mtkit.load(MODEL, threads=1)


@pytest.fixture(scope="module")
def by_sentence(model, texts):
    """The captions one per line, joined three to a line after translation: what a paragraph should give."""
    src, _ = texts
    return paragraphs([r.text for r in model.translate(src, split="none")])


def test_paragraphs_translate_as_their_sentences_do_in_the_api(model, texts, by_sentence):
    src, ref = texts
    refs = paragraphs(ref)
    split = [r.text for r in model.translate(paragraphs(src))]
    whole = [r.text for r in model.translate(paragraphs(src), split="none")]
    target = bleu(by_sentence, refs)
    assert bleu(split, refs) >= 0.95 * target, (bleu(split, refs), target)
    assert bleu(whole, refs) < 0.8 * target  # without splitting, sentences vanish: the test can fail
    assert sum(len(t.split()) for t in split) >= 0.9 * sum(len(t.split()) for t in by_sentence)


def test_the_cli_translates_paragraphs_as_the_api_does(model, texts, tmp_path: Path):
    src, ref = texts
    (tmp_path / "para.en").write_text("".join(p + "\n" for p in paragraphs(src)), encoding="utf-8")
    done = run_mtkit("translate", "-m", MODEL, "--threads", "1", tmp_path / "para.en")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [r.text for r in model.translate(paragraphs(src))]
    assert "guard: " in done.stderr


def test_min_len_keeps_a_short_caption_from_ending_before_it(model, texts, tmp_path: Path):
    """fairseq's --min-len: EOS banned before that many pieces, in the API (greedy and beam) and the CLI."""
    line = "A dog runs."
    free = len(model.translate(line, beam=5).hypotheses[0].tokens)
    assert free < 12
    for beam in (1, 5):
        lengths = [len(model.translate(line, beam=beam, min_len=n).hypotheses[0].tokens) for n in (free + 3, 12)]
        assert lengths[0] >= free + 3 and lengths[1] >= 12, (beam, lengths)
    done = run_mtkit("translate", "-m", MODEL, "--threads", "1", "--min-len", 12, "--no-guard", stdin=line + "\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == model.translate(line, min_len=12, guard=False).text != model.translate(line).text


def test_both_server_apis_translate_paragraphs_as_the_api_does(model, texts):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from test_serve_libretranslate import Running

    from mtkit.serve.models import ServedModel
    from mtkit.serve.service import Limits

    src, _ = texts
    want = [r.text for r in model.translate(paragraphs(src))]
    server = Running([ServedModel("en-de", model.engine, "en", "de")], limits=Limits())
    try:
        status, answer = server.post_json("/translate", {"q": paragraphs(src), "source": "en", "target": "de"})
        assert status == 200, answer
        assert answer["translatedText"] == want
        status, answer = server.post_json("/v1/translate", {"text": paragraphs(src)})
        assert status == 200, answer
        assert [t["text"] for t in answer["translations"]] == want
        first = answer["translations"][0]["sentences"]
        assert [s["source"] for s in first] == src[:3] and all(s["missing"] == [] for s in first)
        status, answer = server.post_json("/v1/translate", {"text": paragraphs(src)[:2], "split": "none"})
        assert [t["text"] for t in answer["translations"]] == [r.text for r in model.translate(
            paragraphs(src)[:2], split="none")]
    finally:
        server.stop()


def _kept(sources: list[str], translations: list[str]) -> tuple[int, int]:
    from mtkit.text.guard import missing, protected_tokens

    tokens = [protected_tokens(s, "en", "de") for s in sources]
    return sum(len(t) - len(missing(t, h)) for t, h in zip(tokens, translations, strict=True)), sum(map(len, tokens))


@pytest.fixture(scope="module")
def number_captions(texts):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from real_text_sets import number_captions as made

    return made(60, seed=1, captions=(MULTI30K / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines())


@pytest.mark.parametrize("line", ["Two people in blue shirts are outside with a bullhorn for $275.",
                                  "The price was $12.50, see https://example.com."])
def test_what_the_guard_carries_back_is_not_left_in_a_loop(model, line):
    """Where forcing a lost number fails, the guard translates the sentence without it and puts it back by
    alignment; that translation, too, is searched again without repeating 3-grams when it loops (it gave "für 275
    Erbetetetet hat." and "Der Benzierierierierierierierierier, das 12,50 das https://example.com das Post putzt.")."""
    from mtkit.text.guard import looping, missing, protected_tokens

    tokens = protected_tokens(line, "en", "de")
    assert missing(tokens, model.translate(line, guard=False).text)  # the model alone loses them
    result = model.translate(line)
    [report] = result.sentences
    assert report["missing"] == [] and not missing(tokens, result.text), result.text
    assert report["loop"] is False and not looping(result.text, line), result.text
    assert run_mtkit("translate", "-m", MODEL, "--threads", "1", stdin=line + "\n").stdout.strip() == result.text


@pytest.mark.parametrize("engine", ["torch", "ctranslate2"])
def test_the_guard_keeps_numbers_times_codes_and_placeholders(model, number_captions, engine, tmp_path, monkeypatch):
    """≥ 95 % of what the number captions protect reaches the translation with the guard, against a small share
    without (the torch engine forces what was lost, then carries by alignment what forcing could not place;
    CTranslate2, which takes no include phrases, carries only)."""
    if engine == "ctranslate2":
        pytest.importorskip("ctranslate2")
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the read-only model's export goes to the cache
        model = mtkit.load(MODEL, engine="ctranslate2", threads=1)
    kept, total = _kept(number_captions, [r.text for r in model.translate(number_captions)])
    plain, _ = _kept(number_captions, [r.text for r in model.translate(number_captions, guard=False)])
    assert total >= 80
    assert kept >= 0.95 * total, (kept, total)
    assert plain < 0.5 * total  # the model alone loses most of them: the guard is what keeps them
    results = model.translate(number_captions[:6])
    assert all(s["missing"] == [] for r in results for s in r.sentences)
    assert any(s["repaired"] for r in results for s in r.sentences)

"""COMET in ``mtkit evaluate`` on tiny COMET models built here (tests/tiny_comet.py: a random XLM-R with a real
SentencePiece tokenizer, saved as unbabel-comet's releases are): the loading and scoring path, per-segment
JSON, the bootstrap, quality estimation without references, and one-line errors for models that cannot be
had. Equality with unbabel-comet itself: tests/integration/test_comet_reference.py."""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import write_tiny_checkpoint
from inprocess import run_mtkit
from tiny_comet import SENTENCES, write_tiny_comet

from mtkit.errors import MtkitError
from mtkit.metrics.comet import CometScorer, sparsemax
from mtkit.metrics.scores import paired_bootstrap_segments

SOURCES = SENTENCES[0::2] * 3
REFS = SENTENCES[1::2] * 3
HYPS = [REFS[0], "Ein Mann fährt.", REFS[2], "Zwei Hunde.", "", REFS[5], "Kinder essen Äpfel am Tisch.",
        REFS[7], "Strand.", REFS[9], "Die Frauen gehen am Strand.", REFS[11]]


@pytest.fixture(scope="module")
def kiwi(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("kiwi") / "tiny-kiwi"
    write_tiny_comet(folder, "unified_metric")
    ckpt = torch.load(folder / "checkpoints" / "model.ckpt", weights_only=True)
    ckpt["hyper_parameters"]["input_segments"] = ["mt", "src"]  # CometKiwi: no reference
    torch.save(ckpt, folder / "checkpoints" / "model.ckpt")
    return folder


@pytest.fixture()
def files(tmp_path) -> dict[str, Path]:
    paths = {}
    for name, lines in (("src.en", SOURCES), ("ref.de", REFS), ("hyp.de", HYPS), ("base.de", HYPS[::-1])):
        paths[name] = tmp_path / name
        paths[name].write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return paths


def mtkit_cli(*args: str, process: bool = False) -> subprocess.CompletedProcess:
    """The CLI in this process (what the command does is the subject here), or with ``process`` a real one
    offline (a hub name: huggingface_hub reads ``HF_HUB_OFFLINE`` once, when it is imported)."""
    if not process:
        return run_mtkit(*args)
    return subprocess.run([sys.executable, "-m", "mtkit", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_a_segment_scores_the_same_in_any_batch_and_order(comet):
    scorer = CometScorer(str(comet), device="cpu")
    whole = scorer.score(SOURCES, HYPS, REFS, batch_size=16, progress=False)
    order = list(range(len(HYPS)))
    random.Random(3).shuffle(order)
    one_by_one = scorer.score([SOURCES[i] for i in order], [HYPS[i] for i in order], [REFS[i] for i in order],
                              batch_size=1, progress=False)
    assert [one_by_one[order.index(i)] for i in range(len(HYPS))] == pytest.approx(whole, abs=1e-5)
    assert len(set(round(s, 4) for s in whole)) > 6  # the segments differ: the scores are the model's, not a constant
    assert whole[0] == pytest.approx(scorer.score(SOURCES[:1], HYPS[:1], REFS[:1], progress=False)[0], abs=1e-5)


def test_sparsemax_is_the_projection_onto_the_simplex():
    z = torch.tensor([0.3, 1.4, -2.0, 1.1, 0.9])
    p = sparsemax(z)
    assert float(p.sum()) == pytest.approx(1.0) and bool((p >= 0).all()) and int((p == 0).sum()) >= 1
    support = p > 0
    tau = z[support] - p[support]  # on the support z_i - p_i is one threshold; off it z_i is at most that
    assert torch.allclose(tau, tau[0].expand_as(tau)) and bool((z[~support] <= tau[0]).all())
    assert sparsemax(torch.tensor([5.0, 0.0, 0.0])).tolist() == [1.0, 0.0, 0.0]
    assert sparsemax(torch.zeros(4)).tolist() == [0.25] * 4


@pytest.mark.slow  # mtkit processes that load COMET (fast: the in-process tests above)
def test_evaluate_reports_comet_with_segments_signature_and_table(comet, files):
    args = ["evaluate", "--hyp", str(files["hyp.de"]), "--src", str(files["src.en"]), "--ref", str(files["ref.de"]),
            "--metrics", "bleu,comet", "--comet-model", str(comet)]
    done = mtkit_cli(*args, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert [s["metric"] for s in doc["scores"]] == ["BLEU", "COMET"]
    entry = doc["scores"][1]
    expected = CometScorer(str(comet), device="cpu").score(SOURCES, HYPS, REFS, progress=False)
    assert entry["segments"] == pytest.approx(expected, abs=1e-5) and len(entry["segments"]) == len(HYPS)
    assert entry["score"] == pytest.approx(sum(expected) / len(expected), abs=1e-6)
    assert entry["model"] == str(comet)
    assert entry["signature"].startswith(f"model:{comet}|class:regression_metric|encoder:{comet / 'encoder'}|mtkit:")
    table = mtkit_cli(*args)
    assert table.returncode == 0, table.stderr
    assert f"COMET  {entry['score']:6.4f}" in table.stdout and f"  COMET: {entry['signature']}" in table.stdout


@pytest.mark.slow  # mtkit processes that load COMET
def test_the_paired_bootstrap_covers_comet(comet, files):
    done = mtkit_cli("evaluate", "--hyp", str(files["base.de"]), "--hyp", str(files["hyp.de"]), "--src",
                 str(files["src.en"]), "--ref", str(files["ref.de"]), "--metrics", "chrf,comet", "--comet-model",
                 str(comet), "--json")
    assert done.returncode == 0, done.stderr
    systems = json.loads(done.stdout)["paired_test"]["systems"]
    assert [[s["metric"] for s in system["scores"]] for system in systems] == [["chrF2", "COMET"]] * 2
    baseline, other = (system["scores"][1] for system in systems)
    assert baseline["p_value"] is None and 0 < other["p_value"] <= 1
    assert "|bs:1000|seed:12345" in other["signature"]


def test_the_segment_bootstrap_tells_a_real_difference_from_none():
    rng = random.Random(0)
    base = [rng.uniform(0.5, 0.9) for _ in range(200)]
    noise = [rng.gauss(0, 0.05) for _ in base]
    noise = [e - sum(noise) / len(noise) for e in noise]  # as good on average, not segment by segment
    rows = paired_bootstrap_segments([("a", base), ("as good", [s + e for s, e in zip(base, noise)]),
                                      ("better", [s + 0.05 + e for s, e in zip(base, noise)])],
                                     "COMET", "sig", n_samples=500)
    assert rows[0].p_value is None and rows[1].p_value > 0.3 and rows[2].p_value < 0.01
    assert rows[1].score == pytest.approx(rows[0].score) and rows[2].score == pytest.approx(sum(base) / 200 + 0.05)
    assert abs(rows[2].mean - rows[2].score) < rows[2].ci95 and rows[2].ci95 > 0


@pytest.mark.slow  # mtkit processes that load COMET (fast: the in-process scorer tests)
def test_quality_estimation_needs_no_reference_with_a_reference_free_model(kiwi, comet, files):
    done = mtkit_cli("evaluate", "--hyp", str(files["hyp.de"]), "--src", str(files["src.en"]), "--metrics", "comet",
                 "--comet-model", str(kiwi), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["refs"] == [] and doc["n_sentences"] == len(HYPS)
    assert doc["scores"][0]["segments"] == pytest.approx(
        CometScorer(str(kiwi), device="cpu").score(SOURCES, HYPS, None, progress=False), abs=1e-5)
    needs = mtkit_cli("evaluate", "--hyp", str(files["hyp.de"]), "--src", str(files["src.en"]), "--metrics", "comet",
                  "--comet-model", str(comet))
    assert needs.returncode == 1 and needs.stderr.strip() == "error: no references given: pass --ref FILE"


@pytest.mark.slow  # mtkit processes that translate and load COMET
def test_evaluate_a_model_with_comet(comet, tmp_path):
    model = write_tiny_checkpoint(tmp_path / "model.pt", {"beam": 2, "max_len_b": 6})
    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    src.write_text("one two\nthree\n")
    ref.write_text("eins zwei\ndrei\n")
    done = mtkit_cli("evaluate", "-m", str(model), "--src", str(src), "--ref", str(ref), "--metrics", "comet",
                 "--comet-model", str(comet), "--hyp-out", str(tmp_path / "hyp.de"), "--json")
    assert done.returncode == 0, done.stderr
    hyps = (tmp_path / "hyp.de").read_text().splitlines()
    expected = CometScorer(str(comet), device="cpu").score(["one two", "three"], hyps, ["eins zwei", "drei"],
                                                           progress=False)
    assert json.loads(done.stdout)["scores"][0]["segments"] == pytest.approx(expected, abs=1e-5)


class Runs:
    """Pickled, it would call print when unpickled (a checkpoint that runs code)."""

    def __reduce__(self):
        return (print, ("ran code from the checkpoint",))


@pytest.mark.parametrize("breakage", [*(pytest.param(b, marks=pytest.mark.slow)  # mtkit processes that load COMET
                                        for b in ("missing", "hub", "lfs", "code", "layers", "class")), "refs", "src"])
def test_models_that_cannot_be_had_are_one_line_errors(comet, files, tmp_path, breakage):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(comet, model)
    ckpt = model / "checkpoints" / "model.ckpt"
    args = ["--src", str(files["src.en"]), "--ref", str(files["ref.de"])]
    if breakage == "missing":
        model, expected = tmp_path / "nowhere", f"{tmp_path / 'nowhere'}: no such directory (nor a hub name"
    elif breakage == "hub":
        model, expected = "Unbabel/not-a-model", "Unbabel/not-a-model: download failed ("
    elif breakage == "lfs":
        ckpt.write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 2\n")
        expected = f"{ckpt}: a Git LFS pointer, not the checkpoint"
    elif breakage == "code":
        payload = torch.load(ckpt, weights_only=True)
        payload["callbacks"] = Runs()
        torch.save(payload, ckpt, pickle_module=pickle)
        expected = f"{ckpt}: not a readable COMET checkpoint (its pickle names '__builtin__'.'print', which no"
    elif breakage == "layers":
        config = json.loads((model / "encoder" / "config.json").read_text())
        (model / "encoder" / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 30}))
        hparams = (model / "hparams.yaml").read_text().replace(str(comet / "encoder"), str(model / "encoder"))
        (model / "hparams.yaml").write_text(hparams)
        payload = torch.load(ckpt, weights_only=True)
        payload["hyper_parameters"]["pretrained_model"] = str(model / "encoder")
        torch.save(payload, ckpt)
        expected = f"{ckpt}: the encoder config ({model / 'encoder'}) says num_hidden_layers 30, the checkpoint's"
    elif breakage == "class":
        (model / "hparams.yaml").write_text("class_identifier: xcomet_metric\n")
        payload = torch.load(ckpt, weights_only=True)
        payload["hyper_parameters"]["class_identifier"] = "xcomet_metric"
        torch.save(payload, ckpt)
        expected = f"{model / 'hparams.yaml'}: class_identifier must be one of regression_metric"
    elif breakage == "refs":
        args = ["--src", str(files["src.en"]), "--metrics", "bleu,comet"]  # BLEU needs a reference
        expected = "nothing to score: give --hyp and --ref"
    else:
        args, expected = ["--ref", str(files["ref.de"])], "the metric comet needs the sources: give --src"
    if "--metrics" not in args:
        args += ["--metrics", "bleu,comet"]
    done = mtkit_cli("evaluate", "--hyp", str(files["hyp.de"]), *args, "--comet-model", str(model),
                     process=breakage == "hub")
    assert done.returncode == 1, (done.stdout, done.stderr)
    said = done.stderr.splitlines()  # a hub name is said to be downloading first
    assert said[-1].startswith(f"error: {expected}") and len(said) == 1 + (breakage == "hub"), done.stderr
    assert "ran code" not in done.stdout + done.stderr


@pytest.mark.slow  # a process of its own (fast: test_cli_in_process, in process)
def test_without_transformers_comet_says_which_extra_to_install(comet, files):
    code = ("import sys; sys.modules['transformers'] = None; from mtkit.cli import main; sys.argv = ['mtkit', "
            f"'evaluate', '--hyp', {str(files['hyp.de'])!r}, '--src', {str(files['src.en'])!r}, '--ref', "
            f"{str(files['ref.de'])!r}, '--metrics', 'comet', '--comet-model', {str(comet)!r}]; main()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr == "error: COMET needs transformers: pip install 'mtkit[comet]'\n"


def test_several_references_are_refused_for_comet(comet):
    from mtkit.metrics.files import score_lines

    scorer = CometScorer(str(comet), device="cpu")
    with pytest.raises(MtkitError, match="COMET takes one reference per sentence; give one --ref"):
        score_lines([("h", HYPS)], [("r1", REFS), ("r2", REFS)], ["comet"], sources=SOURCES, comet=scorer)


@pytest.mark.slow  # mtkit processes that translate and load COMET
def test_translate_gives_each_line_its_quality_estimate(kiwi, comet, tmp_path):
    model = write_tiny_checkpoint(tmp_path / "model.pt", {"beam": 2, "max_len_b": 6})
    src = tmp_path / "src.en"
    src.write_text("one two\n\nthree four five\nsix\n")
    as_json = mtkit_cli("translate", "-m", str(model), str(src), "--format", "json", "--qe")
    assert as_json.returncode == 0, as_json.stderr
    rows = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [r["qe"] for r in rows] == [r["confidence"] for r in rows] and rows[1]["qe"] is None
    column = mtkit_cli("translate", "-m", str(model), str(src), "--qe")
    assert column.stdout.splitlines() == [
        f"{r['text']}\t{'' if r['qe'] is None else format(r['qe'], '.4f')}" for r in rows]

    kiwied = mtkit_cli("translate", "-m", str(model), str(src), "--format", "json", "--qe-model", str(kiwi))
    assert kiwied.returncode == 0, kiwied.stderr
    rows = [json.loads(line) for line in kiwied.stdout.splitlines()]
    sources = ["one two", "three four five", "six"]
    expected = CometScorer(str(kiwi), device="cpu").score(sources, [rows[i]["text"] for i in (0, 2, 3)], None,
                                                          progress=False)
    assert [rows[i]["qe"] for i in (0, 2, 3)] == pytest.approx(expected, abs=1e-5) and rows[1]["qe"] is None
    streamed = subprocess.run([sys.executable, "-m", "mtkit", "translate", "-m", str(model), "--qe-model", str(kiwi)],
                              input=src.read_text(), capture_output=True, text=True, timeout=300,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert [line.split("\t")[1] for line in streamed.stdout.splitlines()] == [
        format(expected[0], ".4f"), "", format(expected[1], ".4f"), format(expected[2], ".4f")]

    for args, message in ((["--qe", "--format", "scores"], "--qe adds a column to --format text or a key to json"),
                          (["--qe-model", str(comet)], f"--qe-model {comet}: a reference-based COMET model")):
        refused = mtkit_cli("translate", "-m", str(model), str(src), *args)
        assert refused.returncode == 1 and refused.stderr.startswith(f"error: {message}"), refused.stderr


def test_mbr_with_comet_picks_the_candidate_comet_expects_best(comet, kiwi, tmp_path):
    import mtkit

    fixture = Path(__file__).resolve().parent.parent / "fixtures" / "checkpoint_format1" / "format1.pt"
    model = mtkit.load(fixture, threads=1)
    sources = ["india echo lima juliet", "delta kilo bravo", "", "alpha golf lima india foxtrot", "kilo india"]
    plain = model.translate(sources, beam=5, nbest=5, guard=False)
    chosen = model.translate(sources, mbr="comet", mbr_candidates=5, nbest=5, mbr_comet_model=str(comet), guard=False)
    scorer = CometScorer(str(comet), device="cpu")
    assert [r.source for r in chosen] == sources
    for source, p, c in zip(sources, plain, chosen):
        texts = [h.text for h in p.hypotheses]
        assert sorted(h.text for h in c.hypotheses) == sorted(texts)
        if len(set(texts)) > 1:  # judged here: each candidate's COMET against every other as its reference
            expected = [sum(scorer.score([source], [h], [r], progress=False)[0] for j, r in enumerate(texts) if j != i)
                        / (len(texts) - 1) for i, h in enumerate(texts)]
            ranked = [texts[i] for i in sorted(range(len(texts)), key=lambda i: -expected[i])]
            assert [h.text for h in c.hypotheses][0] == ranked[0]
    with pytest.raises(MtkitError, match="MBR's COMET utility scores candidates against each other"):
        model.translate(sources[:1], mbr="comet", mbr_candidates=3, mbr_comet_model=str(kiwi))
    # The COMET model is the engine's, which loaded it: another engine holds none; a bounded number is kept.
    assert str(comet) in model.engine.utilities and str(kiwi) not in model.engine.utilities
    other = mtkit.load(fixture, threads=1)
    assert len(other.engine.utilities) == 0
    other.engine.utilities.LIMIT = 1
    second = write_tiny_comet(tmp_path / "second-comet-da", "regression_metric", seed=1)
    for name in (comet, second):
        other.translate(sources[:2], mbr="comet", mbr_candidates=3, mbr_comet_model=str(name))
    assert str(second) in other.engine.utilities and len(other.engine.utilities) == 1
    refused = mtkit_cli("translate", "-m", str(fixture), "--mbr-comet-model", str(comet))
    assert refused.returncode == 1
    assert refused.stderr == "error: --mbr-comet-model needs --mbr comet (the model of its utility)\n"


@pytest.mark.slow  # mtkit processes that translate
def test_evaluate_without_references_reports_the_models_confidence(tmp_path):
    model = write_tiny_checkpoint(tmp_path / "model.pt", {"beam": 2, "max_len_b": 6})
    src = tmp_path / "src.en"
    src.write_text("one two\n\nthree four five\n")
    done = mtkit_cli("evaluate", "-m", str(model), "--src", str(src), "--metrics", "confidence", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    translated = mtkit_cli("translate", "-m", str(model), str(src), "--format", "json")
    confidences = [json.loads(line)["confidence"] for line in translated.stdout.splitlines()]
    entry = doc["scores"][0]
    assert doc["refs"] == [] and entry["metric"] == "confidence" and entry["segments"] == pytest.approx(confidences)
    assert entry["segments"][1] is None and entry["score"] == pytest.approx((confidences[0] + confidences[2]) / 2)
    table = mtkit_cli("evaluate", "-m", str(model), "--src", str(src), "--metrics", "confidence")
    assert f"confidence  {entry['score']:6.4f}" in table.stdout and "refs: none (quality estimation)" in table.stdout
    refused = mtkit_cli("evaluate", "--hyp", str(src), "--ref", str(src), "--metrics", "bleu,confidence")
    assert refused.returncode == 1
    assert refused.stderr == "error: the metric confidence is the translating model's own: it needs --model\n"

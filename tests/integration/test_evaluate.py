"""``mtkit evaluate`` glue end to end on generated files: equal to the sacrebleu CLI, JSON schema, errors."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from inprocess import run_mtkit

import mtkit
from mtkit.commands.evaluate import SCHEMA_VERSION, evaluate_files
from mtkit.config import DecodeOptions
from mtkit.errors import MtkitError
from mtkit.metrics import MetricOptions

REFS = [
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    "Fünf Leute in Winterjacken stehen im Schnee.",
    "Zwei Männer grüßen sich auf der Straße.",
    "東京は今日はとても晴れています。",
    "Ein Kind spielt mit einem Ball im Garten.",
    "Die Frau liest ein Buch über Äpfel und Öl.",
]
HYPS = [
    "Ein Mann mit orangem Hut starrt etwas an.",
    "",  # an empty hypothesis line is a valid (bad) translation
    "Zwei Männer grüßen einander auf der Straße.",
    "東京は今日晴れています。",
    "Ein Kind spielt im Garten mit einem Ball.",
    "Die Frau liest ein Buch über Äpfel und Öl.",
]
REFS2 = [
    "Ein Mann mit orangefarbenem Hut starrt auf etwas.",
    "Fünf Personen in Winterjacken stehen im Schnee.",
    "Zwei Männer begrüßen sich auf der Straße.",
    "東京は今日とても良い天気です。",
    "Ein Kind spielt im Garten mit einem Ball.",
    "Eine Frau liest ein Buch über Äpfel und Öl.",
]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {
        "hyp": _write(tmp_path / "hyp.de", HYPS),
        "ref": _write(tmp_path / "ref.de", REFS),
        "ref2": _write(tmp_path / "ref2.de", REFS2),
    }


def _sacrebleu_cli(refs: list[Path], hyp: Path, *extra: str) -> list[dict]:
    exe = Path(sys.executable).with_name("sacrebleu")
    cmd = [str(exe)] if exe.exists() else [shutil.which("sacrebleu") or "sacrebleu"]
    cmd += [*map(str, refs), "-i", str(hyp), "-m", "bleu", "chrf", "ter", "--format", "json", "-w", "4", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env={**os.environ, "PYTHONUTF8": "1"})
    return json.loads(out.stdout)


@pytest.mark.parametrize("n_refs", [1, 2])
@pytest.mark.parametrize("chrf_plus", [False, True])
def test_scores_equal_the_sacrebleu_command_line(files, n_refs, chrf_plus):
    refs = [files["ref"], files["ref2"]][:n_refs]
    ours = json.loads(evaluate_files([files["hyp"]], refs, ["bleu", "chrf", "ter"],
                                     MetricOptions(chrf_plus=chrf_plus), True))
    theirs = _sacrebleu_cli(refs, files["hyp"], *(["--chrf-word-order", "2"] if chrf_plus else []))
    assert [s["metric"] for s in ours["scores"]] == [t["name"] for t in theirs]
    for mine, cli in zip(ours["scores"], theirs):
        assert round(mine["score"], 4) == pytest.approx(cli["score"], abs=1e-9)
        assert mine["signature"] == cli["signature"]
    bleu = ours["scores"][0]
    verbose = f"{'/'.join(f'{p:.1f}' for p in bleu['precisions'])} (BP = {bleu['bp']:.3f}"
    assert theirs[0]["verbose_score"].startswith(verbose)
    assert f"hyp_len = {bleu['sys_len']} ref_len = {bleu['ref_len']}" in theirs[0]["verbose_score"]


def test_lowercase_scores_equal_sacrebleu_lc(files):
    ours = json.loads(evaluate_files([files["hyp"]], [files["ref"]], ["bleu", "chrf", "ter"],
                                     MetricOptions(lowercase=True), True))
    theirs = _sacrebleu_cli([files["ref"]], files["hyp"], "-lc", "--chrf-lowercase")
    for mine, cli in zip(ours["scores"], theirs):
        assert round(mine["score"], 4) == pytest.approx(cli["score"], abs=1e-9)
        assert mine["signature"] == cli["signature"]
    assert "case:lc" in ours["scores"][0]["signature"]
    cased = json.loads(evaluate_files([files["hyp"]], [files["ref"]], ["bleu"], MetricOptions(), True))["scores"][0]
    assert "case:mixed" in cased["signature"]


# The documented schema (module docstring of mtkit.commands.evaluate) as data: key -> type.
_COMMON = {"metric": str, "score": float, "signature": str}
_BLEU = {**_COMMON, "counts": [int], "totals": [int], "precisions": [float], "bp": float, "sys_len": int,
         "ref_len": int}
_CHRF = {**_COMMON, "char_order": int, "word_order": int, "beta": int}
_TER = {**_COMMON, "num_edits": int, "ref_length": float}
_PAIRED_SCORE = {**_COMMON, "mean": float, "ci95": float, "p_value": (float, type(None))}
_TOP = {"mtkit_version": str, "schema_version": int, "hyp": str, "refs": [str], "n_sentences": int,
        "scores": list, "paired_test": (dict, type(None))}


def _check(obj: dict, schema: dict) -> None:
    assert set(obj) == set(schema), f"keys {sorted(obj)} != {sorted(schema)}"
    for key, kind in schema.items():
        value = obj[key]
        if isinstance(kind, list):
            assert isinstance(value, list) and all(isinstance(v, kind[0]) for v in value), key
        else:
            kinds = kind if isinstance(kind, tuple) else (kind,)
            if float in kinds and isinstance(value, int) and not isinstance(value, bool):
                continue  # JSON writes 100.0 as 100.0, but a reader may hand back an int
            assert isinstance(value, kinds), f"{key}: {value!r}"


def _check_document(doc: dict) -> None:
    _check(doc, _TOP)
    assert doc["schema_version"] == SCHEMA_VERSION and doc["mtkit_version"] == mtkit.__version__
    for entry in doc["scores"]:
        name = entry["metric"]
        schema = _BLEU if name.startswith("BLEU") else _CHRF if name.startswith("chrF") else _TER
        _check(entry, schema)
        if schema is _BLEU:
            assert len(entry["counts"]) == len(entry["totals"]) == len(entry["precisions"]) == 4
    if doc["paired_test"] is not None:
        paired = doc["paired_test"]
        _check(paired, {"method": str, "n_samples": int, "baseline": str, "systems": list})
        assert paired["method"] == "paired_bs" and paired["baseline"] == doc["hyp"]
        for system in paired["systems"]:
            _check(system, {"hyp": str, "scores": list})
            for entry in system["scores"]:
                _check(entry, _PAIRED_SCORE)


def test_json_follows_the_documented_schema(files):
    doc = json.loads(evaluate_files([files["hyp"]], [files["ref"], files["ref2"]], ["bleu", "chrf", "ter"],
                                    MetricOptions(lowercase_tok=True), True))
    _check_document(doc)
    assert doc["hyp"] == str(files["hyp"]) and doc["refs"] == [str(files["ref"]), str(files["ref2"])]
    assert doc["n_sentences"] == len(HYPS) and doc["paired_test"] is None
    assert [s["metric"] for s in doc["scores"]] == ["BLEU", "chrF2", "TER", "BLEU-lc-tok"]  # lang from ".de"


def test_paired_bootstrap_on_two_hypothesis_files(files, tmp_path):
    other = _write(tmp_path / "other.de", REFS2)
    doc = json.loads(evaluate_files([files["hyp"], other], [files["ref"]], ["bleu", "chrf"],
                                    MetricOptions(), True, n_samples=200))
    _check_document(doc)
    systems = doc["paired_test"]["systems"]
    assert [s["hyp"] for s in systems] == [str(files["hyp"]), str(other)]
    baseline, candidate = ([e for e in s["scores"] if e["metric"] == "BLEU"][0] for s in systems)
    assert baseline["p_value"] is None and 0.0 <= candidate["p_value"] <= 1.0
    assert baseline["ci95"] >= 0 and candidate["ci95"] >= 0
    assert baseline["score"] == pytest.approx(doc["scores"][0]["score"])
    table = evaluate_files([files["hyp"], other], [files["ref"]], ["bleu"], MetricOptions(), False, n_samples=100)
    assert "p=" in table and "95% CI" in table and "bs:100" in table


def test_table_lists_scores_and_signatures(files):
    table = evaluate_files([files["hyp"]], [files["ref"]], ["bleu", "chrf", "ter"],
                           MetricOptions(chrf_plus=True), False)
    lines = table.splitlines()
    assert any(line.startswith("BLEU ") and "BP" in line for line in lines)
    assert any(line.startswith("chrF2++") for line in lines) and any(line.startswith("TER") for line in lines)
    assert "signatures:" in lines and any("tok:13a" in line for line in lines)


def test_line_count_mismatch_names_both_files_and_counts(files, tmp_path):
    short = _write(tmp_path / "short.de", REFS[:4])
    with pytest.raises(MtkitError) as error:
        evaluate_files([files["hyp"]], [short], ["bleu"], MetricOptions(), False)
    message = str(error.value)
    assert str(files["hyp"]) in message and str(short) in message and "6 lines" in message and "has 4" in message
    assert "\n" not in message


@pytest.mark.parametrize("metrics", ["", ",", " , "])
def test_an_empty_metrics_list_is_a_one_line_error(files, metrics):
    """`--metrics ''` and `--metrics ,` once ended in a ValueError traceback (max() of no results)."""
    with pytest.raises(MtkitError, match="^no metric given: choose from bleu, chrf, ter$"):
        evaluate_files([files["hyp"]], [files["ref"]], [], MetricOptions(), False)
    result = run_mtkit("evaluate", "--hyp", files["hyp"], "--ref", files["ref"], "--metrics", metrics)
    assert result.returncode == 1, result.stderr
    expected = ("error: --metrics: no metric given; expected a comma-separated list of bleu, chrf, ter, comet, "
                "confidence")
    assert result.stderr.splitlines() == [expected]


def test_gzipped_input_and_missing_file(files, tmp_path):
    gz = tmp_path / "hyp.de.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in HYPS))
    plain = json.loads(evaluate_files([files["hyp"]], [files["ref"]], ["bleu"], MetricOptions(), True))
    zipped = json.loads(evaluate_files([gz], [files["ref"]], ["bleu"], MetricOptions(), True))
    assert zipped["scores"] == plain["scores"]
    with pytest.raises(MtkitError, match="no such file"):
        evaluate_files([tmp_path / "missing.de"], [files["ref"]], ["bleu"], MetricOptions(), False)


def test_lc_tok_needs_a_language(tmp_path):
    hyp, ref = _write(tmp_path / "hyp.txt", ["a b"]), _write(tmp_path / "ref.txt", ["a b"])
    with pytest.raises(MtkitError, match="--lang"):
        evaluate_files([hyp], [ref], ["bleu"], MetricOptions(lowercase_tok=True), False)
    doc = json.loads(evaluate_files([hyp], [ref], ["bleu"], MetricOptions(lowercase_tok=True, lang="en"), True))
    assert doc["scores"][-1]["metric"] == "BLEU-lc-tok"


def test_lc_tok_against_the_official_multi30k_file():
    root = Path(os.environ.get("MTKIT_MULTI30K", Path(__file__).resolve().parents[2].parent / "shared/data/multi30k"))
    raw, official = root / "test_2016_flickr.de", root / "tok/test_2016_flickr.lc.norm.tok.de"
    if not official.exists():
        pytest.skip(f"Multi30k test files not found under {root} (set MTKIT_MULTI30K)")
    doc = json.loads(evaluate_files([raw], [official], ["bleu"],
                                    MetricOptions(lowercase_tok=True), True))  # lang "de" from the name
    lctok = doc["scores"][-1]
    assert lctok["metric"] == "BLEU-lc-tok" and lctok["score"] == pytest.approx(100.0)
    assert "refs:given" in lctok["signature"]  # the official file is used as it is, not tokenized twice


def test_empty_files_are_a_user_error(tmp_path):
    empty_hyp, empty_ref = _write(tmp_path / "hyp.de", []), _write(tmp_path / "ref.de", [])
    with pytest.raises(MtkitError, match="ref.de: empty file"):
        evaluate_files([empty_hyp], [empty_ref], ["bleu"], MetricOptions(), False)


def _files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A run directory holding an untrained tiny checkpoint (scores are low; what is written matters
    here), a source file and its reference."""
    import torch

    from mtkit.config import Config, DecodeConfig, ModelConfig, SpmConfig, config_to_dict
    from mtkit.data.vocab import Vocab, train_model
    from mtkit.model import Transformer

    root = tmp_path_factory.mktemp("evaluate")
    src = _write(root / "test.en", [line.lower() for line in REFS2])
    vocab = Vocab.from_bytes(train_model(REFS * 20 + REFS2 * 20, SpmConfig(vocab_size=120)))
    cfg = ModelConfig(d_model=16, h=2, d_ff=32, encoder_layers=1, decoder_layers=1, dropout=0.0, max_positions=64)
    torch.manual_seed(0)
    run = root / "run"
    (run / "checkpoints").mkdir(parents=True)
    torch.save({
        "format_version": 1, "mtkit_version": mtkit.__version__, "step": 7,
        "config": config_to_dict(Config(model=cfg, decode=DecodeConfig(beam=2, max_len_b=4))),
        "model": Transformer(cfg, vocab.src_size, vocab.tgt_size).state_dict(),
        "vocab": {"src": vocab.model_bytes()[0], "tgt": None},
        "src_vocab_size": vocab.src_size, "tgt_vocab_size": vocab.tgt_size,
    }, run / "checkpoints" / "last.pt")
    return run, src, _write(root / "ref.de", REFS)


def _mtkit(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    """The CLI in this process: what the command does is the subject here, not the process."""
    return run_mtkit(*args, stdin=stdin)


def test_hypotheses_from_stdin(files):
    result = _mtkit("evaluate", "--hyp", "-", "--ref", files["ref"], "--json", stdin="".join(h + "\n" for h in HYPS))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["hyp"] == "<stdin>"
    expected = json.loads(evaluate_files([files["hyp"]], [files["ref"]], ["bleu", "chrf", "ter"],
                                         MetricOptions(), True))
    assert doc["scores"] == expected["scores"]
    twice = _mtkit("evaluate", "--hyp", "-", "--ref", "-", stdin="a\n")
    assert twice.returncode == 1 and twice.stderr.startswith("error: only one of") and "Traceback" not in twice.stderr


@pytest.mark.slow  # an mtkit process that loads and runs the model (fast: test_cli_in_process, test_translator)
def test_model_translations_are_scored_in_memory(tiny_run, tmp_path):
    run, src, ref = tiny_run
    before = _files_under(run.parent)
    result = _mtkit("evaluate", "-m", run, "--src", src, "--ref", ref, "--json")
    assert result.returncode == 0, result.stderr
    assert _files_under(run.parent) == before  # nothing beside the model (no RUN/eval/)
    assert f"loaded {run / 'checkpoints' / 'last.pt'} (step 7)" in result.stderr
    doc = json.loads(result.stdout)
    assert doc["hyp"] == str(run) and doc["n_sentences"] == len(REFS)

    out = tmp_path / "hyp.de"
    result = _mtkit("evaluate", "-m", run, "--src", src, "--ref", ref, "--hyp-out", out, "--json")
    assert result.returncode == 0, result.stderr
    assert len(out.read_text(encoding="utf-8").splitlines()) == len(REFS)
    assert json.loads(result.stdout)["scores"] == doc["scores"]
    bad = _mtkit("evaluate", "-m", run, "--src", src, "--ref", ref, "--beam", "0")
    assert bad.returncode == 1 and bad.stderr.splitlines()[-1] == "error: --beam: must be >= 1, got 0"


def test_testset_references_stay_in_memory(files, tiny_run, tmp_path, monkeypatch):
    import mtkit.commands.evaluate
    from mtkit.commands.evaluate import EvaluateOptions, evaluate

    run, src, _ = tiny_run
    sources = src.read_text(encoding="utf-8").splitlines()
    monkeypatch.setattr(mtkit.commands.evaluate, "load_testset", lambda name, langpair: (sources, [REFS]))
    monkeypatch.chdir(tmp_path)
    options = dict(ref=[], src=None, testset="wmt14/full", langpair="en-de", hyp_out=None, metrics=["bleu"],
                   chrf_plus=False, lc_tok=True, compound_split=False, lang=None, as_json=True, decode=DecodeOptions(),
                   device="cpu")
    before = _files_under(tmp_path) | _files_under(run.parent) | _files_under(files["hyp"].parent)
    doc = json.loads(evaluate(EvaluateOptions(hyp=[files["hyp"]], model=None, **options)))
    assert doc["refs"] == ["wmt14/full:en-de"]
    assert [s["metric"] for s in doc["scores"]] == ["BLEU", "BLEU-lc-tok"]  # the language from --langpair
    expected = json.loads(evaluate_files([files["hyp"]], [files["ref"]], ["bleu"],
                                         MetricOptions(lowercase_tok=True), True))
    assert doc["scores"] == expected["scores"]
    evaluate(EvaluateOptions(hyp=[], model=[run], **options))
    assert _files_under(tmp_path) | _files_under(run.parent) | _files_under(files["hyp"].parent) == before


@pytest.mark.slow
def test_engine_ctranslate2_scores_the_checkpoints_kept_export(tiny_run, tmp_path):
    """``evaluate --engine ctranslate2 -m RUN`` translates as ``translate --engine ctranslate2 -m RUN`` does: through
    the run's kept export, made on first use."""
    import shutil

    pytest.importorskip("ctranslate2")
    run, src, ref = tiny_run
    run = shutil.copytree(run, tmp_path / "run")  # the kept export is written beside the checkpoint
    out = tmp_path / "hyp.de"
    result = _mtkit("evaluate", "--engine", "ctranslate2", "-m", run, "--src", src, "--ref", ref, "--hyp-out", out)
    assert result.returncode == 0, result.stderr
    translated = _mtkit("translate", "--engine", "ctranslate2", "-m", run, src)
    assert translated.returncode == 0, translated.stderr
    assert out.read_text(encoding="utf-8") == translated.stdout

"""The real CLI end to end: prepare → train → translate → evaluate, exit codes, user errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import TINY_MODEL, reverse_data_config, write_reverse_corpus
from inprocess import run_mtkit

pytestmark = pytest.mark.slow  # real processes and training: the fast tier is pytest -m 'not slow'

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "MTKIT_DEBUG": ""}


def mtkit(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The CLI in this process (what each command does, its outputs, messages and exit codes)."""
    return run_mtkit(*args, stdin=stdin, cwd=cwd)


def mtkit_process(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """A real ``python -m mtkit``: standard input read from a pipe as it comes."""
    return subprocess.run([sys.executable, "-m", "mtkit", *args], input=stdin, capture_output=True, text=True,
                          env=ENV, timeout=600)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """Run prepare and train through the CLI once; return the folder and timings."""
    root = tmp_path_factory.mktemp("cli")
    files = write_reverse_corpus(root / "text", n_train=2000, n_valid=40)
    recipe = root / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "data": reverse_data_config(files),
        "model": TINY_MODEL,
        # 200 updates: test BLEU already far above the 50 asserted below (two step checkpoints, as at 400)
        "train": {"max_tokens": 600, "lr_schedule": "inverse_sqrt", "lr": 3e-3, "warmup": 40, "max_steps": 200,
                  "label_smoothing": 0.0, "log_every": 50, "valid_every": 100, "save_every": 100, "keep_last": 2},
        "decode": {"beam": 2},
    }))
    prep = mtkit("prepare", str(recipe), "--out", str(root / "data"))
    train = mtkit("train", str(recipe), "--data", str(root / "data"), "--run-dir", str(root / "run"))
    return root, files, prep, train


def test_prepare_and_train_write_their_files(pipeline):
    root, _, prep, train = pipeline
    assert prep.returncode == 0, prep.stderr
    assert train.returncode == 0, train.stderr
    for name in ("manifest.json", "spm.model", "train.store.json", "valid.src.txt", "test.tgt.txt"):
        assert (root / "data" / name).is_file(), name
    for name in ("config.yaml", "spm.model", "metrics.jsonl", "curves.png", "checkpoints/last.pt",
                 "checkpoints/best.pt"):
        assert (root / "run" / name).is_file(), name
    # Piped output stays quiet: no progress bar on stderr.
    assert "\r" not in train.stderr and "it/s" not in train.stderr


def test_translate_keeps_one_line_per_input_line(pipeline):
    root, files, *_ = pipeline
    lines = ["alpha bravo charlie", "", "delta echo", "   ", "kilo lima golf hotel india"]
    result = mtkit_process("translate", "-m", str(root / "run"), stdin="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr
    out = result.stdout.split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)
    assert out[1] == "" and out[3] == ""
    assert out[0] and out[2] and out[4]
    assert set(out[2].split()) <= {"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
                                   "juliet", "kilo", "lima"}
    # A file argument and --output work too.
    result = mtkit("translate", "-m", str(root / "run"), str(files["test"][0]), "-o", str(root / "test.hyp"))
    assert result.returncode == 0, result.stderr
    n_in = len(files["test"][0].read_text().splitlines())
    assert len((root / "test.hyp").read_text().splitlines()) == n_in


def test_evaluate_files_and_model(pipeline):
    root, files, *_ = pipeline
    hyp = root / "eval.hyp"
    result = mtkit("evaluate", "-m", str(root / "run"), "--src", str(files["test"][0]), "--ref", str(files["test"][1]),
                   "--hyp-out", str(hyp), "--json")
    assert result.returncode == 0, result.stderr
    scores = {s["metric"]: s for s in json.loads(result.stdout)["scores"]}
    assert scores["BLEU"]["score"] > 50  # the reverse task is being learned
    assert scores["BLEU"]["signature"].startswith("nrefs:1|case:mixed")
    assert len(hyp.read_text().splitlines()) == len(files["test"][0].read_text().splitlines())
    table = mtkit("evaluate", "--hyp", str(hyp), "--ref", str(files["test"][1]))
    assert table.returncode == 0 and "BLEU" in table.stdout and "nrefs:1" in table.stdout


def test_average_and_curves_commands(pipeline):
    root, *_ = pipeline
    result = mtkit("average", str(root / "run"), "--last", "2")
    assert result.returncode == 0, result.stderr
    assert (root / "run" / "checkpoints" / "averaged.pt").is_file()
    (root / "run" / "curves.png").unlink()
    assert mtkit("curves", str(root / "run")).returncode == 0
    assert (root / "run" / "curves.png").is_file()


def test_help_and_version():
    result = mtkit("--help")
    assert result.returncode == 0
    for command in ("prepare", "train", "translate", "evaluate"):
        assert command in result.stdout
    version = mtkit("--version")
    assert version.returncode == 0 and version.stdout.startswith("mtkit ")
    for command in ("prepare", "train", "translate", "evaluate"):
        sub = mtkit(command, "--help")
        assert sub.returncode == 0 and "Example" in sub.stdout


def test_help_does_not_import_heavy_libraries():
    code = "import sys; sys.argv=['mtkit','--help']\nfrom mtkit.cli import main\ntry:\n    main()\n" \
           "except SystemExit:\n    pass\n" \
           "print('HEAVY', sorted(m for m in ('torch','datasets','sacrebleu','sentencepiece') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert "HEAVY []" in result.stdout


def test_usage_error_exits_2():
    result = mtkit("train", "--no-such-option")
    assert result.returncode == 2


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_missing_input_file_is_a_one_line_error(tmp_path):
    message = one_line_error(mtkit("prepare", "--src", str(tmp_path / "nope.en"), "--tgt", str(tmp_path / "nope.de"),
                                   "--out", str(tmp_path / "out")))
    assert "nope.en" in message


def test_malformed_yaml_names_the_file_and_line(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("model:\n  d_model: 512\n  h: [8\n")
    message = one_line_error(mtkit("train", str(recipe), "--data", str(tmp_path), "--run-dir", str(tmp_path / "r")))
    assert "bad.yaml" in message and "line" in message


def test_unknown_key_names_the_dotted_key_and_the_closest(tmp_path):
    recipe = tmp_path / "typo.yaml"
    recipe.write_text("train:\n  max_stpes: 10\n")
    message = one_line_error(mtkit("train", str(recipe), "--data", str(tmp_path), "--run-dir", str(tmp_path / "r")))
    assert "train.max_stpes" in message and "max_steps" in message
    message = one_line_error(mtkit("train", "--data", str(tmp_path), "--run-dir", str(tmp_path / "r"),
                                   "--set", "model.d_modle=64"))
    assert "model.d_modle" in message and "d_model" in message


def test_debug_shows_the_traceback(tmp_path):
    result = mtkit("--debug", "prepare", "--src", str(tmp_path / "x"), "--tgt", str(tmp_path / "y"),
                   "--out", str(tmp_path / "o"))
    assert result.returncode == 1 and "Traceback" in result.stderr


def tiny_recipe(tmp_path, **sections) -> Path:
    """A recipe of the tiny model on a small reverse corpus (300 training pairs, 20 validation), with ``sections``."""
    files = write_reverse_corpus(tmp_path / "text", n_train=300, n_valid=20)
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(yaml.safe_dump({"data": reverse_data_config(files), "model": TINY_MODEL, **sections}))
    return recipe


def test_run_does_every_stage_then_skips_what_is_complete(tmp_path):
    recipe = tiny_recipe(
        tmp_path,
        train={"max_tokens": 600, "max_steps": 6, "log_every": 2, "valid_every": 3, "save_every": 3, "average_last": 2},
        decode={"beam": 2},
        eval={"metrics": ["bleu", "chrf"], "examples": 2},
    )
    first = mtkit("run", str(recipe), "-w", str(tmp_path / "work"))
    assert first.returncode == 0, first.stderr
    assert "BLEU" in first.stdout and "examples:" in first.stdout
    assert (tmp_path / "work" / "run" / "checkpoints" / "averaged.pt").is_file()
    assert len((tmp_path / "work" / "test.hyp").read_text().splitlines()) == 20
    scores = json.loads((tmp_path / "work" / "scores.json").read_text())
    assert [s["metric"] for s in scores["scores"]] == ["BLEU", "chrF2"]
    # Each stage says how long it took, on stderr and in scores.json.
    assert list(scores["stage_seconds"]) == ["prepare", "train", "translate", "score"]
    assert all(f"[mtkit run] {stage}: " in first.stderr for stage in scores["stage_seconds"])
    second = mtkit("run", str(recipe), "-w", str(tmp_path / "work"))
    assert second.returncode == 0, second.stderr
    assert "has finished; skipped" in second.stderr and "train →" not in second.stderr
    assert "already prepared from identical inputs" in second.stderr
    assert "`mtkit prepare --force` rebuilds it" in second.stderr  # mtkit run itself has no --force
    # Evaluation decodes with the recipe's decode section and its --set overrides, not the checkpoint's:
    # an output limit of a·S + b = 0 leaves every hypothesis one token at most.
    assert max(len(h.split()) for h in (tmp_path / "work" / "test.hyp").read_text().splitlines()) > 1
    third = mtkit("run", str(recipe), "-w", str(tmp_path / "work"), "--set", "decode.max_len_a=0", "--set",
                  "decode.max_len_b=0")
    assert third.returncode == 0, third.stderr
    hyps = (tmp_path / "work" / "test.hyp").read_text().splitlines()
    assert len(hyps) == 20 and all(len(h.split()) <= 1 for h in hyps)
    # A recipe that asks for a shortlist has it built after training, and decodes with it when it says so.
    fourth = mtkit("run", str(recipe), "-w", str(tmp_path / "work"), "--set", "shortlist.build=true", "--set",
                   "decode.shortlist=true")
    assert fourth.returncode == 0, fourth.stderr
    assert "shortlist → " in fourth.stderr and (tmp_path / "work" / "run" / "shortlist.txt").is_file()
    assert len((tmp_path / "work" / "test.hyp").read_text().splitlines()) == 20


def test_a_recipe_that_decodes_with_a_shortlist_validates_bleu_without_it_while_training(tmp_path):
    """The shortlist is built from the trained run, after training: validation BLEU measures the model alone."""
    recipe = tiny_recipe(
        tmp_path,
        train={"max_tokens": 600, "max_steps": 4, "log_every": 2, "valid_every": 2, "bleu_every": 2, "save_every": 2,
               "average_last": 2},
        decode={"beam": 2, "shortlist": True},
        shortlist={"build": True},
    )
    done = mtkit("run", str(recipe), "-w", str(tmp_path / "work"))
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in (tmp_path / "work" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "valid_bleu" in r] == [2, 4]
    assert (tmp_path / "work" / "run" / "shortlist.txt").is_file() and "BLEU" in done.stdout


def test_run_of_a_lowercasing_vocabulary_scores_case_insensitively(tmp_path):
    files = write_reverse_corpus(tmp_path / "text", n_train=300, n_valid=20)
    for path in files["train"] + files["test"]:  # cased text, so that folding has something to do
        path.write_text("".join(line.capitalize() + "\n" for line in path.read_text().splitlines()))
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(yaml.safe_dump({
        "data": {**reverse_data_config(files), "spm": {"vocab_size": 100, "model_type": "bpe", "lowercase": True}},
        "model": TINY_MODEL,
        "train": {"max_tokens": 600, "max_steps": 4, "log_every": 2, "valid_every": 4, "save_every": 4},
        "decode": {"beam": 1},
        "eval": {"metrics": ["bleu", "chrf"], "examples": 0},
    }))
    done = mtkit("run", str(recipe), "-w", str(tmp_path / "work"))
    assert done.returncode == 0, done.stderr
    assert "lowercases its output" in done.stderr
    hyps = (tmp_path / "work" / "test.hyp").read_text().splitlines()
    assert len(hyps) == 20 and all(h == h.lower() for h in hyps)
    scores = json.loads((tmp_path / "work" / "scores.json").read_text())["scores"]
    assert "case:lc" in scores[0]["signature"] and "case:lc" in scores[1]["signature"]


def test_decode_options_go_through_the_strict_check(pipeline):
    root, *_ = pipeline
    message = one_line_error(mtkit("translate", "-m", str(root / "run"), "--beam", "2", "--nbest", "3",
                                   stdin="alpha\n"))
    assert "nbest" in message

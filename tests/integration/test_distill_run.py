"""`mtkit run` on a distillation recipe: killed (SIGKILL) while the teacher translates, it resumes without
translating the finished shards again, then prepares, trains, averages and evaluates the student."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import TINY_MODEL, reverse_data_config, write_reverse_corpus
from inprocess import run_mtkit

pytestmark = pytest.mark.slow  # a real teacher translating 1500 lines, a student trained, processes killed


def test_a_distillation_run_killed_in_translation_resumes_and_finishes(reverse_run, tmp_path):
    files = write_reverse_corpus(tmp_path / "text", n_train=1500, n_valid=40, seed=5)
    recipe = {
        "data": reverse_data_config(files),
        "model": {**TINY_MODEL, "decoder_layers": 1},  # a student with a shallower decoder
        "decode": {"beam": 2},
        "train": {"max_tokens": 600, "lr_schedule": "inverse_sqrt", "lr": 3e-3, "warmup": 20, "max_steps": 30,
                  "log_every": 10, "valid_every": 0, "save_every": 0, "seed": 1},
        # the engine table's processes once each (quick): its full sweep is 4 processes a figure, 48 in all
        "distill": {"teacher": [str(reverse_run)], "shard_lines": 100, "filter_share": 0.1, "engine_table": "quick"},
        "eval": {"metrics": ["bleu"], "examples": 0},
    }
    del recipe["data"]["spm"]  # the teacher's
    (tmp_path / "distill.yaml").write_text(yaml.safe_dump(recipe))
    work = tmp_path / "work"
    command = [sys.executable, "-m", "mtkit", "run", str(tmp_path / "distill.yaml"), "-w", str(work)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    shards = work / "distill" / "shards"
    first = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while not (shards / "000002.tsv").exists():
            assert first.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no shard after 10 minutes"
            time.sleep(0.05)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert not (shards / "done").exists()
    before = {p.name: p.stat().st_mtime_ns for p in shards.glob("*.tsv")}
    assert len(before) >= 3

    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr
    assert f"distill: {len(before)} of 15 shards were translated before; kept" in done.stderr
    for name, mtime in before.items():
        assert (shards / name).stat().st_mtime_ns == mtime, f"{name} was translated again"
    assert (shards / "done").read_text() == "15\n"
    counts = json.loads((work / "distill" / "filter.json").read_text())
    assert counts["translated"] == 1500 and counts["dropped"] == 150 and counts["kept"] == 1350
    scores = json.loads((work / "scores.json").read_text())
    assert scores["scores"][0]["metric"] == "BLEU" and "distill" in scores["stage_seconds"]
    student = yaml.safe_load((work / "run" / "config.yaml").read_text())
    assert student["data"]["train"]["src"] == str(work / "distill" / "train.src")
    assert student["data"]["spm"]["vocab_from"] == str(reverse_run)
    assert (work / "data" / "spm.model").read_bytes() == (reverse_run / "spm.model").read_bytes()

    # The engine table: the teacher and the student in torch fp32, CTranslate2 fp32 and int8.
    rows = json.loads((work / "engines.json").read_text())
    assert [(r["model"], r["engine"], r["weights"]) for r in rows] == [
        (m, e, w) for m in ("teacher", "student") for e, w in (("torch", "fp32"), ("ctranslate2", "fp32"),
                                                               ("ctranslate2", "int8"))]
    by = {(r["model"], r["engine"], r["weights"]): r for r in rows}
    student_torch = Path(by["student", "torch", "fp32"]["hypotheses"]).read_text()
    assert student_torch == (work / "test.hyp").read_text()  # the same translation as the run's own
    for r in rows:
        assert r["batched"]["sentences_per_s"] > 0 and r["batch 1"]["sentences_per_s"] > 0 and r["peak_bytes"] > 0
        assert "BLEU" in r["scores"] and r["batched"]["threads"] in (1, 2)
        assert r["batched"]["omp_wait_policy"] in ("default", "PASSIVE") and r["peak_bytes"] < 2 << 30
    for model in ("teacher", "student"):
        assert by[model, "ctranslate2", "int8"]["size_bytes"] < by[model, "ctranslate2", "fp32"]["size_bytes"]
    assert by["student", "torch", "fp32"]["size_bytes"] < by["teacher", "torch", "fp32"]["size_bytes"]
    assert "student / teacher, ctranslate2 int8:" in done.stdout and "sent/s b1" in done.stdout

    again = run_mtkit(*command[3:])  # in this process: every stage is skipped, nothing runs that a process would
    assert again.returncode == 0 and "written; skipped" in again.stderr, again.stderr

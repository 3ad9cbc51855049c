"""train.ensemble: independent members trained side by side, decoded together (the real CLI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TINY_MODEL, reverse_data_config, write_reverse_corpus
from inprocess import run_mtkit

from mtkit.commands import processes as ensemble
from mtkit.config import config_from_dict
from mtkit.text.pipeline import translate_lines

pytestmark = pytest.mark.slow  # real processes and training: the fast tier is pytest -m 'not slow'

ENV = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
ENV.update({"OMP_WAIT_POLICY": "PASSIVE", "MTKIT_DEBUG": ""})


def mtkit(*args: str) -> subprocess.CompletedProcess:
    """A real ``python -m mtkit`` (without the tests' OMP_NUM_THREADS: members share the cores as a user's would)."""
    return subprocess.run([sys.executable, "-m", "mtkit", *args], capture_output=True, text=True, env=ENV, timeout=600)


def mtkit_cli(*args: str) -> subprocess.CompletedProcess:
    """The CLI in this process: for the commands that start no member processes (what they say is the subject)."""
    return run_mtkit(*args)


def tiny_recipe(tmp_path: Path, **train) -> Path:
    files = write_reverse_corpus(tmp_path / "text", n_train=300, n_valid=20)
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(yaml.safe_dump({
        "data": reverse_data_config(files),
        "model": {**TINY_MODEL, "dropout": 0.1},
        "train": {"max_tokens": 600, "max_steps": 6, "log_every": 2, "valid_every": 3, "save_every": 3,
                  "average_last": 2, "seed": 5, "ensemble": 2, **train},
        "decode": {"beam": 2},
        "eval": {"metrics": ["bleu"], "examples": 0},
    }))
    return recipe


def test_members_get_their_own_seed_directory_and_cores(monkeypatch):
    config = config_from_dict({"train": {"seed": 7, "ensemble": 3, "processes": 2}})
    dirs = ensemble.member_run_dirs(Path("/x/runs/en-de"), 3)
    assert dirs == [Path("/x/runs/en-de"), Path("/x/runs/en-de-2"), Path("/x/runs/en-de-3")]
    members = [ensemble.member_config(config, k) for k in (1, 2, 3)]
    assert [m.train.seed for m in members] == [7, 8, 9]
    assert all(m.train.ensemble == 1 and m.train.processes == 2 for m in members)
    assert members[1].model == config.model and members[1].decode == config.decode

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    assert ensemble.core_shares(2) == [{0, 1}, {2, 3}]  # disjoint, equal; the odd core is left over
    assert ensemble.core_shares(6) == [None] * 6  # fewer cores than members: no pinning


def test_ensemble_size_is_checked():
    from mtkit.errors import MtkitError

    with pytest.raises(MtkitError, match="train.ensemble: must be >= 1"):
        config_from_dict({"train": {"ensemble": 0}})


def test_run_trains_the_members_side_by_side_and_decodes_with_their_ensemble(tmp_path):
    from mtkit.checkpoints.io import load_model
    from mtkit.config import DecodeConfig
    from mtkit.engines.torch_engine import TorchEngine

    recipe = tiny_recipe(tmp_path)
    work = tmp_path / "work"
    first = mtkit("run", str(recipe), "-w", str(work))
    assert first.returncode == 0, first.stderr
    assert "train member 1 of 2" in first.stderr and "train member 2 of 2" in first.stderr
    runs = [work / "run", work / "run-2"]
    for run, seed in zip(runs, (5, 6)):
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert records[-1]["event"] == "end" and records[-1]["step"] == 6
        assert yaml.safe_load((run / "config.yaml").read_text())["train"]["seed"] == seed
        assert (run / "checkpoints" / "averaged.pt").is_file()
    assert "trained 6 steps" in (work / "run-2" / "train.log").read_text()  # the second member's own log
    # Different seeds: different initializations and dropout, so different weights.
    a, b = (torch.load(r / "checkpoints" / "averaged.pt", weights_only=True)["model"] for r in runs)
    key = "encoder.layers.0.feed_forward.w_1.weight"
    assert not torch.allclose(a[key], b[key])

    scores = json.loads((work / "scores.json").read_text())
    assert scores["checkpoint"] == [str(r / "checkpoints" / "averaged.pt") for r in runs]
    # The test translations are the ensemble's: the same as decoding with both models here.
    members = [load_model(r / "checkpoints" / "averaged.pt") for r in runs]
    sources = (work / "data" / "test.src.txt").read_text().splitlines()
    expected = [t.best.text for t in translate_lines(TorchEngine(members, DecodeConfig(beam=2)), sources)]
    assert (work / "test.hyp").read_text().splitlines() == expected

    again = mtkit_cli("run", str(recipe), "-w", str(work))  # every stage skipped: no member starts
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("has finished; skipped") == 2 and "train member" not in again.stderr

    # mtkit evaluate takes the same ensemble with -m repeated.
    hyp = tmp_path / "eval.hyp"
    scored = mtkit_cli("evaluate", "-m", str(runs[0] / "checkpoints" / "averaged.pt"), "-m",
                       str(runs[1] / "checkpoints" / "averaged.pt"), "--src", str(work / "data" / "test.src.txt"),
                       "--ref", str(work / "data" / "test.tgt.txt"), "--hyp-out", str(hyp), "--beam", "2", "--json")
    assert scored.returncode == 0, scored.stderr
    assert hyp.read_text().splitlines() == expected


def test_a_failing_member_is_named_with_its_last_words(tmp_path):
    recipe = tiny_recipe(tmp_path)
    prepared = mtkit_cli("prepare", str(recipe), "--out", str(tmp_path / "data"))
    assert prepared.returncode == 0, prepared.stderr
    # Member 2's directory already holds a run, which --no-resume refuses to overwrite.
    single = mtkit_cli("train", str(recipe), "-d", str(tmp_path / "data"), "-r", str(tmp_path / "run-2"),
                       "--set", "train.ensemble=1", "--set", "train.max_steps=2")
    assert single.returncode == 0, single.stderr
    result = mtkit("train", str(recipe), "-d", str(tmp_path / "data"), "-r", str(tmp_path / "run"), "--no-resume")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: training the ensemble failed: member 2") and "already holds a run" in last
    assert "Traceback" not in result.stderr
    assert "member 1" not in last  # the first member trained
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["event"] == "end"

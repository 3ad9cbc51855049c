"""The dual cross-entropy stage (Junczys-Dowmunt 2018) with two trained runs: a forward and a backward model
trained on a corpus with misaligned pairs mixed in score it with ``mtkit score``; ``prepare`` with
``data.clean.filters.dual_xent`` keeps the best share, and what it drops is mostly the misaligned pairs."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest
from conftest import TINY_MODEL, WORDS
from inprocess import run_mtkit

pytestmark = pytest.mark.slow  # two trainings and real processes


def mtkit(*args) -> subprocess.CompletedProcess:
    """The CLI in this process: what the command does is the subject here, not the process."""
    return run_mtkit(*args)


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def train_run(src: Path, tgt: Path, folder: Path) -> Path:
    """A tiny model trained briefly on src -> tgt (what `mtkit score` loads)."""
    from mtkit.commands.prepare import prepare
    from mtkit.config import config_from_dict
    from mtkit.training.trainer import train

    data = {"src_lang": "en", "tgt_lang": "de", "train": {"src": str(src), "tgt": str(tgt)},
            "spm": {"vocab_size": 100}, "workers": 1}
    config = config_from_dict({
        "data": data, "model": TINY_MODEL,
        "train": {"max_tokens": 600, "lr_schedule": "inverse_sqrt", "lr": 3e-3, "warmup": 40, "label_smoothing": 0.0,
                  "log_every": 50, "valid_every": 0, "save_every": 0, "max_steps": 150, "seed": 3},
    })
    prepare(config, folder / "data", progress=False)
    train(config, folder / "data", folder / "run", progress=False)
    return folder / "run"


def test_dual_cross_entropy_drops_the_misaligned_pairs_two_runs_score(tmp_path):
    rng = random.Random(0)
    n = 2000
    src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) for _ in range(n)]
    tgt = [" ".join(reversed(s.split())) for s in src]
    misaligned = set(rng.sample(range(n), n // 10))
    for i in misaligned:  # another pair's target (one as long, so that no length rule can tell)
        tgt[i] = " ".join(reversed(src[rng.choice([j for j in range(n) if len(src[j].split()) ==
                                                     len(src[i].split()) and j != i])].split()))
    fwd_src, fwd_tgt = write(tmp_path / "train.en", src), write(tmp_path / "train.de", tgt)
    forward = train_run(fwd_src, fwd_tgt, tmp_path / "forward")
    backward = train_run(fwd_tgt, fwd_src, tmp_path / "backward")

    scores = {}
    for name, run, s, t in (("fwd", forward, fwd_src, fwd_tgt), ("bwd", backward, fwd_tgt, fwd_src)):
        r = mtkit("score", "-m", run, "--src", s, "--tgt", t)
        assert r.returncode == 0, r.stderr
        scores[name] = write(tmp_path / f"{name}.scores", r.stdout.splitlines())
    out = tmp_path / "filtered"
    r = mtkit("prepare", "--src", fwd_src, "--tgt", fwd_tgt, "-o", out, "--set", "data.spm.vocab_size=100",
              "--set", f"data.clean.filters={{dual_xent: {{forward: {scores['fwd']}, backward: {scores['bwd']}, "
                       "keep: 0.9}}", "--set", "data.clean.examples=1000")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dropped"]["train"]["dual_xent"] == n - round(0.9 * n) == manifest["splits"]["train"]["read"] - \
        manifest["splits"]["train"]["pairs"]
    dropped = {e["pair"] - 1 for e in manifest["examples"]["train"]["dual_xent"]}
    assert len(dropped & misaligned) >= 0.8 * len(misaligned), len(dropped & misaligned)
    assert "dual_xent" in r.stderr  # the printed report

    # the score files must score every pair of data.train
    short = write(tmp_path / "short.scores", scores["fwd"].read_text().splitlines()[:-1])
    r = mtkit("prepare", "--src", fwd_src, "--tgt", fwd_tgt, "-o", tmp_path / "bad", "--set", "data.spm.vocab_size=100",
              "--set", f"data.clean.filters={{dual_xent: {{forward: {short}, backward: {short}}}}}")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert f"data.clean.filters.dual_xent ({short}): scores {n - 1} pairs, but data.train has more" in r.stderr

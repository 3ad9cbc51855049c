"""`mtkit train` when things go wrong: a second training in the run directory, signals, resuming
on other data or another vocabulary, leftovers of a killed save, a torn metrics log, hand-made
checkpoints; and the logs it writes when nobody watches a terminal."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import reverse_data_config, write_reverse_corpus
from test_train import losses, make_config, write_recipe

from mtkit.checkpoints.io import describe, load_checkpoint, load_model, save_checkpoint
from mtkit.errors import MtkitError
from mtkit.training.trainer import train

pytestmark = pytest.mark.slow  # real processes and training: the fast tier is pytest -m 'not slow'

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def mtkit_train(recipe: Path, data_dir: Path, run: Path) -> list[str]:
    return [sys.executable, "-m", "mtkit", "train", str(recipe), "--data", str(data_dir), "--run-dir", str(run)]


def start(cmd: list[str], stderr_path: Path) -> subprocess.Popen:
    """A training in the background. Its stderr goes to a file: a pipe nobody reads would fill up
    and block it. SIGINT is reset to its default, which a background job may have ignored."""
    with open(stderr_path, "wb") as err:
        return subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=err,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_until(condition, proc: subprocess.Popen, stderr_path: Path, patience_s: float = 300) -> None:
    """Poll ``condition`` while ``proc`` runs (a deadline only against a hang, not a speed check)."""
    deadline = time.monotonic() + patience_s
    while not condition():
        assert proc.poll() is None, f"training ended early (exit {proc.returncode}): {stderr_path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"gave up waiting: {stderr_path.read_text()[-3000:]}"
        time.sleep(0.05)


def logged_steps(run: Path) -> int:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return 0
    return sum('"loss"' in line for line in path.read_text().splitlines() if line.endswith("}"))


def assert_one_error_line(stderr: str, expected: str) -> None:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {expected}"], stderr
    assert stderr.strip().splitlines()[-1] == errors[0]


# ---------------------------------------------------------------- ownership


def test_a_second_training_in_the_same_run_directory_is_refused(reverse_data, tmp_path):
    data_dir, data = reverse_data
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "recipe.yaml", make_config(data, max_steps=1_000_000, log_every=1))
    first = start(mtkit_train(recipe, data_dir, run), tmp_path / "first.err")
    try:
        wait_until(lambda: logged_steps(run) > 0, first, tmp_path / "first.err")
        assert (run / ".lock").read_text().strip() == str(first.pid)
        second = subprocess.run(mtkit_train(recipe, data_dir, run), env=ENV, capture_output=True, text=True,
                                timeout=300)
        assert second.returncode == 1
        expected = f"{run}: another mtkit train (pid {first.pid}) is using this run directory"
        assert_one_error_line(second.stderr, expected)
    finally:
        first.kill()
        first.wait()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.endswith("}")]
    assert sum(r.get("event") == "start" for r in records) == 1  # the second one wrote nothing

    # The kernel released the killed process's lock: the directory is free again at once.
    result = train(make_config(data, max_steps=2), data_dir, run, progress=False)
    assert result.step == 2
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [2]  # the killed run's log, never saved, is gone


# ------------------------------------------------------------------ signals


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_the_step_and_resuming_equals_an_uninterrupted_run(reverse_data, tmp_path, signum):
    data_dir, data = reverse_data
    common = dict(log_every=1, save_every=0, dropout=0.1, update_freq=2)
    run, err = tmp_path / "run", tmp_path / "train.err"
    recipe = write_recipe(tmp_path / "recipe.yaml", make_config(data, max_steps=1_000_000, **common))
    proc = start(mtkit_train(recipe, data_dir, run), err)
    try:
        wait_until(lambda: logged_steps(run) >= 3, proc, err)
        proc.send_signal(signum)
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = err.read_text()
    assert code == 128 + signum, stderr[-3000:]
    assert "Traceback" not in stderr
    step = load_checkpoint(run / "checkpoints" / "last.pt")["step"]
    saved = run / "checkpoints" / f"step_{step:07d}.pt"
    assert saved.is_file()
    assert stderr.strip().splitlines()[-1] == (f"error: interrupted by {signal.Signals(signum).name} at step {step}; "
                                               f"saved {saved}; run the same command to resume")
    assert losses(run)[-1][0] == step  # it stopped at the step it had finished, and logged it
    assert not (run / "checkpoints" / "averaged.pt").exists()
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1]).get("event") != "end"

    end = step + 4
    train(make_config(data, max_steps=end, **common), data_dir, run, progress=False)
    train(make_config(data, max_steps=end, **common), data_dir, tmp_path / "straight", progress=False)
    assert losses(run) == losses(tmp_path / "straight")
    a = load_checkpoint(run / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")["model"]
    for key, tensor in a.items():
        assert torch.equal(tensor, b[key]), key


def test_a_signal_to_launched_ranks_saves_their_step_with_one_line(reverse_data, tmp_path):
    """train.processes=2: SIGTERM to `mtkit train` reaches both ranks through torchrun's launcher;
    rank 0 saves the step they finished together and alone says so."""
    data_dir, data = reverse_data
    run, err = tmp_path / "run", tmp_path / "train.err"
    recipe = write_recipe(tmp_path / "recipe.yaml", make_config(data, max_steps=1_000_000, log_every=1, save_every=0,
                                                                processes=2))
    proc = start(mtkit_train(recipe, data_dir, run), err)
    try:
        wait_until(lambda: logged_steps(run) >= 3, proc, err)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = err.read_text()
    assert code == 143, stderr[-3000:]
    step = load_checkpoint(run / "checkpoints" / "last.pt")["step"]
    assert_one_error_line(stderr, f"interrupted by SIGTERM at step {step}; "
                                  f"saved {run / 'checkpoints' / f'step_{step:07d}.pt'}; "
                                  "run the same command to resume")


def test_signal_handlers_are_restored_after_training(reverse_data, tmp_path):
    data_dir, data = reverse_data
    before = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    train(make_config(data, max_steps=1), data_dir, tmp_path / "run", progress=False)
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == before


# ------------------------------------------------------------------- resume


@pytest.fixture(scope="module")
def other_data(reverse_data, tmp_path_factory) -> dict[str, Path]:
    """Prepared data directories that a run of ``reverse_data`` must not resume on."""
    from mtkit.commands.prepare import prepare
    from mtkit.config import config_from_dict

    data_dir, data = reverse_data
    root = tmp_path_factory.mktemp("other")
    files = write_reverse_corpus(root / "text", seed=1)
    upper = root / "upper"
    upper.mkdir()
    for name in os.listdir(root / "text"):  # other characters: other pieces, whatever the seed
        (upper / name).write_text((root / "text" / name).read_text().upper())
    upper_files = {s: (upper / f"{s}.src", upper / f"{s}.tgt") for s in ("train", "valid", "test")}
    same_vocab = reverse_data_config(files)
    same_vocab["spm"] = {"model": str(data_dir / "spm.model")}
    variants = {
        "other_spm_same_size": reverse_data_config(upper_files),
        "other_size": reverse_data_config(files, vocab_size=80),
        "same_vocab_other_data": same_vocab,
    }
    out = {}
    for name, config in variants.items():
        prepare(config_from_dict({"data": config}), root / name, progress=False)
        out[name] = root / name
    assert (out["same_vocab_other_data"] / "spm.model").read_bytes() == (data_dir / "spm.model").read_bytes()
    return out


@pytest.fixture(scope="module")
def tiny_run(reverse_data, tmp_path_factory) -> Path:
    """A run of 2 steps on ``reverse_data`` (copy it before changing it)."""
    data_dir, data = reverse_data
    run = tmp_path_factory.mktemp("tiny") / "run"
    train(make_config(data, max_steps=2), data_dir, run, progress=False)
    return run


@pytest.mark.parametrize("variant, expected", [
    ("other_spm_same_size", r"resuming with a different vocabulary: the run's spm\.model is (\d+) pieces sha256 "
                            r"[0-9a-f]{8}…, \S+'s spm\.model is \1 pieces sha256 [0-9a-f]{8}…; "
                            r"resume with the run's data or start a new run directory"),
    ("other_size", r"resuming with a different vocabulary: the run's spm\.model is 100 pieces sha256 [0-9a-f]{8}…, "
                   r"\S+'s spm\.model is 80 pieces"),
    ("same_vocab_other_data", r"resuming on different data: the run trained on data fingerprint [0-9a-f]{12}…, "
                              r"\S+/manifest\.json has [0-9a-f]{12}…"),
])
def test_resuming_on_other_data_or_another_vocabulary_is_one_error_line(reverse_data, other_data, tiny_run, tmp_path,
                                                                        variant, expected):
    _, data = reverse_data
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    before = (run / "checkpoints" / "last.pt").read_bytes()
    recipe = write_recipe(tmp_path / "recipe.yaml", make_config(data, max_steps=4))
    proc = subprocess.run(mtkit_train(recipe, other_data[variant], run), env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {run}: ") and re.search(expected, last), proc.stderr
    assert (run / "checkpoints" / "last.pt").read_bytes() == before


def test_old_checkpoints_are_checked_by_their_vocabulary_bytes(reverse_data, other_data, tiny_run, tmp_path):
    _, data = reverse_data
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    last = run / "checkpoints" / "last.pt"
    ckpt = load_checkpoint(last)
    del ckpt["vocab_sha256"], ckpt["data_fingerprint"]  # as written before these checks
    save_checkpoint(ckpt, run / "checkpoints" / "step_0000002.pt")
    os.replace(run / "checkpoints" / "step_0000002.pt", last)
    with pytest.raises(MtkitError, match="resuming with a different vocabulary"):
        train(make_config(data, max_steps=4), other_data["other_spm_same_size"], run, progress=False)


def test_leftovers_of_a_killed_save_are_removed_at_the_next_start(reverse_data, tiny_run, tmp_path, capsys, logged):
    data_dir, data = reverse_data
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    leftovers = [run / "checkpoints" / ".step_0000004.pt.k2j4h5g6.tmp", run / "checkpoints" / ".last.pt.abcdefgh.tmp",
                 run / ".config.yaml.x1y2z3w4.tmp"]
    foreign = run / "checkpoints" / ".averaged.pt.q1w2e3r4.tmp"  # `mtkit average` may be writing it right now
    for path in leftovers + [foreign]:
        path.write_bytes(b"partial")
    train(make_config(data, max_steps=3), data_dir, run, progress=False)
    assert not any(p.exists() for p in leftovers)
    assert foreign.exists()
    assert f"removed {len(leftovers)} partial file(s)" in capsys.readouterr().err


def test_a_torn_last_line_of_the_metrics_log_is_dropped_on_resume(reverse_data, tiny_run, tmp_path, capsys, logged):
    data_dir, data = reverse_data
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "loss": 1.2')  # a crash in the middle of an append
    train(make_config(data, max_steps=4, log_every=1), data_dir, run, progress=False)
    assert "metrics.jsonl: line" in capsys.readouterr().err
    assert [s for s, _ in losses(run)][-2:] == [3, 4]

    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "lo\n{"step": 6}\n')  # damage before the last line is not a torn append
    with pytest.raises(MtkitError, match=r"metrics\.jsonl: line \d+: not a JSON object"):
        train(make_config(data, max_steps=8), data_dir, run, progress=False)


# ---------------------------------------------------------------------- logs


def test_without_a_terminal_training_logs_lines_and_says_when_it_resumes(reverse_data, tmp_path, capsys, logged):
    data_dir, data = reverse_data
    run = tmp_path / "run"
    train(make_config(data, max_steps=4, log_every=2, valid_every=4), data_dir, run, progress=False)
    err = capsys.readouterr().err.splitlines()
    pattern = r"step 2/4 \| loss [\d.]+ \| lr [\d.e+-]+ \| \d+ tok/s \| elapsed \d+:\d\d:\d\d \| ETA \d+:\d\d:\d\d"
    assert len([line for line in err if re.fullmatch(pattern, line)]) == 1, err
    assert any(line.startswith("step 4: valid_loss ") for line in err)

    train(make_config(data, max_steps=6, log_every=2), data_dir, run, progress=False)
    err = capsys.readouterr().err
    assert f"resuming {run} from step 4 (checkpoint {run / 'checkpoints' / 'step_0000004.pt'})" in err
    assert "step 6/6 | loss " in err


# ------------------------------------------------------------- checkpoints


def test_a_loaded_model_knows_its_step_and_describes_itself(tiny_run):
    loaded = load_model(tiny_run)
    assert loaded.step == 2
    assert describe(loaded) == f"{tiny_run / 'checkpoints' / 'last.pt'} (step 2)"


def test_weights_that_do_not_fit_their_config_are_one_error_line(tiny_run, tmp_path):
    ckpt = load_checkpoint(tiny_run / "checkpoints" / "last.pt")
    ckpt["config"]["model"]["d_ff"] = 256
    path = save_checkpoint(ckpt, tmp_path / "edited.pt")
    with pytest.raises(MtkitError, match=r"edited\.pt: its config's model\.d_ff is 256 but its weights have "
                                         r"[\w.]+ of 128 × 64$"):  # checked before the model is built
        load_model(path)


def test_a_recipe_without_a_model_section_gets_a_notice(reverse_data):
    from mtkit.commands.train import default_model_note
    from mtkit.config import config_from_dict

    data_dir, data = reverse_data
    note = default_model_note(config_from_dict({"data": data}), data_dir)
    assert note is not None and note.startswith("note: no model section in the recipe; training the paper's "
                                                 "transformer-base (") and note.endswith("M parameters)")
    assert default_model_note(make_config(data), data_dir) is None

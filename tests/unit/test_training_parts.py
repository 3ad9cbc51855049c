"""Batching, loss, schedule, averaging and atomic checkpoints."""

import errno
import math
import os
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import ListStore

from mtkit.checkpoints.io import load_checkpoint, resolve_checkpoint, save_checkpoint
from mtkit.config import TrainConfig, config_from_dict
from mtkit.errors import MtkitError
from mtkit.kernels.loss import label_smoothed_loss
from mtkit.training.average import average_checkpoints, average_run
from mtkit.training.batching import TokenBatchSampler, collate, make_batches
from mtkit.training.optim import learning_rate
from mtkit.training.run_dir import link_atomically


def random_lengths(n=500, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(1, 40, n), rng.integers(1, 40, n)


def test_batches_respect_the_token_budget_and_cover_every_example_once():
    src, tgt = random_lengths()
    batches = make_batches(src, tgt, max_tokens=200, seed=3)
    seen = np.concatenate(batches)
    assert sorted(seen.tolist()) == list(range(len(src)))
    for b in batches:
        width = np.maximum(src[b], tgt[b]).max() + 1
        assert width * len(b) <= 200


def test_bucketing_keeps_padding_low():
    src, tgt = random_lengths(2000)
    store = ListStore([(np.full(s, 5), np.full(t, 6)) for s, t in zip(src, tgt)])
    batches = make_batches(src, tgt, max_tokens=400, seed=1)
    padding = np.mean([collate(store, b).padding_fraction for b in batches])
    shuffled = np.random.default_rng(0).permutation(len(src))
    naive = [shuffled[i : i + 10] for i in range(0, len(src), 10)]
    naive_padding = np.mean([collate(store, b).padding_fraction for b in naive])
    assert padding < 0.25 < naive_padding


def test_too_long_examples_are_left_out():
    batches = make_batches(np.array([3, 500, 4]), np.array([3, 2, 4]), max_tokens=100, seed=0)
    assert sorted(np.concatenate(batches).tolist()) == [0, 2]


def test_epochs_are_shuffled_from_the_seed():
    src, tgt = random_lengths()
    a = TokenBatchSampler(src, tgt, 200, seed=1)
    b = TokenBatchSampler(src, tgt, 200, seed=1)
    assert all(np.array_equal(x, y) for x, y in zip(a.epoch_batches(1), b.epoch_batches(1)))
    assert not all(np.array_equal(x, y) for x, y in zip(a.epoch_batches(1), a.epoch_batches(2)))


def test_ranks_read_distinct_batches_and_the_same_count():
    src, tgt = random_lengths()
    shards = [TokenBatchSampler(src, tgt, 200, seed=1, rank=r, world_size=2).epoch_batches(1) for r in range(2)]
    assert len(shards[0]) == len(shards[1])
    ids = [set(np.concatenate(s).tolist()) for s in shards]
    assert not ids[0] & ids[1]
    # Rank r's k-th batch is batch k*W + r of the single-process order (same global batches).
    single = TokenBatchSampler(src, tgt, 200, seed=1).epoch_batches(1)
    assert np.array_equal(shards[1][3], single[7])


def test_sampler_resumes_from_its_state():
    src, tgt = random_lengths(100)
    sampler = TokenBatchSampler(src, tgt, 100, seed=4)
    it = iter(sampler)
    first = [next(it) for _ in range(30)]  # crosses an epoch boundary
    state = sampler.state
    rest = [next(it) for _ in range(10)]
    resumed = TokenBatchSampler(src, tgt, 100, seed=4)
    resumed.state = state
    again = [next(iter(resumed)) for _ in range(1)]
    it2 = iter(resumed)
    assert again[0][0] == rest[0][0] and np.array_equal(again[0][1], rest[0][1])
    assert all(np.array_equal(x[1], y[1]) for x, y in zip([next(it2) for _ in range(9)], rest[1:]))
    assert first[-1][0] >= 1


def test_collate_adds_eos_and_bos_and_pads():
    store = ListStore([([5, 6, 7], [8, 9]), ([10], [11, 12, 13])])
    batch = collate(store, [0, 1])
    assert batch.src.tolist() == [[5, 6, 7, 3], [10, 3, 0, 0]]
    assert batch.tgt_in.tolist() == [[2, 8, 9, 0], [2, 11, 12, 13]]
    assert batch.tgt_out.tolist() == [[8, 9, 3, 0], [11, 12, 13, 3]]
    assert batch.n_tgt_tokens == 7


def test_label_smoothed_loss_matches_torch_and_ignores_padding():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    target = torch.randint(1, 11, (2, 5))
    target[1, 3:] = 0
    loss, nll, n = label_smoothed_loss(logits, target, 0.1, pad_id=0)
    expected = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), ignore_index=0, label_smoothing=0.1,
                               reduction="sum")
    expected_nll = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), ignore_index=0, reduction="sum")
    assert n == 8
    assert torch.allclose(loss, expected, atol=1e-5)
    assert torch.allclose(nll, expected_nll, atol=1e-5)
    # Padding positions' logits do not matter.
    logits2 = logits.clone()
    logits2[1, 3:] = 100.0
    assert torch.allclose(label_smoothed_loss(logits2, target, 0.1, 0)[0], loss)


def test_paper_schedule_matches_equation_3():
    cfg = TrainConfig(lr_schedule="noam", warmup=4000)
    for step in (1, 100, 4000, 10000, 100000):
        expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert learning_rate(step, cfg, 512) == pytest.approx(expected)
    peak = learning_rate(4000, cfg, 512)
    assert learning_rate(3999, cfg, 512) < peak and learning_rate(4001, cfg, 512) < peak


def test_inverse_sqrt_schedule():
    cfg = TrainConfig(lr_schedule="inverse_sqrt", warmup=100, lr=1e-3)
    assert learning_rate(50, cfg, 512) == pytest.approx(5e-4)
    assert learning_rate(100, cfg, 512) == pytest.approx(1e-3)
    assert learning_rate(400, cfg, 512) == pytest.approx(1e-3 * math.sqrt(100 / 400))


def test_linear_schedule_warms_up_then_decays_to_zero_at_max_steps():
    cfg = TrainConfig(lr_schedule="linear", warmup=100, lr=1e-3, max_steps=1100)
    assert learning_rate(50, cfg, 512) == pytest.approx(5e-4)
    assert learning_rate(100, cfg, 512) == pytest.approx(1e-3)
    assert learning_rate(600, cfg, 512) == pytest.approx(5e-4)
    assert learning_rate(1100, cfg, 512) == 0.0 and learning_rate(2000, cfg, 512) == 0.0
    with pytest.raises(MtkitError, match="max_steps"):
        config_from_dict({"train": {"lr_schedule": "linear", "warmup": 100, "max_steps": 100}})


def _payload(seed):
    torch.manual_seed(seed)
    return {
        "format_version": 1, "mtkit_version": "x", "config": {}, "vocab": {"src": b"spm", "tgt": None},
        "src_vocab_size": 4, "tgt_vocab_size": 4, "step": seed,
        "model": {"w": torch.randn(3, 4), "b": torch.randn(4), "count": torch.tensor([seed])},
    }


def test_average_equals_the_mean_of_tensors(tmp_path):
    paths = [save_checkpoint(_payload(s), tmp_path / f"step_{s}.pt") for s in (1, 2, 3)]
    out = average_checkpoints(paths, tmp_path / "avg.pt")
    avg = load_checkpoint(out)["model"]
    states = [load_checkpoint(p)["model"] for p in paths]
    for key in ("w", "b"):
        assert torch.allclose(avg[key], torch.stack([s[key] for s in states]).mean(0), atol=1e-7)
    assert avg["count"].tolist() == [1]  # integer buffers are not averaged


def test_failed_save_leaves_previous_checkpoint_and_last_intact(tmp_path, monkeypatch):
    good = save_checkpoint(_payload(1), tmp_path / "step_1.pt")
    link_atomically(good, tmp_path / "last.pt")

    real_save = torch.save

    def crash_midway(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        f.truncate(100)  # half the bytes are on disk...
        raise OSError("disk full")  # ...when the write fails

    monkeypatch.setattr(torch, "save", crash_midway)
    with pytest.raises(OSError):
        save_checkpoint(_payload(2), tmp_path / "step_2.pt")
    monkeypatch.undo()
    assert not (tmp_path / "step_2.pt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["step_1.pt", "last.pt"] or sorted(
        p.name for p in tmp_path.iterdir()) == ["last.pt", "step_1.pt"]
    assert load_checkpoint(tmp_path / "last.pt")["step"] == 1
    assert torch.equal(load_checkpoint(tmp_path / "last.pt")["model"]["w"], _payload(1)["model"]["w"])


def test_checkpoints_load_without_executing_code(tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        pickle.dump({"format_version": 1, "x": Evil()}, f)
    with pytest.raises(MtkitError, match="not a readable mtkit checkpoint"):
        load_checkpoint(path)


@pytest.mark.parametrize("failure, message", [
    (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "no space left on device while saving the checkpoint"),
    (OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)), "disk quota exceeded while saving the checkpoint"),
    # what torch.save raises when it writes to a path on a full disk
    (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"),
     r"writing the checkpoint failed \(is the disk full\?\)"),
], ids=["ENOSPC", "EDQUOT", "torch"])
def test_a_full_disk_is_one_line_and_leaves_the_previous_checkpoint(tmp_path, monkeypatch, failure, message):
    link_atomically(save_checkpoint(_payload(1), tmp_path / "step_1.pt"), tmp_path / "last.pt")

    def full_disk(obj, f, *args, **kwargs):
        f.write(b"\0" * 100)
        raise failure

    monkeypatch.setattr(torch, "save", full_disk)
    expected = f"^{re.escape(str(tmp_path / 'step_2.pt'))}: {message}; the previous checkpoints are intact$"
    with pytest.raises(MtkitError, match=expected):
        save_checkpoint(_payload(2), tmp_path / "step_2.pt")
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step_1.pt"]  # no temporary file left
    assert load_checkpoint(tmp_path / "last.pt")["step"] == 1


def test_other_save_failures_are_not_disguised(tmp_path, monkeypatch):
    def broken(obj, f, *args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        save_checkpoint(_payload(2), tmp_path / "step_2.pt")


@pytest.mark.parametrize("missing", ["config", "model", "vocab", "src_vocab_size"])
def test_a_hand_made_checkpoint_without_a_key_is_one_error_line(tmp_path, missing):
    payload = _payload(1)
    del payload[missing]
    path = save_checkpoint(payload, tmp_path / "hand.pt")
    with pytest.raises(MtkitError, match=rf"^{re.escape(str(path))}: not a complete mtkit checkpoint \(no '{missing}'"):
        load_checkpoint(path)


def test_warmup_0_starts_at_the_peak_and_divides_by_nothing():
    for schedule in ("noam", "inverse_sqrt", "linear"):
        cfg = TrainConfig(lr_schedule=schedule, warmup=0, lr=1e-3, max_steps=100)
        rates = [learning_rate(step, cfg, 512) for step in range(1, 100)]
        assert all(math.isfinite(r) and r > 0 for r in rates), schedule
        assert rates == sorted(rates, reverse=True), schedule  # no warm-up: it only decays
    assert learning_rate(9, TrainConfig(lr_schedule="inverse_sqrt", warmup=0, lr=1e-3), 512) == pytest.approx(1e-3 / 3)
    assert learning_rate(9, TrainConfig(lr_schedule="noam", warmup=0), 512) == pytest.approx(512**-0.5 / 3)


@pytest.mark.parametrize("last", [0, -1])
def test_average_refuses_fewer_than_one_checkpoint(tmp_path, last):
    for s in (1, 2, 3):
        save_checkpoint(_payload(s), tmp_path / "checkpoints" / f"step_{s:07d}.pt")
    with pytest.raises(MtkitError, match=f"^--last must be at least 1, got {last}$"):
        average_run(tmp_path, last)


def test_a_run_directory_passes_over_an_averaged_checkpoint_older_than_its_newest(tmp_path, capsys, logged):
    ckpt_dir = tmp_path / "checkpoints"
    paths = [save_checkpoint(_payload(s), ckpt_dir / f"step_{s:07d}.pt") for s in (2, 4, 6)]
    link_atomically(paths[1], ckpt_dir / "best.pt")
    link_atomically(paths[2], ckpt_dir / "last.pt")
    average_run(tmp_path, 2, output=None)  # steps 4 and 6
    assert resolve_checkpoint(tmp_path) == ckpt_dir / "averaged.pt"
    assert capsys.readouterr().err == ""

    paths.append(save_checkpoint(_payload(8), ckpt_dir / "step_0000008.pt"))  # training went on
    assert resolve_checkpoint(tmp_path) == ckpt_dir / "best.pt"
    assert capsys.readouterr().err == (f"note: {ckpt_dir / 'averaged.pt'} averages up to step 6, older than step 8; "
                                       "using best.pt (run mtkit average to refresh)\n")

    old = load_checkpoint(ckpt_dir / "averaged.pt")  # written before averages recorded their step
    del old["step"]
    save_checkpoint(old, ckpt_dir / "averaged.pt")
    assert resolve_checkpoint(tmp_path) == ckpt_dir / "best.pt"
    average_run(tmp_path, 2)
    assert resolve_checkpoint(tmp_path) == ckpt_dir / "averaged.pt"


def test_a_run_directory_takes_its_moving_average_after_its_averaged_checkpoint(tmp_path, capsys, logged):
    ckpt_dir = tmp_path / "checkpoints"
    paths = [save_checkpoint(_payload(s), ckpt_dir / f"step_{s:07d}.pt") for s in (2, 4)]
    link_atomically(paths[1], ckpt_dir / "last.pt")
    save_checkpoint(_payload(4), ckpt_dir / "ema.pt")  # a run with train.ema_decay and no averaging
    assert resolve_checkpoint(tmp_path) == ckpt_dir / "ema.pt"
    average_run(tmp_path, 2)  # averaging, when the run has it, comes first
    assert resolve_checkpoint(tmp_path) == ckpt_dir / "averaged.pt"
    assert capsys.readouterr().err == ""

    save_checkpoint(_payload(6), ckpt_dir / "step_0000006.pt")  # training went on: both are older
    link_atomically(ckpt_dir / "step_0000006.pt", ckpt_dir / "last.pt")
    assert resolve_checkpoint(tmp_path) == ckpt_dir / "last.pt"
    assert capsys.readouterr().err.splitlines() == [
        f"note: {ckpt_dir / 'averaged.pt'} averages up to step 4, older than step 6; using last.pt "
        "(run mtkit average to refresh)",
        f"note: {ckpt_dir / 'ema.pt'} is the moving average at step 4, older than step 6; using last.pt "
        "(training writes it at its end)"]
    save_checkpoint(_payload(6), ckpt_dir / "ema.pt")  # written at the end of the training that went on
    assert resolve_checkpoint(tmp_path) == ckpt_dir / "ema.pt"
    assert capsys.readouterr().err == (f"note: {ckpt_dir / 'averaged.pt'} averages up to step 4, older than step 6; "
                                       "using ema.pt (run mtkit average to refresh)\n")


def test_the_metrics_log_survives_a_torn_last_line(tmp_path, capsys, logged):
    from mtkit.training.curves import read_metrics
    from mtkit.training.trainer import MetricsLog

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    assert capsys.readouterr().err == f"warning: {path}: line 3 is cut short (a crash while writing it?); ignored\n"
    MetricsLog(path, enabled=True).truncate_after(5)
    assert path.read_text() == '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n'

    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo\n{"step": 3, "loss": 1.0}\n')
    with pytest.raises(MtkitError, match=rf"^{re.escape(str(path))}: line 2: not a JSON object$"):
        MetricsLog(path, enabled=True).truncate_after(5)
    with pytest.raises(MtkitError, match=rf"^{re.escape(str(path))}: line 2: not a JSON object$"):
        read_metrics(path)


def test_metrics_lines_whose_values_are_not_numbers_are_skipped_with_one_warning(tmp_path, capsys, logged):
    """`mtkit curves` once drew strings as a categorical axis (a garbled plot) and exited 0 silently."""
    from mtkit.training.curves import draw_curves, read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": "1.5"}\n{"step": "3", "loss": 1.0}\n'
                    '{"step": 4, "valid_loss": 1.2, "valid_bleu": "high"}\n{"step": 5, "loss": true}\n'
                    '{"step": 6, "loss": 0.5, "event": "end"}\n')
    assert [r["step"] for r in read_metrics(path)] == [1, 6]
    assert capsys.readouterr().err == (f"warning: {path}: 4 line(s) (2, 3, 4, 5) hold a step or metric that is not "
                                       "a number; ignored\n")
    draw_curves(path, tmp_path / "curves.png")
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "not a number" in err
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_atomic_writes_name_the_users_path_never_the_temporary(tmp_path):
    """A full disk (ENOSPC, raised by a write, which names no file) and a folder that cannot hold the
    temporary once named `.x.txt.liokb_dj.tmp` or nothing at all; the temporary is gone."""
    from mtkit.io import atomic_path

    target = tmp_path / "x.txt"
    with pytest.raises(OSError) as caught, atomic_path(target) as tmp, open(tmp, "wb") as f:
        f.write(b"some")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(target)
    assert list(tmp_path.iterdir()) == []
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError) as caught, atomic_path(blocker / "y.txt"):  # its parent is a file: no temporary
        pass
    assert caught.value.filename == str(blocker / "y.txt")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep").write_text("")
    with pytest.raises(OSError) as caught, atomic_path(tmp_path / "d") as tmp:  # the rename onto a directory fails
        tmp.write_text("x")
    assert caught.value.filename == str(tmp_path / "d") and ".tmp" not in str(caught.value)
    with pytest.raises(BrokenPipeError), atomic_path(target):  # errors of other files pass through as they were
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "file"]


def test_dead_processes_temporaries_are_removed_and_no_others(tmp_path, capsys, logged):
    import subprocess
    import sys

    from mtkit.io import atomic_path, owner, remove_dead_temporaries

    target = tmp_path / "out.txt"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    pid = int(dead.stdout)  # a process that has exited (its PID reused at once is all but impossible)
    host = owner().partition("@")[2]
    ours_dead = tmp_path / f".out.txt.{pid}@{host}.abc123_x.tmp"
    other_host = tmp_path / f".out.txt.{pid}@elsewhere-{host}.abc123_x.tmp"
    unowned = tmp_path / ".out.txt.abc123_x.tmp"  # `atomic_path` without owner: maybe a live process's
    other_file = tmp_path / f".other.txt.{pid}@{host}.abc123_x.tmp"
    for p in (ours_dead, other_host, unowned, other_file):
        p.write_text("partial")
    with atomic_path(target, owned=True) as live:  # this process's own, in use
        assert live.name.startswith(f".out.txt.{owner()}.") and live.name.endswith(".tmp")
        assert remove_dead_temporaries(target) == [ours_dead]
        assert live.exists()
    assert not ours_dead.exists() and other_host.exists() and unowned.exists() and other_file.exists()
    assert f"{ours_dead}: removed; left behind by process {pid}" in capsys.readouterr().err


def test_the_moving_average_follows_its_formula_every_n_updates():
    from mtkit.training.ema import ExponentialMovingAverage

    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema = ExponentialMovingAverage(model, decay=0.75, every=2)
    with torch.no_grad():
        model.weight.fill_(3.0)
    ema.update(model, step=1)  # not a multiple of 2: unchanged
    assert torch.equal(ema.shadow["weight"], torch.ones(2, 3))
    ema.update(model, step=2)
    assert torch.allclose(ema.shadow["weight"], torch.full((2, 3), 0.75 * 1.0 + 0.25 * 3.0))
    weights = ema.weights(model.to(torch.bfloat16))
    assert weights["weight"].dtype == torch.bfloat16 and ema.shadow["weight"].dtype == torch.float32
    with pytest.raises(MtkitError, match="does not fit this model"):
        ema.load_state_dict({"weight": torch.zeros(2, 3)})  # no bias
    for value, message in ((1.0, "train.ema_decay: must be in [0, 1)"), (-0.1, "train.ema_decay: must be in [0, 1)")):
        with pytest.raises(MtkitError, match=re.escape(message)):
            config_from_dict({"train": {"ema_decay": value}})
    with pytest.raises(MtkitError, match="train.ema_every: must be between 1 and"):
        config_from_dict({"train": {"ema_every": 0}})

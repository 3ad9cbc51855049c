"""Batching, loss, schedule, averaging and atomic checkpoints."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import ListStore
from mtkit.config import TrainConfig, config_from_dict
from mtkit.errors import MtkitError
from mtkit.training.average import average_checkpoints
from mtkit.training.batching import TokenBatchSampler, collate, make_batches
from mtkit.training.checkpoint import link_atomically, load_checkpoint, save_checkpoint
from mtkit.training.loss import label_smoothed_loss
from mtkit.training.optim import learning_rate


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
    expected = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), ignore_index=0, label_smoothing=0.1, reduction="sum")
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

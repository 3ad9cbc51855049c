"""Fine-tuning (``train.init_from`` / ``--init-from``, ``prepare --vocab-from``): a new run starts from a
parent's weights and vocabulary with a fresh optimizer, schedule and step counter, learns the new task,
records its parent, resumes exactly as itself, and refuses a parent that does not fit in one line."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TINY_MODEL, WORDS, reverse_data_config
from inprocess import run_mtkit
from test_train import losses, make_config

from mtkit.checkpoints.io import load_checkpoint, load_model
from mtkit.config import PAD_ID, config_from_dict, load_config
from mtkit.errors import MtkitError
from mtkit.training.optim import learning_rate
from mtkit.training.trainer import train

pytestmark = pytest.mark.slow  # real training and processes: the fast tier is pytest -m 'not slow'


def write_copy_corpus(folder: Path, n_train: int = 3000, n_valid: int = 60, seed: int = 7) -> dict:
    """The parent's words, copied in order: a new task for a model that learnt to reverse them."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_valid)):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7))) for _ in range(n)]
        for side in ("src", "tgt"):
            (folder / f"{split}.{side}").write_text("\n".join(lines) + "\n")
        files[split] = (folder / f"{split}.src", folder / f"{split}.tgt")
    return files


@pytest.fixture(scope="module")
def parent(reverse_data, tmp_path_factory) -> Path:
    """A run of the tiny model on the reverse task (the parent of every run here)."""
    data_dir, data = reverse_data
    run = tmp_path_factory.mktemp("parent") / "run"
    train(make_config(data, max_steps=200, log_every=50), data_dir, run, progress=False)
    return run


@pytest.fixture(scope="module")
def copy_data(parent, tmp_path_factory) -> tuple[Path, dict, Path]:
    """The copy task prepared with the parent's vocabulary (``data.spm.vocab_from``), its data config,
    and the same text prepared with a SentencePiece model of its own."""
    from mtkit.commands.prepare import prepare

    root = tmp_path_factory.mktemp("copy")
    data = reverse_data_config(write_copy_corpus(root / "text"))
    data["spm"] = {"vocab_from": str(parent)}
    prepare(config_from_dict({"data": data}), root / "prepared", progress=False)
    own = {**data, "spm": {"vocab_size": 80}}
    prepare(config_from_dict({"data": own}), root / "own-vocab", progress=False)
    return root / "prepared", data, root / "own-vocab"


def parent_checkpoint(parent: Path) -> Path:
    return (parent / "checkpoints" / "last.pt").resolve()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@torch.no_grad()
def valid_nll(checkpoint: Path, data_dir: Path) -> float:
    """The model's NLL per target token on ``data_dir``'s validation split (no label smoothing)."""
    from mtkit.data.store import ParallelStore
    from mtkit.training.batching import collate, make_batches
    from mtkit.training.loss import TranslationLoss

    model = load_model(checkpoint).model
    criterion = TranslationLoss(model, 0.0, PAD_ID)
    store = ParallelStore.open(data_dir, "valid")
    nll_sum, n = 0.0, 0
    for indices in make_batches(store.src_lengths, store.tgt_lengths, 600, 0):
        batch = collate(store, indices)
        _, nll, count = criterion(batch.src, batch.tgt_in, batch.tgt_out)
        nll_sum, n = nll_sum + float(nll), n + count
    return nll_sum / n


def mtkit(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The CLI in this process: what the command does is the subject here, not the process."""
    return run_mtkit(*argv, cwd=cwd)


# ---------------------------------------------------------------- fine-tuning


def test_a_fine_tuned_run_starts_fresh_from_the_parent_and_learns_the_new_task(parent, copy_data, tmp_path):
    data_dir, data, _ = copy_data
    ckpt_path = parent_checkpoint(parent)
    run = tmp_path / "ft"
    config = make_config(data, max_steps=100, log_every=1, init_from=str(parent))
    result = train(config, data_dir, run, progress=False)

    # Its own step counter, schedule and log: step 1 is the first of a warm-up, not the parent's step 201.
    assert result.step == 100
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["event"] == "start" and records[0]["step"] == 0
    assert records[0]["init_from"] == str(ckpt_path) and records[0]["init_step"] == 200
    first = next(r for r in records if "loss" in r)
    assert first["step"] == 1
    assert first["lr"] == pytest.approx(learning_rate(1, config.train, 64)) == pytest.approx(3e-3 / 40)
    parent_log = (parent / "metrics.jsonl").read_text().splitlines()
    parent_last = [json.loads(line) for line in parent_log if '"lr"' in line][-1]
    assert parent_last["step"] == 200 and parent_last["lr"] != pytest.approx(first["lr"])

    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    parent_ckpt = load_checkpoint(ckpt_path)
    assert ckpt["step"] == 100 and ckpt["scheduler"]["step"] == 100
    # The parent's vocabulary, and its record in the saved config and every checkpoint.
    assert ckpt["vocab_sha256"] == parent_ckpt["vocab_sha256"]
    assert (run / "spm.model").read_bytes() == (parent / "spm.model").read_bytes()
    assert json.loads((data_dir / "manifest.json").read_text())["vocab"]["reused"] == [str(parent)]
    assert ckpt["config"]["train"]["init_from"] == str(ckpt_path)
    assert ckpt["config"]["train"]["init_sha256"] == sha256(ckpt_path)
    saved = load_config(run / "config.yaml")
    assert (saved.train.init_from, saved.train.init_sha256) == (str(ckpt_path), sha256(ckpt_path))

    # It learnt the new task: better at it than the parent it started from.
    assert valid_nll(run / "checkpoints" / "last.pt", data_dir) < valid_nll(ckpt_path, data_dir)


def test_a_new_run_starts_with_the_parents_weights_and_a_fresh_optimizer(parent, copy_data, tmp_path):
    from mtkit.training.finetune import resolve_init
    from mtkit.training.trainer import Trainer

    data_dir, data, _ = copy_data
    parent_ckpt = load_checkpoint(parent_checkpoint(parent))
    run = tmp_path / "run"
    for keep in (False, True):
        config = make_config(data, init_from=str(parent / "checkpoints" / "last.pt"), init_keep_optimizer=keep,
                             betas=[0.8, 0.9], dropout=0.2)
        resolved, init = resolve_init(config, run)
        assert resolved.model.dropout == 0.2  # regularization is the recipe's
        trainer = Trainer(resolved, data_dir, run, progress=False, init=init)
        state = trainer.model.state_dict()
        assert state.keys() == parent_ckpt["model"].keys()
        for key, tensor in parent_ckpt["model"].items():
            assert torch.equal(state[key], tensor), key
        assert trainer.step == 0
        assert trainer.optimizer.param_groups[0]["betas"] == (0.8, 0.9)  # the recipe's, in either case
        moments = trainer.optimizer.state_dict()["state"]
        if keep:
            ids = sorted(parent_ckpt["optimizer"]["state"])
            assert sorted(moments) == ids
            for i in ids:
                assert torch.equal(moments[i]["exp_avg"], parent_ckpt["optimizer"]["state"][i]["exp_avg"])
        else:
            assert moments == {}
    assert not run.exists()  # checking and loading the parent writes nothing


def test_resuming_a_fine_tuned_run_continues_it_exactly_without_its_parent(parent, copy_data, tmp_path, capsys, logged):
    data_dir, data, _ = copy_data
    copy = tmp_path / "parent.pt"
    shutil.copyfile(parent / "checkpoints" / "last.pt", copy)
    common = dict(max_steps=12, save_every=6, log_every=1, dropout=0.1, update_freq=2, init_from=str(copy))
    train(make_config(data, **common), data_dir, tmp_path / "straight", progress=False)
    train(make_config(data, **{**common, "max_steps": 6}), data_dir, tmp_path / "split", progress=False)
    copy.unlink()  # resuming needs the run alone
    capsys.readouterr()
    train(make_config(data, **common), data_dir, tmp_path / "split", progress=False)
    assert f"resuming {tmp_path / 'split'} from step 6" in capsys.readouterr().err

    assert losses(tmp_path / "straight") == losses(tmp_path / "split")
    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "split" / "checkpoints" / "last.pt")
    assert a["step"] == b["step"] == 12
    for key, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][key]), key
    assert b["config"]["train"]["init_from"] == str(copy) and b["config"]["train"]["init_sha256"] is not None


def test_a_recipe_without_a_model_section_trains_the_parents_and_resumes_it(parent, copy_data, tmp_path, capsys,
                                                                            logged):
    data_dir, data, _ = copy_data
    train_cfg = {"max_tokens": 600, "max_steps": 2, "warmup": 10, "log_every": 1, "valid_every": 0, "save_every": 0}
    run = tmp_path / "run"
    train(config_from_dict({"data": data, "train": {**train_cfg, "init_from": str(parent)}}), data_dir, run,
          progress=False)
    note = f"note: no model section in the recipe; training {parent_checkpoint(parent)}'s model"
    assert note in capsys.readouterr().err
    parent_model = load_checkpoint(parent_checkpoint(parent))["config"]["model"]
    assert load_checkpoint(run / "checkpoints" / "last.pt")["config"]["model"] == parent_model
    # Resumed by a recipe that names no parent, it is still the same run, with the same record.
    train(config_from_dict({"data": data, "train": {**train_cfg, "max_steps": 4}}), data_dir, run, progress=False)
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert ckpt["step"] == 4 and ckpt["config"]["model"] == parent_model
    assert ckpt["config"]["train"]["init_from"] == str(parent_checkpoint(parent))


def test_the_parents_optimizer_trains_on_and_an_averaged_checkpoint_has_none(parent, copy_data, tmp_path):
    from mtkit.training.average import average_checkpoints

    data_dir, data, _ = copy_data
    kept = make_config(data, max_steps=2, init_from=str(parent / "checkpoints" / "last.pt"), init_keep_optimizer=True)
    assert train(kept, data_dir, tmp_path / "kept", progress=False).step == 2
    averaged = average_checkpoints([parent / "checkpoints" / "last.pt"], tmp_path / "averaged.pt")
    config = make_config(data, init_from=str(averaged), init_keep_optimizer=True)
    with pytest.raises(MtkitError, match=r"^train\.init_keep_optimizer: \S+averaged\.pt holds no optimizer state"):
        train(config, data_dir, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------- CLI


def test_the_cli_prepares_with_vocab_from_and_refuses_what_does_not_fit(parent, copy_data, reverse_data, tmp_path):
    data_dir, data, own_vocab = copy_data
    text = Path(data["train"]["src"]).parent
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"model": TINY_MODEL, "train": {"max_steps": 2, "max_tokens": 300}}))
    other_shape = tmp_path / "other-shape.yaml"
    other_shape.write_text(yaml.safe_dump({"model": {**TINY_MODEL, "d_model": 32, "h": 2},
                                           "train": {"max_steps": 2, "max_tokens": 300}}))
    not_a_checkpoint = tmp_path / "notes.txt"
    not_a_checkpoint.write_text("not a checkpoint\n")
    ckpt = parent_checkpoint(parent)
    runs = {name: tmp_path / name for name in ("vocab", "shape", "missing", "text")}
    cases = {
        "prepare": ["prepare", "--src", str(text / "train.src"), "--tgt", str(text / "train.tgt"),
                    "--vocab-from", str(parent), "-o", str(tmp_path / "prepared"), "--set", "data.workers=1"],
        "vocab": ["train", str(recipe), "-d", str(own_vocab), "-r", str(runs["vocab"]), "--init-from", str(parent)],
        "shape": ["train", str(other_shape), "-d", str(data_dir), "-r", str(runs["shape"]), "--init-from", str(parent)],
        "missing": ["train", str(recipe), "-d", str(data_dir), "-r", str(runs["missing"]),
                    "--init-from", str(tmp_path / "nowhere")],
        "text": ["train", str(recipe), "-d", str(data_dir), "-r", str(runs["text"]),
                 "--init-from", str(not_a_checkpoint)],
    }
    done = {name: mtkit(*argv, cwd=tmp_path) for name, argv in cases.items()}

    assert done["prepare"].returncode == 0, done["prepare"].stderr
    assert (tmp_path / "prepared" / "spm.model").read_bytes() == (parent / "spm.model").read_bytes()

    own = json.loads((own_vocab / "manifest.json").read_text())["vocab"]
    src_sha = hashlib.sha256((own_vocab / "spm.model").read_bytes()).hexdigest()
    expected = {
        "vocab": (f"train.init_from: {own_vocab} has another vocabulary than {ckpt}: its spm.model is "
                  f"{own['src_size']} pieces sha256 {src_sha[:8]}…, the checkpoint's spm.model is 100 pieces sha256 "
                  f"{load_checkpoint(ckpt)['vocab_sha256']['src'][:8]}…; "
                  f"prepare the data with mtkit prepare --vocab-from {ckpt}"),
        "shape": (f"train.init_from: the recipe's model differs from {ckpt}'s: d_model 32 vs 64, h 2 vs 4 "
                  "(leave out the model section, or its architecture keys, to take the checkpoint's)"),
        "missing": f"train.init_from: {tmp_path / 'nowhere'}: no such checkpoint or run directory",
        "text": f"train.init_from: {not_a_checkpoint}: not a readable mtkit checkpoint",
    }
    for name, message in expected.items():
        result = done[name]
        assert result.returncode == 1, (name, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and errors[0].startswith(f"error: {message}"), (name, result.stderr)
        assert result.stderr.strip().splitlines()[-1] == errors[0]
        assert not runs[name].exists(), name  # refused before anything was written


def test_an_init_record_that_does_not_match_the_file_is_refused(parent, copy_data, tmp_path):
    data_dir, data, _ = copy_data
    config = make_config(data, init_from=str(parent), init_sha256="0" * 64)
    with pytest.raises(MtkitError, match=r"^train\.init_from: \S+last\.pt has sha256 [0-9a-f]{12}…, "
                                         r"not train\.init_sha256's 000000000000…$"):
        train(config, data_dir, tmp_path / "run", progress=False)
    ok = dataclasses.replace(config, train=dataclasses.replace(config.train, max_steps=1,
                                                               init_sha256=sha256(parent_checkpoint(parent))))
    assert train(ok, data_dir, tmp_path / "run", progress=False).step == 1

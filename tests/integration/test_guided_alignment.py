"""Guided-alignment training end to end: word alignments stored by ``prepare`` (a Pharaoh file, or eflomal),
a model trained to align with one head, resumed exactly, and read back by both engines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_MODEL, reverse_data_config, write_reverse_corpus
from inprocess import run_mtkit

from mtkit.config import config_from_dict
from mtkit.errors import MtkitError


def reverse_alignments(src_path: Path, out: Path) -> Path:
    """The reverse task's exact word alignment: source word i is target word n - 1 - i."""
    lines = []
    for line in src_path.read_text().splitlines():
        n = len(line.split())
        lines.append(" ".join(f"{i}-{n - 1 - i}" for i in range(n)))
    out.write_text("\n".join(lines) + "\n")
    return out


def prepare(root: Path, alignments: str | None, n_train: int = 3000, **clean) -> tuple[Path, dict]:
    from mtkit.commands.prepare import prepare as run_prepare

    files = write_reverse_corpus(root / "text", n_train=n_train)
    data = reverse_data_config(files)
    if alignments == "file":
        alignments = str(reverse_alignments(files["train"][0], root / "train.align"))
    data["alignments"] = alignments
    if clean:
        data["clean"] = clean
    run_prepare(config_from_dict({"data": data}), root / "prepared", progress=False)
    return root / "prepared", data


def guided_config(data: dict, **train):
    settings = {"max_tokens": 600, "lr_schedule": "inverse_sqrt", "lr": 3e-3, "warmup": 40, "label_smoothing": 0.0,
                "log_every": 10, "valid_every": 0, "save_every": 0, "max_steps": 60, "seed": 3,
                "guided_alignment": {"weight": 1.0, "layer": -2, "head": 1}, **train}
    return config_from_dict({"data": data, "model": TINY_MODEL, "train": settings})


def test_prepare_stores_each_pairs_links_on_its_pieces(tmp_path):
    from mtkit.data.alignments import AlignmentStore
    from mtkit.data.store import ParallelStore
    from mtkit.data.vocab import Vocab

    data_dir, data = prepare(tmp_path, "file", n_train=400, dedup=True)
    pairs = ParallelStore.open(data_dir, "train")
    links = AlignmentStore.open(data_dir, "train", pairs)
    vocab = Vocab.load(data_dir)
    assert len(links) == len(pairs) < 400  # duplicates dropped, with their links
    for i in range(len(pairs)):
        src, tgt = vocab.decode_src(pairs.src(i)), vocab.decode_tgt(pairs.tgt(i))
        assert tgt.split() == src.split()[::-1]
        src_words, tgt_words = vocab.src_words(src), vocab.tgt_text_words(tgt)
        n = len(src.split())
        expected = {(s, t) for s, ws in enumerate(src_words) for t, wt in enumerate(tgt_words) if wt == n - 1 - ws}
        assert {tuple(p) for p in links.links(i).tolist()} == expected


def test_a_pharaoh_file_that_does_not_fit_is_a_one_line_error(tmp_path):
    files = write_reverse_corpus(tmp_path / "text", n_train=50)
    data = reverse_data_config(files)
    lines = reverse_alignments(files["train"][0], tmp_path / "a").read_text().splitlines()
    from mtkit.commands.prepare import prepare as run_prepare

    for name, text, message in (
            ("short", "\n".join(lines[:-1]) + "\n", "49 lines, fewer than data.train's pairs"),
            ("long", "\n".join(lines + ["0-0"]) + "\n", "more lines than data.train's 50 pairs"),
            ("beyond", "\n".join(lines[:6] + ["0-9"] + lines[7:]) + "\n", "line 7: pair 0-9 names a word beyond"),
            ("garbage", "\n".join(lines[:2] + ["0-1 x"] + lines[3:]) + "\n", "line 3: 'x' is not a Pharaoh pair")):
        path = tmp_path / f"{name}.align"
        path.write_text(text)
        with pytest.raises(MtkitError, match=message) as e:
            run_prepare(config_from_dict({"data": {**data, "alignments": str(path)}}), tmp_path / name / "out",
                        progress=False)
        assert "\n" not in str(e.value)
        assert not (tmp_path / name / "out").exists()


def test_eflomal_aligns_the_training_pairs(tmp_path):
    pytest.importorskip("eflomal")
    from mtkit.data.alignments import AlignmentStore
    from mtkit.data.store import ParallelStore
    from mtkit.data.vocab import Vocab

    data_dir, _ = prepare(tmp_path, "eflomal", n_train=600)
    pairs = ParallelStore.open(data_dir, "train")
    links = AlignmentStore.open(data_dir, "train", pairs)
    vocab = Vocab.load(data_dir)
    # eflomal finds the reversal: most links join a word with its mirror
    right = total = 0
    for i in range(len(pairs)):
        src, tgt = vocab.decode_src(pairs.src(i)), vocab.decode_tgt(pairs.tgt(i))
        src_words, tgt_words, n = vocab.src_words(src), vocab.tgt_text_words(tgt), len(src.split())
        for s, t in links.links(i).tolist():
            total += 1
            right += src_words[s] == n - 1 - tgt_words[t]
    assert total and right / total > 0.8, (right, total)


def test_guided_training_without_stored_alignments_is_a_one_line_error(tmp_path):
    from mtkit.training.trainer import train

    data_dir, data = prepare(tmp_path, None, n_train=100)
    with pytest.raises(MtkitError, match="no word alignments of the 'train' pairs .* set data.alignments"):
        train(guided_config(data), data_dir, tmp_path / "run", progress=False)


@pytest.mark.slow
def test_guided_training_resumes_bit_for_bit(tmp_path):
    from mtkit.checkpoints.io import load_checkpoint
    from mtkit.training.trainer import train

    data_dir, data = prepare(tmp_path, "file", n_train=600)
    common = dict(max_steps=16, save_every=8, log_every=1, update_freq=2)
    train(guided_config(data, **common), data_dir, tmp_path / "straight", progress=False)
    train(guided_config(data, **{**common, "max_steps": 8}), data_dir, tmp_path / "split", progress=False)
    train(guided_config(data, **common), data_dir, tmp_path / "split", resume=True, progress=False)
    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "split" / "checkpoints" / "last.pt")
    assert a["step"] == b["step"] == 16
    for key, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][key]), key


@pytest.mark.slow
def test_a_guided_model_aligns_the_reverse_task_in_both_engines(tmp_path):
    """Trained with the exact alignments, its head aligns each output word with its mirror source word, and
    the CTranslate2 export (the head declared as CTranslate2's alignment head) prints the same."""
    from mtkit.training.trainer import train

    data_dir, data = prepare(tmp_path, "file")
    train(guided_config(data, max_steps=400, lr_schedule="linear", clip_norm=1.0), data_dir, tmp_path / "run",
          progress=False)
    source = data["test"]["src"]
    found = {}
    for engine, model in (("torch", tmp_path / "run"), ("ctranslate2", tmp_path / "run")):
        done = run_mtkit("translate", "-m", model, "--engine", engine, "--alignments", source)
        assert done.returncode == 0, done.stderr
        found[engine] = done.stdout.splitlines()
    lines = open(source).read().splitlines()
    right = total = 0
    for line, row in zip(lines, found["torch"], strict=True):
        output, _, alignment = row.partition(" ||| ")
        if output.split() != line.split()[::-1]:
            continue  # a wrong translation: its alignment is no test
        n = len(line.split())
        pairs = [tuple(map(int, p.split("-"))) for p in alignment.split()]
        total += n
        right += sum(t == n - 1 - s for s, t in pairs)
    assert total > 0.8 * sum(len(line.split()) for line in lines)
    assert right / total > 0.95, (right, total)
    same = sum(a == b for a, b in zip(found["torch"], found["ctranslate2"], strict=True))
    assert same >= len(lines) - 1, f"{same}/{len(lines)}"


@pytest.mark.slow
def test_guided_training_under_ddp_matches_one_process(tmp_path):
    """torchrun, 2 gloo ranks × 2 accumulated batches: the same weights as one process accumulating 4, the
    alignment term included (each rank reads its own batches' links)."""
    import json

    from mtkit.checkpoints.io import load_checkpoint
    from mtkit.config import save_config
    from mtkit.training.trainer import train

    data_dir, data = prepare(tmp_path, "file", n_train=3000)
    common = dict(max_steps=6, log_every=1)
    train(guided_config(data, update_freq=4, **common), data_dir, tmp_path / "single", progress=False)
    save_config(guided_config(data, update_freq=2, **common), tmp_path / "ddp.yaml")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
           "--log-dir", str(tmp_path / "torchrun"), "-m", "mtkit", "train", str(tmp_path / "ddp.yaml"),
           "--data", str(data_dir), "--run-dir", str(tmp_path / "ddp")]
    done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    a = load_checkpoint(tmp_path / "single" / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "ddp" / "checkpoints" / "last.pt")["model"]
    for key in a:
        if not key.endswith("w_k.bias"):  # no true gradient, only rounding noise (test_train's DDP test)
            assert torch.allclose(a[key], b[key], atol=2e-5), key
    records = [json.loads(line) for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["world_size"] == 2


@pytest.mark.slow
def test_guided_training_in_bf16_learns_to_align(tmp_path):
    from mtkit.checkpoints.io import load_model
    from mtkit.data.alignments import AlignmentStore
    from mtkit.data.store import ParallelStore
    from mtkit.training.batching import collate

    data_dir, data = prepare(tmp_path, "file", n_train=3000)
    from mtkit.training.trainer import train

    def alignment_loss(run: Path | None) -> float:
        """The guided term of 64 training pairs under the run's model (an untrained one for None)."""
        from mtkit.model import Transformer
        from mtkit.training.loss import guided_alignment_loss

        if run is None:
            torch.manual_seed(0)
            model = Transformer(guided_config(data).model, 100, 100)
        else:
            model = load_model(run).model
        pairs = ParallelStore.open(data_dir, "train")
        batch = collate(pairs, range(64), alignments=AlignmentStore.open(data_dir, "train", pairs))
        model.eval()
        with torch.no_grad():
            memory, mask = model.encode(batch.src)
            _, attention = model.decoder.forward_with_attention(batch.tgt_in, memory, mask, 0, 1)
        return float(guided_alignment_loss(attention, batch.align)) / float((batch.align.sum(-1) > 0).sum())

    train(guided_config(data, max_steps=150, precision="bf16"), data_dir, tmp_path / "run", progress=False)
    before, after = alignment_loss(None), alignment_loss(tmp_path / "run")
    assert after < 0.5 * before, (before, after)


def test_prepare_takes_alignments_as_a_flag(tmp_path):
    import json

    files = write_reverse_corpus(tmp_path / "text", n_train=200)
    pharaoh = reverse_alignments(files["train"][0], tmp_path / "train.align")
    done = run_mtkit("prepare", "--src", files["train"][0], "--tgt", files["train"][1], "--alignments", pharaoh,
                     "--set", "data.spm.vocab_size=60", "-o", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["splits"]["train"]["alignments"]["source"] == str(pharaoh)
    assert manifest["splits"]["train"]["alignments"]["aligned_pairs"] == manifest["splits"]["train"]["pairs"]
    bad = run_mtkit("prepare", "--src", files["train"][0], "--tgt", files["train"][1], "--alignments",
                    tmp_path / "missing.align", "-o", tmp_path / "out2")
    assert bad.returncode != 0 and "no such file" in bad.stderr and "Traceback" not in bad.stderr

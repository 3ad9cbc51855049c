"""Checkpoints: atomic saves, safe loads, and the model a checkpoint alone describes.

A checkpoint is a ``torch.save`` dict of tensors and plain data only, loaded with
``weights_only=True`` so that loading never executes code from the file:

    format_version   CHECKPOINT_FORMAT
    mtkit_version    str
    config           the resolved Config as plain data
    model            the raw (uncompiled, unwrapped) model state_dict
    vocab            {"src": bytes, "tgt": bytes | None}: the SentencePiece model(s)
    src_vocab_size, tgt_vocab_size
    step, epoch      training position (absent in averaged checkpoints)
    optimizer, scheduler, scaler, rng, sampler   training state for exact resume

A run directory holds ``checkpoints/step_NNNNNNN.pt`` files, ``last.pt`` and
``best.pt`` (hard links to a step file, swapped in atomically, so they never point
at a partial file) and ``averaged.pt`` written by ``mtkit average``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtkit.errors import MtkitError
from mtkit.io import atomic_path

CHECKPOINT_FORMAT = 1
STEP_PATTERN = re.compile(r"^step_(\d+)\.pt$")


def save_checkpoint(payload: dict, path: str | Path) -> Path:
    """Write ``payload`` to ``path`` atomically (temporary file, fsync, rename)."""
    import torch

    path = Path(path)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
    return path


def link_atomically(target: Path, link: Path) -> None:
    """Make ``link`` name the same file as ``target`` (a hard link, or a copy where links fail), atomically."""
    import shutil

    with atomic_path(link) as tmp:
        os.unlink(tmp)
        try:
            os.link(target, tmp)
        except OSError:
            shutil.copyfile(target, tmp)


def load_checkpoint(path: str | Path, map_location: str = "cpu") -> dict:
    """Load a checkpoint file (``weights_only=True``); user errors become one-line MtkitErrors."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise MtkitError(f"{path}: no such checkpoint")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # a truncated or foreign file
        raise MtkitError(f"{path}: not a readable mtkit checkpoint ({type(e).__name__})") from None
    if not isinstance(ckpt, dict) or "format_version" not in ckpt:
        raise MtkitError(f"{path}: not an mtkit checkpoint (no format_version)")
    if ckpt["format_version"] > CHECKPOINT_FORMAT:
        raise MtkitError(
            f"{path}: checkpoint format {ckpt['format_version']} is newer than this mtkit "
            f"understands ({CHECKPOINT_FORMAT}); upgrade mtkit"
        )
    return ckpt


def step_checkpoints(run_dir: str | Path) -> list[Path]:
    """The run's ``step_N.pt`` files, oldest first."""
    ckpt_dir = Path(run_dir) / "checkpoints"
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := STEP_PATTERN.match(p.name))]
    return [p for _, p in sorted(found)]


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or a run directory (its averaged, else best, else last checkpoint)."""
    path = Path(path)
    if path.is_dir():
        for name in ("averaged.pt", "best.pt", "last.pt"):
            candidate = path / "checkpoints" / name
            if candidate.is_file():
                return candidate
        raise MtkitError(f"{path}: no checkpoint in this run directory (expected checkpoints/last.pt)")
    if not path.exists():
        raise MtkitError(f"{path}: no such checkpoint or run directory")
    return path


@dataclass
class LoadedModel:
    """What a checkpoint alone is enough for: the model, its vocabulary and its config."""

    model: Any  # mtkit.model.Transformer
    vocab: Any  # mtkit.data.vocab.Vocab
    config: Any  # mtkit.config.Config
    path: Path


def load_model(path: str | Path, device: str = "cpu") -> LoadedModel:
    """Build the model of a checkpoint (file or run directory) in eval mode on ``device``."""
    from mtkit.config import config_from_dict
    from mtkit.data.vocab import Vocab
    from mtkit.model import Transformer

    path = resolve_checkpoint(path)
    ckpt = load_checkpoint(path)
    config = config_from_dict(ckpt["config"])
    model = Transformer(config.model, ckpt["src_vocab_size"], ckpt["tgt_vocab_size"])
    model.load_state_dict(ckpt["model"])
    model.to(device).eval()
    vocab = Vocab.from_bytes(ckpt["vocab"]["src"], ckpt["vocab"].get("tgt"))
    return LoadedModel(model=model, vocab=vocab, config=config, path=path)

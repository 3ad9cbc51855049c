"""Saving checkpoints: atomic saves, the run directory's links and lock (loading: :mod:`mtkit.runtime.checkpoint`).

A checkpoint is a ``torch.save`` dict of tensors and plain data only, loaded with
``weights_only=True`` so that loading never executes code from the file:

    format_version   mtkit.runtime.checkpoint.CHECKPOINT_FORMAT
    mtkit_version    str
    config           the resolved Config as plain data (a multilingual model's pairs: data.pairs)
    model            the raw (uncompiled, unwrapped) model state_dict
    vocab            {"src": bytes, "tgt": bytes | None}: the SentencePiece model(s); an imported model's
                     also "pieces": {"src": [str], "tgt": [str] | None}, its id -> piece table(s)
    src_vocab_size, tgt_vocab_size
    step, epoch      training position (in averaged checkpoints: the last averaged one's step)
    optimizer, scheduler, scaler, rng, sampler   training state for exact resume
    vocab_sha256     {"src": hex, "tgt": hex | None} of the vocab bytes (training checkpoints)
    data_fingerprint the prepared data's manifest fingerprint, or None (training checkpoints)
    averaged_from    the averaged files (averaged checkpoints only)

A run directory holds ``checkpoints/step_NNNNNNN.pt`` files, ``last.pt`` and
``best.pt`` (hard links to a step file, swapped in atomically, so they never point
at a partial file) and ``averaged.pt`` written by ``mtkit average``. While a
training runs, it holds an exclusive lock on ``RUN/.lock`` (:class:`RunLock`).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import sys
from pathlib import Path

from mtkit.errors import MtkitError
from mtkit.io import atomic_path

# What mtkit.io.atomic_path leaves behind when a save is cut short (mkstemp's ``.NAME.XXXXXXXX.tmp``);
# only files that `mtkit train` alone writes, so that a concurrent `mtkit average` keeps its own.
PARTIAL_SAVES = {
    "checkpoints": re.compile(r"^\.(step_\d+\.pt|last\.pt|best\.pt)\..+\.tmp$"),
    ".": re.compile(r"^\.(config\.yaml|spm\.model|spm\.src\.model|spm\.tgt\.model|pieces\.json)\..+\.tmp$"),
}
# torch.save reports a failed write to a path as a RuntimeError ("unexpected pos 704 vs 598",
# "PytorchStreamWriter failed writing file ..."), not as the OSError beneath it.
_WRITE_FAILURE = re.compile(r"unexpected pos|fail\w* writ|write fail", re.IGNORECASE)


def save_checkpoint(payload: dict, path: str | Path) -> Path:
    """Write ``payload`` to ``path`` atomically (temporary file, fsync, rename).

    Raises:
        MtkitError: the disk or quota is full; the temporary file is gone and ``path``
            (and every other checkpoint) is as it was.
    """
    import torch

    path = Path(path)
    try:
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                torch.save(payload, f)
                f.flush()
                os.fsync(f.fileno())
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise MtkitError(f"{path}: no space left on device while saving the checkpoint; "
                             "the previous checkpoints are intact") from None
        if e.errno == errno.EDQUOT:
            raise MtkitError(f"{path}: disk quota exceeded while saving the checkpoint; "
                             "the previous checkpoints are intact") from None
        raise
    except RuntimeError as e:
        if not _WRITE_FAILURE.search(str(e)):
            raise
        raise MtkitError(f"{path}: writing the checkpoint failed (is the disk full?); "
                         "the previous checkpoints are intact") from None
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


def vocab_sha256(vocab: dict) -> dict:
    """SHA-256 (hex) of a checkpoint's ``vocab`` bytes: ``{"src": …, "tgt": … | None}``."""
    return {side: hashlib.sha256(vocab[side]).hexdigest() if vocab.get(side) is not None else None
            for side in ("src", "tgt")}


def describe_vocab(src: bytes, tgt: bytes | None, src_size: int, tgt_size: int) -> str:
    """``spm.model is 8000 pieces sha256 1a2b3c4d…`` (or the src + tgt pair), for error messages."""
    digest = vocab_sha256({"src": src, "tgt": tgt})
    if tgt is None:
        return f"spm.model is {src_size} pieces sha256 {digest['src'][:8]}…"
    return (f"spm.src.model + spm.tgt.model are {src_size} + {tgt_size} pieces "
            f"sha256 {digest['src'][:8]}… + {digest['tgt'][:8]}…")


def vocab_difference(ckpt: dict, vocab) -> tuple[str, str] | None:
    """``(the checkpoint's, the data's)`` vocabulary described (:func:`describe_vocab`), or None when
    ``vocab`` has the checkpoint's SentencePiece bytes: other bytes give the ids other meanings."""
    src, tgt = vocab.model_bytes()
    if (ckpt["vocab"]["src"], ckpt["vocab"].get("tgt")) == (src, tgt):
        return None
    theirs = describe_vocab(ckpt["vocab"]["src"], ckpt["vocab"].get("tgt"), ckpt["src_vocab_size"],
                            ckpt["tgt_vocab_size"])
    return theirs, describe_vocab(src, tgt, vocab.src_size, vocab.tgt_size)


class RunLock:
    """Exclusive ownership of a run directory: ``flock`` on ``RUN/.lock``, which holds the owner's pid.

    The kernel drops the lock when its process ends, however it ends, so a crashed run's
    directory is free again at once: there is no stale lock file to remove by hand.
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / ".lock"
        self._file = None

    def acquire(self) -> None:
        """Take the lock, or raise MtkitError naming the pid that holds it."""
        try:
            import fcntl
        except ImportError:  # no flock on this platform: the directory goes unguarded
            return
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise MtkitError(f"{self.run_dir}: exists and is not a directory; choose a run directory")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+", encoding="utf-8")  # "a+": never truncates the holder's pid
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip()
            f.close()
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise MtkitError(f"{self.run_dir}: another mtkit train{who} is using this run directory") from None
        except OSError as e:  # e.g. ENOLCK on a network file system without locks
            f.close()
            print(f"warning: {self.path}: cannot lock the run directory ({e.strerror}); "
                  "make sure no other training uses it", file=sys.stderr)
            return
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._file = f

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the descriptor releases the flock
            self._file = None


def remove_partial_saves(run_dir: Path) -> list[Path]:
    """Delete the temporary files of saves that a killed process left in ``run_dir``; call it
    only while holding the :class:`RunLock`, so that no live writer owns them."""
    removed = []
    for folder, pattern in PARTIAL_SAVES.items():
        directory = Path(run_dir) / folder
        if directory.is_dir():
            for p in directory.iterdir():
                if pattern.match(p.name) and p.is_file():
                    p.unlink(missing_ok=True)
                    removed.append(p)
    return removed

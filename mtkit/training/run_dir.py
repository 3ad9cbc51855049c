"""A training's run directory besides the checkpoints' format (:mod:`mtkit.checkpoints.io`): its lock
(:class:`RunLock`), the ``last.pt`` / ``best.pt`` links and the partial saves a killed run leaves, the stop
signals (SIGINT / SIGTERM save the step and stop), the metrics log (``metrics.jsonl``, TensorBoard), and
the checks of the prepared data it trains on."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import threading
from pathlib import Path

import torch

from mtkit.data.store import load_manifest
from mtkit.engines.device import resolve_device
from mtkit.errors import MtkitError
from mtkit.io import atomic_path, atomic_write_text
from mtkit.training.curves import read_metrics

logger = logging.getLogger(__name__)

# What mtkit.io.atomic_path leaves behind when a save is cut short (mkstemp's ``.NAME.XXXXXXXX.tmp``);
# only files that `mtkit train` alone writes, so that a concurrent `mtkit average` keeps its own.
PARTIAL_SAVES = {
    "checkpoints": re.compile(r"^\.(step_\d+\.pt|last\.pt|best\.pt)\..+\.tmp$"),
    ".": re.compile(r"^\.(config\.yaml|spm\.model|spm\.src\.model|spm\.tgt\.model|pieces\.json)\..+\.tmp$"),
}


def check_prepared(data_dir: Path) -> dict:
    """The data directory's manifest, verified (a missing, damaged or newer one is a one-line error)."""
    return load_manifest(data_dir)


def data_fingerprint(data_dir: Path) -> str | None:
    """The prepared data's identity (``manifest.json``'s fingerprint), saved in every checkpoint."""
    return check_prepared(data_dir).get("fingerprint")


def clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class StopSignals:
    """SIGINT and SIGTERM ask the training to stop at the next step boundary, after saving;
    a second one ends the process at once, unsaved (exit 128 + signal).

    Installed only in the main thread (Python allows no other), and not over a signal the
    parent set to be ignored (``nohup``, a background job), as a well-behaved command does.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._saved: dict = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                previous = signal.getsignal(sig)
                if previous is not signal.SIG_IGN:
                    self._saved[sig] = previous if previous is not None else signal.SIG_DFL
                    signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, previous in self._saved.items():
            signal.signal(sig, previous)
        self._saved.clear()

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        # os.write, not print: the handler may interrupt a print to stderr, whose buffer is not reentrant.
        if self.signum is not None:
            os.write(2, f"\n{name} again: stopping at once, without saving\n".encode())
            os._exit(128 + signum)
        self.signum = signum
        os.write(2, f"\n{name}: saving a checkpoint after this step, then stopping "
                    f"(send it again to stop at once, unsaved)\n".encode())


def select_device(name: str, local_rank: int) -> torch.device:
    """``train.device`` for this rank (``auto``: ``cuda:LOCAL_RANK`` or cpu); see :mod:`mtkit.engines.device`."""
    return torch.device(resolve_device(name, local_rank, setting="train.device"))


class MetricsLog:
    """``metrics.jsonl``: one JSON object per line (training logs and validations)."""

    def __init__(self, path: Path, enabled: bool, tensorboard: bool = False) -> None:
        self.path = path
        self.enabled = enabled
        self.tensorboard = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise MtkitError("train.tensorboard needs the tensorboard package: "
                                 "pip install 'mtkit[tensorboard]'") from None
            self.tensorboard = SummaryWriter(log_dir=str(path.parent / "tensorboard"))

    def truncate_after(self, step: int) -> None:
        """On resume, forget what an interrupted run logged after its last checkpoint (and a
        line cut short by a crash, with a warning: :func:`mtkit.training.curves.read_metrics`)."""
        if not (self.enabled and self.path.exists()):
            return
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def reset(self) -> None:
        """On a fresh start, drop what a run that never saved a checkpoint logged: none of it goes on."""
        if self.enabled:
            self.path.unlink(missing_ok=True)

    def write(self, record: dict) -> None:
        if self.enabled:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.tensorboard.add_scalar(key, value, record.get("step", 0))
            self.tensorboard.flush()

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()


def link_atomically(target: Path, link: Path) -> None:
    """Make ``link`` name the same file as ``target`` (a hard link, or a copy where links fail), atomically."""
    with atomic_path(link) as tmp:
        if tmp == link:  # a device or FIFO, written through: never to be unlinked
            with open(target, "rb") as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst)
            return
        os.unlink(tmp)
        try:
            os.link(target, tmp)
        except OSError:
            shutil.copyfile(target, tmp)


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
            logger.warning(f"warning: {self.path}: cannot lock the run directory ({e.strerror}); "
                           "make sure no other training uses it")
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

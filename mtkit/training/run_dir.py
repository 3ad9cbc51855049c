"""What a training keeps in its run directory besides checkpoints: the stop signals (SIGINT / SIGTERM
save the step and stop), the metrics log (``metrics.jsonl``, TensorBoard), and the checks of the
prepared data it trains on; the lock is :class:`mtkit.training.checkpoint.RunLock`."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import torch

from mtkit.errors import MtkitError
from mtkit.runtime.device import resolve_device


def check_prepared(data_dir: Path) -> dict:
    """The data directory's manifest, verified (a missing, damaged or newer one is a one-line error)."""
    from mtkit.data.store import load_manifest

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
    """``train.device`` for this rank (``auto``: ``cuda:LOCAL_RANK`` or cpu); see :mod:`mtkit.runtime.device`."""
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
        from mtkit.io import atomic_write_text
        from mtkit.training.curves import read_metrics

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

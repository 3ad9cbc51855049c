"""``mtkit train``: glue between the CLI and mtkit.training."""

from __future__ import annotations

import sys
from pathlib import Path

from mtkit.config import Config


def train(config: Config, data_dir: Path, run_dir: Path, resume: bool | None = None):
    """Train ``config`` on ``data_dir`` into ``run_dir`` and print a one-line summary on stderr.

    With ``train.processes`` > 1 (and not already under torchrun) the training runs in that
    many torchrun ranks started here, which print the summary; the result is then None.
    With ``train.ensemble`` > 1 it trains that many models, in ``run_dir`` and its siblings
    ``run_dir``-2, … (:mod:`mtkit.training.ensemble`); the result is then None.
    """
    from mtkit.training.launch import launch_local, under_torchrun

    if config.train.ensemble > 1 and not under_torchrun():
        from mtkit.training.ensemble import train_members

        train_members(config, Path(data_dir), Path(run_dir), resume=resume)
        return None
    if config.train.processes > 1 and not under_torchrun():
        launch_local(config, Path(data_dir), Path(run_dir), resume=resume)
        return None

    from mtkit.training.trainer import train as run_training

    result = run_training(config, Path(data_dir), Path(run_dir), resume=resume)
    if result.last_checkpoint is not None:  # rank 0 only
        print(
            f"trained {result.step} steps in {result.minutes:.1f} min (stopped: {result.stopped_because}); "
            f"last checkpoint {result.last_checkpoint}"
            + (f"; averaged {result.averaged_checkpoint}" if result.averaged_checkpoint else ""),
            file=sys.stderr,
        )
    return result

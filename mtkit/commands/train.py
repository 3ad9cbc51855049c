"""``mtkit train``: glue between the CLI and mtkit.training."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from mtkit.commands.processes import Nodes, launch_local, train_members, under_torchrun
from mtkit.config import PAD_ID, Config, ModelConfig
from mtkit.errors import MtkitError, counted
from mtkit.io import MAX_CONFIG_BYTES, read_json_file
from mtkit.model import Transformer, count_parameters
from mtkit.training.finetune import resolve_init
from mtkit.training.trainer import train as run_training


def default_model_note(config: Config, data_dir: Path) -> str | None:
    """A notice when the recipe has no model section: the default is the paper's transformer-base,
    hundreds of MB per checkpoint, which a recipe for a small task rarely means to train."""
    if config.model != ModelConfig():
        return None
    size = ""
    try:
        vocab = read_json_file(Path(data_dir) / "manifest.json", MAX_CONFIG_BYTES, "data manifest")["vocab"]
        sizes = int(vocab["src_size"]), int(vocab["tgt_size"])
    except (MtkitError, ValueError, KeyError, TypeError):
        sizes = None
    if sizes is not None:
        with torch.device("meta"):  # shapes only: no memory, no time
            size = f" ({count_parameters(Transformer(config.model, *sizes, pad_id=PAD_ID)) / 1e6:.1f}M parameters)"
    return f"note: no model section in the recipe; training the paper's transformer-base{size}"


def train(config: Config, data_dir: Path, run_dir: Path, resume: bool | None = None, nodes: Nodes | None = None):
    """Train ``config`` on ``data_dir`` into ``run_dir`` and print a one-line summary on stderr.

    With ``train.processes`` > 1 (and not already under torchrun) the training runs in that
    many torchrun ranks started here, which print the summary; the result is then None.
    ``nodes`` (checked by :func:`mtkit.commands.processes.check_nodes`; default: ``train.nodes``, which must
    then be 1): this machine's part of a training on several; its ranks are started here too.
    With ``train.ensemble`` > 1 it trains that many models, in ``run_dir`` and its siblings
    ``run_dir``-2, … (:mod:`mtkit.commands.processes`); the result is then None.

    Raises:
        mtkit.errors.Interrupted: SIGINT or SIGTERM stopped it after saving a checkpoint.
    """
    nodes = nodes or Nodes(config.train.nodes)
    if nodes.count > 1 and nodes.endpoint is None and not under_torchrun():
        raise MtkitError(f"train.nodes={nodes.count} needs the rendezvous endpoint (mtkit train --rdzv-endpoint)")
    several = config.train.processes > 1 or nodes.count > 1
    launching = not under_torchrun() and (config.train.ensemble > 1 or several)
    if launching and config.train.init_from is not None:
        # Checked once, before any process starts or directory is made; they get the resolved config.
        config, _ = resolve_init(config, Path(run_dir), resume, Path(data_dir))
    if config.train.ensemble > 1 and not under_torchrun():
        train_members(config, Path(data_dir), Path(run_dir), resume=resume)
        return None
    if several and not under_torchrun():
        launch_local(config, Path(data_dir), Path(run_dir), resume=resume, nodes=nodes)
        return None

    # Here this process trains: the one that trains alone, or rank 0, says it once.
    if os.environ.get("RANK", "0") == "0" and config.train.init_from is None and (
            note := default_model_note(config, Path(data_dir))):
        print(note, file=sys.stderr, flush=True)
    result = run_training(config, Path(data_dir), Path(run_dir), resume=resume)
    if result.last_checkpoint is not None:  # rank 0 only
        print(
            f"trained {counted(result.step, 'step')} in {result.minutes:.1f} min (stopped: {result.stopped_because}); "
            f"last checkpoint {result.last_checkpoint}"
            + (f"; averaged {result.averaged_checkpoint}" if result.averaged_checkpoint else ""),
            file=sys.stderr,
        )
    return result

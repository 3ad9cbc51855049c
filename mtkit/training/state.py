"""A training's state in a checkpoint, and the checks and restores of resuming from one.

Besides the fields every checkpoint has (:func:`mtkit.checkpoints.io.model_payload`: the model, its
config and vocabulary), a training's checkpoint holds the optimizer, the scaler, the RNG, the sampler's
position, the counters a resumed run continues from and a fingerprint of its data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mtkit.checkpoints.io import check_weights_fit, checkpoint_config, model_payload, vocab_difference, vocab_entry
from mtkit.config import Config, config_to_dict
from mtkit.errors import MtkitError
from mtkit.training.batching import SamplerState
from mtkit.training.finetune import Parent


@dataclass
class Counters:
    """What a resumed run continues from besides the weights, the optimizer and the sampler."""

    step: int = 0
    elapsed: float = 0.0  # training seconds, summed over resumed runs
    best: float | None = None
    bad_validations: int = 0
    length_growth: tuple[float, float] = field(default=(1.0, 1.0))


@dataclass(frozen=True)
class Updaters:
    """What updates a run's weights, whose state a checkpoint keeps: the optimizer, the gradient scaler and
    the run's :class:`mtkit.training.ema.ExponentialMovingAverage` (None: it keeps none)."""

    optimizer: Any
    scaler: Any
    ema: Any = None


def checkpoint_payload(config: Config, model: torch.nn.Module, updaters: Updaters, vocab,
                       data_fingerprint: str | None, position: SamplerState, counters: Counters) -> dict:
    """Everything a run needs to continue exactly, and inference to translate, in one dict."""
    optimizer, scaler, ema = updaters.optimizer, updaters.scaler, updaters.ema
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return model_payload(
        config_to_dict(config), model.state_dict(), vocab_entry(vocab), vocab.src_size, vocab.tgt_size,
        data_fingerprint=data_fingerprint,
        step=counters.step,
        epoch=position.epoch,
        optimizer=optimizer.state_dict(),
        scheduler={"name": config.train.lr_schedule, "step": counters.step},
        scaler=scaler.state_dict(),
        rng=rng,
        sampler={"epoch": position.epoch, "position": position.position},
        elapsed=counters.elapsed,
        best=counters.best,
        bad_validations=counters.bad_validations,
        length_growth=list(counters.length_growth),
        **({"ema": ema.state_dict()} if ema is not None else {}),
    )


def check_resumable(ckpt: dict, path: Path, *, run_dir: Path, data_dir: Path, config: Config, model, vocab,
                    data_fingerprint: str | None) -> None:
    """Refuse to resume on another vocabulary (the ids would mean other pieces, silently, or
    the embeddings would not fit), on other data, or with another model shape."""
    if differ := vocab_difference(ckpt, vocab):
        run, now = differ
        raise MtkitError(f"{run_dir}: resuming with a different vocabulary: the run's {run}, "
                         f"{data_dir}'s {now}; resume with the run's data or start a new run directory")
    trained_on = ckpt.get("data_fingerprint")  # absent in checkpoints older than the check
    if trained_on and data_fingerprint and trained_on != data_fingerprint:
        raise MtkitError(f"{run_dir}: resuming on different data: the run trained on data fingerprint "
                         f"{trained_on[:12]}…, {data_dir}/manifest.json has {data_fingerprint[:12]}…; "
                         f"resume with the run's data or start a new run directory")
    if checkpoint_config(ckpt, path).model != config.model:
        raise MtkitError(f"{run_dir / 'checkpoints'}: the checkpoint's model config differs from this recipe's; "
                         "use a new run directory")
    check_weights_fit(model, ckpt["model"], path)


def restore(ckpt: dict, model: torch.nn.Module, optimizer, scaler, ema=None) -> tuple[SamplerState, Counters]:
    """Load a checked ``ckpt`` into the model, optimizer, scaler, RNG and (``ema``) the moving average, which
    starts from the weights when the checkpoint has none; the sampler's position and the counters to
    continue from."""
    model.load_state_dict(ckpt["model"])
    if ema is not None and "ema" in ckpt:
        ema.load_state_dict(ckpt["ema"])
    elif ema is not None:  # a run that kept no average before: it starts from the weights resumed
        ema.reset(model)
    optimizer.load_state_dict(ckpt["optimizer"])
    scaler.load_state_dict(ckpt["scaler"])
    torch.set_rng_state(ckpt["rng"]["torch"])
    if "cuda" in ckpt["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
    growth = tuple(ckpt["length_growth"]) if "length_growth" in ckpt else (1.0, 1.0)
    counters = Counters(ckpt["step"], ckpt.get("elapsed", 0.0), ckpt.get("best"), ckpt.get("bad_validations", 0),
                        (float(growth[0]), float(growth[1])))
    return SamplerState(ckpt["sampler"]["epoch"], ckpt["sampler"]["position"]), counters


def start_from(init: Parent, model: torch.nn.Module, optimizer, keep_optimizer: bool) -> None:
    """Take the parent's weights (and, with ``keep_optimizer``, its Adam moments); the step, schedule,
    sampler and RNG stay fresh. The vocabulary was checked before."""
    check_weights_fit(model, init.ckpt["model"], init.path)
    model.load_state_dict(init.ckpt["model"])
    if keep_optimizer:
        state = optimizer.state_dict()  # this recipe's betas, eps and weight decay; the parent's moments
        parent = init.ckpt["optimizer"]
        sizes = [len(g["params"]) for g in state["param_groups"]]
        if [len(g["params"]) for g in parent.get("param_groups", [])] != sizes:
            raise MtkitError(f"train.init_keep_optimizer: {init.path}'s optimizer state does not fit this model")
        optimizer.load_state_dict({**state, "state": parent.get("state", {})})

"""Starting a new run from another model's weights (``train.init_from``): fine-tuning, continued training.

What fairseq's ``--finetune-from-model``, OpenNMT's ``train_from`` (with its resets) and Marian's
``--pretrained-model`` do: a new run directory whose model starts as the parent's, while its
optimizer, learning-rate schedule, step counter and data order start afresh. With
``train.init_keep_optimizer`` it also takes the parent's Adam moments (continued training); the step
and the schedule still restart, since the new run's warm-up and ``max_steps`` are its own.

The parent fixes what its weights mean, so the new run takes from it:

- the architecture: a recipe without a model section trains the parent's (with a note); one whose
  model section sets only dropout keys, the parent's architecture with those dropouts; any other
  model section must agree with the parent's on every architecture key (:data:`ARCHITECTURE`);
- the vocabulary: the data must be prepared with its SentencePiece model(s)
  (``mtkit prepare --vocab-from PARENT``), which the trainer checks before loading the weights.

The run records its parent in its saved config, and so in every checkpoint: ``train.init_from`` (the
resolved checkpoint file) and ``train.init_sha256`` (that file's SHA-256). ``init_from`` applies only
when a run starts: resuming a fine-tuning run continues it from its own last checkpoint, without the
parent.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from mtkit.checkpoints.io import checkpoint_config, load_checkpoint, resolve_checkpoint, vocab_difference
from mtkit.config import Config, ModelConfig, load_config
from mtkit.data.vocab import Vocab
from mtkit.errors import MtkitError

logger = logging.getLogger(__name__)

REGULARIZATION = ("dropout", "attention_dropout", "activation_dropout")
# Every model key that changes the function the weights compute (``preset`` only fills the others).
ARCHITECTURE = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name not in REGULARIZATION + ("preset",))


@dataclass
class Parent:
    """The checkpoint a new run starts from."""

    path: Path  # the checkpoint file (a run directory resolved to its checkpoint)
    ckpt: dict  # as :func:`mtkit.checkpoints.io.load_checkpoint` returns it
    config: Config
    sha256: str  # of the file

    @property
    def step(self) -> int | None:
        step = self.ckpt.get("step")
        return step if isinstance(step, int) else None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def load_parent(init_from: str, sha256: str | None = None, keep_optimizer: bool = False) -> Parent:
    """Read and check ``train.init_from`` (a checkpoint or a run directory); one-line errors name it."""
    try:
        path = resolve_checkpoint(init_from)
        ckpt = load_checkpoint(path)  # weights_only: loading never runs code from the file
        config = checkpoint_config(ckpt, path)
        digest = file_sha256(path)
    except MtkitError as e:
        raise MtkitError(f"train.init_from: {e}") from None
    except OSError as e:  # e.g. a file that vanished or became unreadable after the checks
        raise MtkitError(f"train.init_from: {path}: cannot read ({e.strerror})") from None
    path = path.resolve()  # the record: what the run started from, wherever it is run from next
    if sha256 is not None and digest != sha256:
        raise MtkitError(f"train.init_from: {path} has sha256 {digest[:12]}…, "
                         f"not train.init_sha256's {sha256[:12]}…")
    if keep_optimizer and not isinstance(ckpt.get("optimizer"), dict):
        raise MtkitError(f"train.init_keep_optimizer: {path} holds no optimizer state (an averaged checkpoint?); "
                         "start from the run's checkpoints/last.pt, or keep a fresh optimizer")
    return Parent(path=path, ckpt=ckpt, config=config, sha256=digest)


def check_vocabulary(parent: Parent, vocab, data_dir: Path) -> None:
    """Refuse data prepared with another vocabulary than the parent's (``vocab``: the data's
    :class:`mtkit.data.vocab.Vocab`): its ids would mean other pieces to the parent's embeddings."""
    if differ := vocab_difference(parent.ckpt, vocab):
        raise MtkitError(f"train.init_from: {data_dir} has another vocabulary than {parent.path}: its {differ[1]}, "
                         f"the checkpoint's {differ[0]}; "
                         f"prepare the data with mtkit prepare --vocab-from {parent.path}")


def model_from_parent(recipe: ModelConfig, parent: ModelConfig) -> tuple[ModelConfig, list[str], str | None]:
    """The model a run from ``parent`` trains, the architecture keys on which ``recipe`` disagrees
    with ``parent`` (``"d_model 256 vs 128"``), and a note on what was taken from the parent (a
    format string for the parent's path and architecture), or None."""
    default = ModelConfig()
    if recipe == default:  # no model section: the parent's, dropouts and all
        return parent, [], "no model section in the recipe; training {}'s model ({})"
    if recipe.preset is None and all(getattr(recipe, k) == getattr(default, k) for k in ARCHITECTURE):
        return (dataclasses.replace(parent, **{k: getattr(recipe, k) for k in REGULARIZATION}), [],
                "the recipe's model section sets only dropouts; training {}'s architecture ({}) with them")
    differences = [f"{k} {getattr(recipe, k)} vs {getattr(parent, k)}" for k in ARCHITECTURE
                   if getattr(recipe, k) != getattr(parent, k)]
    return recipe, differences, None


def resolve_init(config: Config, run_dir: Path, resume: bool | None = None,
                 data_dir: Path | None = None) -> tuple[Config, Parent | None]:
    """The config a run in ``run_dir`` trains, and the parent it starts from (None when it does not).

    A run that starts now (no ``checkpoints/last.pt``, ``resume`` not True) with ``train.init_from``
    gets the parent, its architecture where the recipe leaves it open, and its record (the resolved
    file and its SHA-256). A run that resumes gets its own record back from its saved config, and the
    architecture it started with, if the recipe leaves it open; it needs no parent. Nothing is
    written; every error comes before the run directory is touched. With ``data_dir``, the data's
    vocabulary is checked here too (the trainer checks it in any case).
    """
    run_dir = Path(run_dir)
    last = run_dir / "checkpoints" / "last.pt"
    if resume or (resume is None and last.exists()):
        return _resumed(config, run_dir), None
    t = config.train
    if t.init_from is None or last.exists():  # a run without a parent, or one the trainer will refuse to overwrite
        return config, None
    parent = load_parent(t.init_from, t.init_sha256, t.init_keep_optimizer)
    side, parent_side = config.data.tag_side, parent.config.data.tag_side
    if config.data.pairs and parent.config.data.pairs and side != parent_side:
        raise MtkitError(f"data.tag_side: {parent.path} was trained with its tags on the {parent_side} side; the "
                         f"recipe says {side}: fine-tune with the parent's tag_side")
    if data_dir is not None:
        check_vocabulary(parent, Vocab.load(data_dir), data_dir)
    model, differences, taken = model_from_parent(config.model, parent.config.model)
    if differences:
        raise MtkitError(f"train.init_from: the recipe's model differs from {parent.path}'s: {', '.join(differences)} "
                         "(leave out the model section, or its architecture keys, to take the checkpoint's)")
    if taken is not None:
        shape = ", ".join(f"{k} {getattr(model, k)}" for k in ("d_model", "h", "d_ff", "encoder_layers",
                                                                "decoder_layers"))
        if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for all
            logger.info("note: " + taken.format(parent.path, shape))
    train = dataclasses.replace(t, init_from=str(parent.path), init_sha256=parent.sha256)
    return dataclasses.replace(config, model=model, train=train), parent


def _resumed(config: Config, run_dir: Path) -> Config:
    """``config`` for resuming ``run_dir``: the run's own init record, and its architecture if it
    started from a parent and the recipe leaves the model open (the trainer checks the rest)."""
    try:
        run = load_config(run_dir / "config.yaml")
    except MtkitError:  # no saved config (nothing to resume): the trainer says what is wrong
        return config
    if config.train.init_from is not None and run.train.init_from is None and os.environ.get("RANK", "0") == "0":
        logger.info(f"note: {run_dir} holds a run that did not start from a checkpoint; resuming it as it is "
                    "(train.init_from applies only to a new run)")  # under torchrun, rank 0 speaks for all
    model = config.model
    if run.train.init_from is not None:
        merged, differences, _ = model_from_parent(config.model, run.model)
        model = config.model if differences else merged
    fields = ("init_from", "init_keep_optimizer", "init_sha256")
    train = dataclasses.replace(config.train, **{k: getattr(run.train, k) for k in fields})
    return dataclasses.replace(config, model=model, train=train)

"""THE checkpoint module: the format, reading it (with its checks), writing it, and upgrading older files.

A checkpoint is a ``torch.save`` dict of tensors and plain data only, loaded with ``weights_only=True`` so
that loading never executes code from the file:

    format_version   :data:`CHECKPOINT_FORMAT` (older files are upgraded as they load: :func:`upgrade`)
    mtkit_version    str
    config           the resolved Config as plain data (a multilingual model's pairs: data.pairs)
    model            the raw (uncompiled, unwrapped) model state_dict; the names are mtkit.model's
                     (:mod:`mtkit.model_spec` lists them), layer norms named by the sub-layer they serve
    vocab            {"src": bytes, "tgt": bytes | None}: the SentencePiece model(s); an imported model's
                     also "pieces": {"src": [str], "tgt": [str] | None}, its id -> piece table(s)
    vocab_sha256     {"src": hex, "tgt": hex | None} of the vocab bytes
    src_vocab_size, tgt_vocab_size
    step, epoch      training position (in averaged checkpoints: the last averaged one's step)
    optimizer, scheduler, scaler, rng, sampler, ...   training state for exact resume (mtkit.training.state)
    data_fingerprint the prepared data's manifest fingerprint, or None (training checkpoints)
    averaged_from    the averaged files (averaged checkpoints only)
    ema              the moving average of the weights (float32, by tensor name) of a training with
                     train.ema_decay; ema.pt, that average as a model, also holds ema_decay
    imported_from    where an imported model came from (imported checkpoints only)

:func:`model_payload` builds the fields every checkpoint has, :func:`save_checkpoint` writes one
atomically; training, ``average`` and the importers all write through them, and every reader (inference,
resuming, fine-tuning, averaging, the exporters) loads through :func:`load_checkpoint`.

Before torch sees a file, it is read without torch (:mod:`mtkit.checkpoints.file`: bounded work,
nothing run) and its fields are type-checked; :func:`precheck` also checks its config against its tensors'
names and shapes, before torch is imported. A run directory holds ``checkpoints/step_NNNNNNN.pt`` files,
``last.pt``, ``best.pt`` and ``averaged.pt``; :func:`resolve_checkpoint` picks the one a command uses.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtkit.checkpoints.file import read_payload
from mtkit.config import config_from_dict
from mtkit.data.vocab import Vocab
from mtkit.errors import MtkitError, shown
from mtkit.io import atomic_path
from mtkit.model_spec import parameter_shapes
from mtkit.version import __version__

logger = logging.getLogger(__name__)

# 1: layer norms named by position (``encoder.layers.N.sublayer.J.norm``); 2: by the sub-layer they serve.
CHECKPOINT_FORMAT = 2
STEP_PATTERN = re.compile(r"^step_(\d+)\.pt$")
REQUIRED_KEYS = ("config", "model", "vocab", "src_vocab_size", "tgt_vocab_size")
# No tensor holds the size of a sinusoid table (two of max_positions × d_model floats, built at load):
# a larger max_positions than this is refused as implausible rather than allocated.
MAX_POSITIONS = 1 << 16
# A SentencePiece model of 256k pieces is ~5 MB; its bytes go to SentencePiece's parser (C++) whole,
# so a checkpoint's are held to this before they are handed over.
MAX_SPM_BYTES = 32 << 20


def load_checkpoint(path: str | Path, map_location: str = "cpu", mmap: bool = False,
                    checked: Checked | None = None) -> dict:
    """Load a checkpoint file (``weights_only=True``); user errors become one-line MtkitErrors,
    among them a file without one of :data:`REQUIRED_KEYS` or with a field of the wrong type.
    ``mmap``: tensors stay on disk until read, for a caller that wants only the config or vocabulary
    of a large checkpoint.

    torch sees only a file that :func:`~mtkit.checkpoints.file.read_payload` has read first, in
    bounded work and without torch (a regular file, a zip archive of stored entries, a pickle of plain
    data and tensors that fit their storages), so that torch.load's own work is bounded as well; once:
    ``checked`` says :func:`precheck` read this very file, unchanged since.
    """
    path = Path(path)
    if not _unchanged(path, checked):
        check_fields(read_payload(path), path)
    import torch

    with warnings.catch_warnings():
        # A pickle of protocol 4 that passed the reading above loads; torch's note on it is no user's concern.
        warnings.filterwarnings("ignore", message="Detected pickle protocol")
        try:
            ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
        except Exception as e:  # a file that changed since it was read, or a layout torch reads otherwise
            raise MtkitError(f"{path}: not a readable mtkit checkpoint ({type(e).__name__})") from None
    check_fields(ckpt, path)
    return upgrade(ckpt)


def _unchanged(path: Path, checked: Checked | None) -> bool:
    """Whether ``checked`` is :func:`precheck`'s reading of ``path`` as the file is now."""
    return (checked is not None and checked.identity is not None and checked.path == path
            and checked.identity == _identity(path))


def check_fields(ckpt: Any, path: str | Path) -> None:
    """The keys and types of what loading a checkpoint reads (the config: :func:`checkpoint_config`)."""
    if not isinstance(ckpt, dict) or "format_version" not in ckpt:
        raise MtkitError(f"{path}: not an mtkit checkpoint (no format_version)")
    version = ckpt["format_version"]
    if type(version) is not int or version < 1:
        raise MtkitError(f"{path}: its format_version must be a positive integer, got {shown(version)}")
    if version > CHECKPOINT_FORMAT:
        raise MtkitError(f"{path}: checkpoint format {version} is newer than this mtkit "
                         f"understands ({CHECKPOINT_FORMAT}); upgrade mtkit")
    for key in REQUIRED_KEYS:
        if key not in ckpt:
            raise MtkitError(f"{path}: not a complete mtkit checkpoint (no '{key}')")
    vocab = ckpt["vocab"]
    if not isinstance(vocab, dict) or not isinstance(vocab.get("src"), bytes):
        raise MtkitError(f"{path}: not a complete mtkit checkpoint (no 'vocab.src' SentencePiece model)")
    if not isinstance(ckpt["model"], dict):
        raise MtkitError(f"{path}: not a complete mtkit checkpoint ('model' is not a state_dict)")
    if bad := next((k for k in ckpt["model"] if not isinstance(k, str)), None):
        raise MtkitError(f"{path}: its model holds {shown(bad)}, which is not a tensor name")
    for key in ("src", "tgt"):
        model = vocab.get(key)
        if model is not None and not isinstance(model, bytes):
            raise MtkitError(f"{path}: its vocab.{key} must be a SentencePiece model's bytes, got {shown(model)}")
        if model is not None and len(model) > MAX_SPM_BYTES:
            raise MtkitError(f"{path}: its vocab.{key} is {len(model):,} bytes, more than the "
                             f"{MAX_SPM_BYTES >> 20} MiB of a SentencePiece model")
    for key in ("src_vocab_size", "tgt_vocab_size"):
        size = ckpt[key]
        if type(size) is not int or size < 1:
            raise MtkitError(f"{path}: {key} must be a positive integer, got {shown(size)}")
    pieces = vocab.get("pieces")
    if pieces is not None:
        if not isinstance(pieces, dict):
            raise MtkitError(f"{path}: its vocab.pieces must be a mapping of piece tables, got {shown(pieces)}")
        for key, size in (("src", ckpt["src_vocab_size"]), ("tgt", ckpt["tgt_vocab_size"])):
            table = pieces.get(key)
            if key == "tgt" and table is None:
                table, key = pieces.get("src"), "src"  # one table for both sides
            if not isinstance(table, list) or not all(isinstance(p, str) for p in table):
                raise MtkitError(f"{path}: its vocab.pieces.{key} must be a list of pieces, got {shown(table)}")
            if len(table) != size:
                raise MtkitError(f"{path}: its vocab.pieces.{key} has {len(table):,} pieces, its vocabulary "
                                 f"{size:,} ids")
    for key, kind, ok in (("step", "an integer", lambda v: type(v) is int),
                          ("ema", "a mapping of tensor names", lambda v: isinstance(v, dict) and all(
                              isinstance(k, str) for k in v)),
                          ("averaged_from", "a list of paths",
                           lambda v: isinstance(v, list) and all(isinstance(p, str) for p in v))):
        if ckpt.get(key) is not None and not ok(ckpt[key]):
            raise MtkitError(f"{path}: its {key} must be {kind}, got {shown(ckpt[key])}")


# ------------------------------------------------------------------ upgrading

# Format 1 named each layer's norms by position: a sub-layer's index in its layer -> its name since format 2.
_FORMAT1_NORM = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.sublayer\.(\d+)\.norm\.(weight|bias)$")
_FORMAT1_SUBLAYERS = {"encoder": ("self_attn", "feed_forward"), "decoder": ("self_attn", "cross_attn", "feed_forward")}


def _format2_name(name: str) -> str:
    """``decoder.layers.0.sublayer.1.norm.weight`` -> ``decoder.layers.0.cross_attn_norm.weight``; other
    names (and an index no layer has, which the weights' check then refuses) unchanged."""
    m = _FORMAT1_NORM.match(name)
    if m is None:
        return name
    side, layer, index, tensor = m.groups()
    sublayers = _FORMAT1_SUBLAYERS[side]
    if int(index) >= len(sublayers):
        return name
    return f"{side}.layers.{layer}.{sublayers[int(index)]}_norm.{tensor}"


def upgrade(ckpt: dict) -> dict:
    """Bring a checkpoint that :func:`check_fields` passed to :data:`CHECKPOINT_FORMAT`, in place (works on
    the torch-free reading's payload too), and return it. The parameters keep their order, so that a
    training's optimizer state (kept by parameter index) still fits the model it resumes."""
    if ckpt["format_version"] == 1:
        ckpt["model"] = {_format2_name(name): tensor for name, tensor in ckpt["model"].items()}
        ckpt["format_version"] = 2
    return ckpt


# ------------------------------------------------------------------ writing

# torch.save reports a failed write to a path as a RuntimeError ("unexpected pos 704 vs 598",
# "PytorchStreamWriter failed writing file ..."), not as the OSError beneath it.
_WRITE_FAILURE = re.compile(r"unexpected pos|fail\w* writ|write fail", re.IGNORECASE)


def vocab_entry(vocab) -> dict:
    """A :class:`mtkit.data.vocab.Vocab` as a checkpoint's ``vocab`` field."""
    src, tgt = vocab.model_bytes()
    pieces = vocab.pieces()
    return {"src": src, "tgt": tgt, **({"pieces": pieces} if pieces is not None else {})}


def vocab_sha256(vocab: dict) -> dict:
    """SHA-256 (hex) of a checkpoint's ``vocab`` bytes: ``{"src": …, "tgt": … | None}``."""
    return {side: hashlib.sha256(vocab[side]).hexdigest() if vocab.get(side) is not None else None
            for side in ("src", "tgt")}


def model_payload(config: dict, state: dict, vocab: dict, src_vocab_size: int, tgt_vocab_size: int,
                  **more: Any) -> dict:
    """The fields every checkpoint has, in this format: ``config`` (plain data,
    :func:`mtkit.config.config_to_dict`), the model's ``state`` (its names mtkit.model's), ``vocab``
    (:func:`vocab_entry`) and its sizes; ``more``: a training's state, ``averaged_from``, ``imported_from``."""
    return {"format_version": CHECKPOINT_FORMAT, "mtkit_version": __version__, "config": config, "model": state,
            "vocab": vocab, "vocab_sha256": vocab_sha256(vocab), "src_vocab_size": src_vocab_size,
            "tgt_vocab_size": tgt_vocab_size, **more}


def save_checkpoint(payload: dict, path: str | Path) -> Path:
    """Write ``payload`` (:func:`model_payload`'s) to ``path`` atomically (temporary file, fsync, rename).

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
                if stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # a device written through (-o /dev/null): no fsync
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


# ------------------------------------------------------------------ reading: the config and the weights


def checkpoint_config(ckpt: dict, path: str | Path):
    """The checkpoint's Config; a config that no longer passes the checks, or whose sizes its tensors
    do not have (:func:`check_config_fits_weights`), names the file."""
    if not isinstance(ckpt["config"], dict):
        raise MtkitError(f"{path}: its config is not a mapping (got {type(ckpt['config']).__name__})")
    try:
        config = config_from_dict(ckpt["config"])
    except MtkitError as e:
        raise MtkitError(f"{path}: its config: {e}") from None
    check_config_fits_weights(config.model, ckpt["model"], ckpt["src_vocab_size"], ckpt["tgt_vocab_size"], path)
    return config


def _payload_without_torch(path: Path) -> Any:
    """The checkpoint's payload with each tensor as a :class:`~mtkit.checkpoints.file.Tensor`
    (its shape, no data), read without torch and without running code, in bounded work
    (mtkit.checkpoints.file); a file that is not so readable raises the one-line MtkitError."""
    return read_payload(path)


def stored_config(path: str | Path):
    """The Config stored in a checkpoint (file or run directory), read without torch in bounded work and
    checked as :func:`precheck` checks it."""
    return _checked(resolve_checkpoint(path, note=False)).config


@dataclass(frozen=True)
class Checked:
    """A checkpoint file that :func:`precheck` has read in bounded work and checked: its path, the identity of
    the file it read (device, inode, size, modification time) and its config. :func:`load_model` given it
    loads that file, unchanged since, without reading and checking it a second time."""

    path: Path
    identity: tuple[int, int, int, int] | None
    config: Any


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    """The file's device, inode, size and modification time (None: not to be had; never matches)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _checked(path: Path) -> Checked:
    identity = _identity(path)  # before the reading: a file replaced during it is read again at the loading
    payload = _payload_without_torch(path)
    check_fields(payload, path)
    return Checked(path, identity, checkpoint_config(upgrade(payload), path))


def precheck(path: str | Path) -> Checked | None:
    """Refuse a checkpoint (file or run directory) that is not readable in bounded work, lacks a field, or
    whose config its tensors do not fit (:func:`check_config_fits_weights`) before torch is even
    imported, so that such a file fails at once; what it checked (:class:`Checked`, for :func:`load_model`).
    A missing one is left to the loading (whose error comes after the flags' checks): None."""
    try:
        return _checked(resolve_checkpoint(path, note=False))
    except _Missing:  # the loading says it
        return None


def layer_count(names, side: str) -> int:
    """How many ``{side}.layers.N.`` layers the tensor names ``names`` hold (the largest N + 1)."""
    pattern = re.compile(rf"^{side}\.layers\.(\d+)\.")
    found = [int(m.group(1)) for name in names if (m := pattern.match(name))]
    return max(found) + 1 if found else 0


def check_config_fits_weights(model_cfg, state: dict, src_vocab_size: Any, tgt_vocab_size: Any,
                              path: str | Path) -> None:
    """Refuse a model config whose sizes the tensors of ``state`` do not have, before a model of
    those sizes is built: a config saying 100000000 layers over weights of one would otherwise
    allocate until the machine runs out of memory. Reads shapes only (an mmap-loaded state is not read).

    First the sizes, each against a tensor that has it, for a message that names the key: ``d_model``,
    the vocabulary sizes, the layer counts, ``d_ff`` and, with learned positions, ``max_positions``;
    sinusoidal positions have no tensor, so ``max_positions`` is held to :data:`MAX_POSITIONS`. (``h``
    divides ``d_model``: the config's own check.) Then every tensor the config implies
    (:func:`mtkit.model_spec.parameter_shapes`) must be there with its shape, and no other: the model
    then built holds what the file holds (whose tensors hold no more than their storages' bytes,
    mtkit.checkpoints.file).
    """
    for key, size in (("src_vocab_size", src_vocab_size), ("tgt_vocab_size", tgt_vocab_size)):
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise MtkitError(f"{path}: {key} must be a positive integer, got {shown(size)}")

    def shape(name: str) -> tuple:
        """The tensor's shape; a missing one is refused here, as the model would be built without it."""
        s = getattr(state.get(name), "shape", None)
        if s is None:
            raise MtkitError(f"{path}: its weights do not fit its config: no '{name}'")
        return tuple(s)

    def refuse(key: str, value: int, name: str, has: tuple) -> None:
        raise MtkitError(f"{path}: its config's {key} is {shown(value)} but its weights have {name} of "
                         f"{' × '.join(map(str, has))}")

    m = model_cfg
    src = shape("encoder.embeddings.tokens.weight")
    if len(src) != 2 or src[1] != m.d_model:
        refuse("model.d_model", m.d_model, "encoder.embeddings.tokens.weight", src)
    if src[0] != src_vocab_size:
        raise MtkitError(f"{path}: its src_vocab_size is {shown(src_vocab_size)} but its weights have "
                         f"encoder.embeddings.tokens.weight of {src[0]} × {src[1]}")
    out = shape("output_projection.weight")
    if len(out) != 2 or out[0] != tgt_vocab_size:
        raise MtkitError(f"{path}: its tgt_vocab_size is {shown(tgt_vocab_size)} but its weights have "
                         f"output_projection.weight of {' × '.join(map(str, out))}")
    if m.share_embeddings == "all" and src_vocab_size != tgt_vocab_size:
        raise MtkitError(f"{path}: its config's model.share_embeddings is 'all' but its src_vocab_size "
                         f"{src_vocab_size} and tgt_vocab_size {tgt_vocab_size} differ")
    for side in ("encoder", "decoder"):
        n, want = layer_count(state, side), getattr(m, f"{side}_layers")
        if n != want:
            raise MtkitError(f"{path}: its config's model.{side}_layers is {shown(want)} but its weights have "
                             f"{shown(n)} {side} layer" + ("" if n == 1 else "s"))
        w_1 = shape(f"{side}.layers.0.feed_forward.w_1.weight")
        if len(w_1) != 2 or w_1[0] != m.d_ff:
            refuse("model.d_ff", m.d_ff, f"{side}.layers.0.feed_forward.w_1.weight", w_1)
    if m.positions == "learned" and (table := shape("encoder.embeddings.positions.weight"))[0] != m.max_positions:
        refuse("model.max_positions", m.max_positions, "encoder.embeddings.positions.weight", table)
    if m.positions == "sinusoidal" and m.max_positions > MAX_POSITIONS:
        raise MtkitError(f"{path}: its config's model.max_positions is {shown(m.max_positions)}, more than the "
                         f"{MAX_POSITIONS} positions mtkit builds a sinusoid table for")
    # The layer counts now match the file's, so that the table is as long as the file's list of names.
    _refuse_misfits(parameter_shapes(m, src_vocab_size, tgt_vocab_size), state, path)


def _refuse_misfits(expected: dict[str, tuple], state: dict, path: str | Path) -> None:
    """Refuse ``state`` unless it has exactly the tensor names and shapes of ``expected`` (one line, where
    ``load_state_dict`` would print every mismatch over dozens of lines)."""
    problems = [f"no '{k}'" for k in expected if k not in state]
    problems += [f"an unexpected {shown(k)}" for k in state if k not in expected]
    problems += [
        f"'{k}' is {shown(tuple(getattr(state[k], 'shape', ())))} where the config makes it {v}"
        for k, v in expected.items()
        if k in state and tuple(getattr(state[k], "shape", ())) != v
    ]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise MtkitError(f"{path}: its weights do not fit its config: {problems[0]}{more}")


def check_weights_fit(model, state: dict, path: str | Path) -> None:
    """Refuse ``state`` unless it has exactly ``model``'s tensor names and shapes (training's check of a
    run's own checkpoint against the model it builds)."""
    _refuse_misfits({k: tuple(v.shape) for k, v in model.state_dict().items()}, state, path)


def stored_step(path: Path) -> int | None:
    """The ``step`` a checkpoint file records, read without torch (None if unknown or unreadable)."""
    try:
        ckpt = read_payload(path)
    except MtkitError:  # unreadable: whoever loads it reports why
        return None
    if not isinstance(ckpt, dict):
        return None
    if type(ckpt.get("step")) is int:
        return ckpt["step"]
    sources = ckpt.get("averaged_from")  # averaged files written before they recorded a step
    m = STEP_PATTERN.match(Path(sources[-1]).name) if isinstance(sources, list) and sources and isinstance(
        sources[-1], str) else None
    return int(m.group(1)) if m else None


def step_checkpoints(run_dir: str | Path) -> list[Path]:
    """The run's ``step_N.pt`` files, oldest first."""
    ckpt_dir = Path(run_dir) / "checkpoints"
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := STEP_PATTERN.match(p.name))]
    return [p for _, p in sorted(found)]


def step_of(path: Path) -> int:
    """The step in a ``step_N.pt`` file name."""
    m = STEP_PATTERN.match(path.name)
    assert m is not None, path
    return int(m.group(1))


AVERAGED_FILE = "averaged.pt"  # a run's average of its last checkpoints (train.average_last, mtkit average)
EMA_FILE = "ema.pt"  # a run's moving average of its weights (train.ema_decay), written at the end of training


def is_hugging_face_folder(path: str | Path) -> bool:
    """Whether ``path`` is a Marian model in the Hugging Face layout (its config.json and source.spm): an
    OPUS-MT model, or a folder ``mtkit export hf`` wrote; ``mtkit import marian`` reads it."""
    path = Path(path)
    return path.is_dir() and (path / "config.json").is_file() and (path / "source.spm").exists()


def resolve_checkpoint(path: str | Path, note: bool = True) -> Path:
    """A checkpoint file, or a run directory: its averaged checkpoint (``average_last``), else the moving
    average of its weights (``ema.pt``, ``train.ema_decay``), else its best, else its last checkpoint.

    An ``averaged.pt`` or ``ema.pt`` older than the run's newest checkpoint (training went on after it) is
    passed over, with a note on stderr (``note``).
    """
    path = Path(path)
    if path.is_dir():
        ckpt_dir = path / "checkpoints"
        steps = step_checkpoints(path)
        fallback = next((c for c in (ckpt_dir / "best.pt", ckpt_dir / "last.pt", *steps[-1:]) if c.is_file()), None)
        newest = step_of(steps[-1]) if steps else None
        pick, stale = fallback, []
        for made, what, refresh in ((ckpt_dir / AVERAGED_FILE, "averages up to", "run mtkit average to refresh"),
                                    (ckpt_dir / EMA_FILE, "is the moving average at", "training writes it at its end")):
            if not made.is_file():
                continue
            upto = stored_step(made) if newest is not None else None
            if fallback is None or newest is None or upto is None or upto >= newest:
                pick = made
                break
            stale.append(f"{made} {what} step {upto}, older than step {newest}; using {{}} ({refresh})")
        if pick is not None:
            for said in stale if note else []:
                logger.info("note: " + said.format(pick.name))
            return pick
        if is_hugging_face_folder(path):
            made = "written by mtkit export hf" if (path / "mtkit.json").is_file() else "(Marian, OPUS-MT)"
            raise _Missing(f"{path}: a Hugging Face model folder {made}, not an mtkit checkpoint or run "
                           f"directory: mtkit.load and mtkit.pipeline load it as it is; for the commands, import it "
                           f"first: mtkit import marian {path} -o RUN")
        raise _Missing(f"{path}: no checkpoint in this run directory (expected checkpoints/last.pt)")
    try:
        mode = os.stat(path).st_mode  # symlinks followed
    except FileNotFoundError:
        raise _Missing(f"{path}: no such checkpoint or run directory") from None
    except OSError as e:
        raise MtkitError(f"{path}: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):  # a FIFO would hang the reading, /dev/zero never end it
        raise MtkitError(f"{path}: not a regular file")
    return path


class _Missing(MtkitError):
    """No such checkpoint or run directory, or none in a run directory: said by the loading, after the
    checks of the flags (:func:`precheck` lets it pass)."""


@dataclass
class LoadedModel:
    """What a checkpoint alone is enough for: the model, its vocabulary and its config."""

    model: Any  # mtkit.model.Transformer
    vocab: Any  # mtkit.data.vocab.Vocab
    config: Any  # mtkit.config.Config
    path: Path
    step: int | None = None  # the training step (an average's: its last checkpoint's)


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


def check_one_vocabulary(loaded: list) -> None:
    """Refuse loaded models (``.vocab``, ``.path``) whose vocabularies differ: an ensemble averages
    distributions over one id table."""
    first = loaded[0]
    for other in loaded[1:]:
        if other.vocab.model_bytes() != first.vocab.model_bytes():
            raise MtkitError(f"{getattr(other, 'path', 'a model')}: an ensemble needs one vocabulary, "
                             f"and it differs from {getattr(first, 'path', 'the first model')}'s")


def describe(loaded: LoadedModel) -> str:
    """``RUN/checkpoints/best.pt (step 600)``: which weights a command uses, for its log line."""
    return f"{loaded.path} (step {loaded.step})" if loaded.step is not None else str(loaded.path)


def load_model(path: str | Path, device: str = "cpu", checked: Checked | None = None) -> LoadedModel:
    """Build the model of a checkpoint (file or run directory) in eval mode on ``device``; ``checked``: what
    :func:`precheck` made of it (its file, unchanged since, is neither read nor checked again).

    Prints nothing (but :func:`resolve_checkpoint`'s note); callers log :func:`describe`.
    """
    from mtkit.model import Transformer

    path = resolve_checkpoint(path)
    ckpt = load_checkpoint(path, checked=checked)
    config = checked.config if _unchanged(path, checked) else checkpoint_config(ckpt, path)
    # checkpoint_config has checked every name and shape the model will have (mtkit.model_spec).
    model = Transformer(config.model, ckpt["src_vocab_size"], ckpt["tgt_vocab_size"], kernels=config.kernels,
                        initialize=False)  # every weight is loaded next
    model.load_state_dict(ckpt["model"])
    model.to(device).eval()
    vocab = Vocab.from_bytes(ckpt["vocab"]["src"], ckpt["vocab"].get("tgt"), ckpt["vocab"].get("pieces"))
    step = ckpt.get("step")
    return LoadedModel(model=model, vocab=vocab, config=config, path=path, step=step if isinstance(step, int) else None)

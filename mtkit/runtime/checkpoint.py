"""Reading checkpoints: the checks, a run directory's checkpoint, and the model a checkpoint alone describes.

A checkpoint is a ``torch.save`` dict of tensors and plain data only, loaded with
``weights_only=True`` so that loading never executes code from the file (the keys:
:mod:`mtkit.training.checkpoint`, which writes them). A run directory holds
``checkpoints/step_NNNNNNN.pt`` files, ``last.pt``, ``best.pt`` and ``averaged.pt``;
:func:`resolve_checkpoint` picks the one a command uses.

Training and inference both load through here; saving stays with training.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtkit.errors import MtkitError

CHECKPOINT_FORMAT = 1
STEP_PATTERN = re.compile(r"^step_(\d+)\.pt$")
REQUIRED_KEYS = ("config", "model", "vocab", "src_vocab_size", "tgt_vocab_size")
# No tensor holds the size of a sinusoid table (two of max_positions × d_model floats, built at load):
# a larger max_positions than this is refused as implausible rather than allocated.
MAX_POSITIONS = 1 << 16


def load_checkpoint(path: str | Path, map_location: str = "cpu", mmap: bool = False) -> dict:
    """Load a checkpoint file (``weights_only=True``); user errors become one-line MtkitErrors,
    among them a file without one of :data:`REQUIRED_KEYS`. ``mmap``: tensors stay on disk until
    read, for a caller that wants only the config or vocabulary of a large checkpoint."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise MtkitError(f"{path}: no such checkpoint")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # a truncated or foreign file
        raise MtkitError(f"{path}: not a readable mtkit checkpoint ({type(e).__name__})") from None
    if not isinstance(ckpt, dict) or "format_version" not in ckpt:
        raise MtkitError(f"{path}: not an mtkit checkpoint (no format_version)")
    if ckpt["format_version"] > CHECKPOINT_FORMAT:
        raise MtkitError(
            f"{path}: checkpoint format {ckpt['format_version']} is newer than this mtkit "
            f"understands ({CHECKPOINT_FORMAT}); upgrade mtkit"
        )
    for key in REQUIRED_KEYS:
        if key not in ckpt:
            raise MtkitError(f"{path}: not a complete mtkit checkpoint (no '{key}')")
    if not isinstance(ckpt["vocab"], dict) or not isinstance(ckpt["vocab"].get("src"), bytes):
        raise MtkitError(f"{path}: not a complete mtkit checkpoint (no 'vocab.src' SentencePiece model)")
    if not isinstance(ckpt["model"], dict):
        raise MtkitError(f"{path}: not a complete mtkit checkpoint ('model' is not a state_dict)")
    return ckpt


def checkpoint_config(ckpt: dict, path: str | Path):
    """The checkpoint's Config; a config that no longer passes the checks, or whose sizes its tensors
    do not have (:func:`check_config_fits_weights`), names the file."""
    from mtkit.config import config_from_dict

    if not isinstance(ckpt["config"], dict):
        raise MtkitError(f"{path}: its config is not a mapping (got {type(ckpt['config']).__name__})")
    try:
        config = config_from_dict(ckpt["config"])
    except MtkitError as e:
        raise MtkitError(f"{path}: its config: {e}") from None
    check_config_fits_weights(config.model, ckpt["model"], ckpt["src_vocab_size"], ckpt["tgt_vocab_size"], path)
    return config


class _Shape(tuple):
    """A tensor of a checkpoint read without torch: its shape alone."""

    @property
    def shape(self) -> tuple:
        return tuple(self)


class _Inert:
    """Whatever else a checkpoint's pickle names (storages, dtypes, NumPy states): built from nothing,
    so that reading the pickle runs no code of any module."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __setstate__(self, state) -> None:
        pass


def _payload_without_torch(path: Path) -> Any:
    """The checkpoint's payload with each tensor as its :class:`_Shape`, read from the zip's ``data.pkl``
    without torch and without running code (nothing but containers and shapes is built); None when the
    file is not laid out so (``torch.load`` then decides) or its pickle is larger than a payload's."""
    import collections
    import io
    import pickle
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
            if len(names) != 1 or archive.getinfo(names[0]).file_size > 64 << 20:
                return None
            data = archive.read(names[0])
    except (OSError, zipfile.BadZipFile, KeyError, RuntimeError):
        return None

    def tensor(storage, offset, size, *rest) -> _Shape:
        return _Shape(int(n) for n in size)

    class Reader(pickle.Unpickler):
        def find_class(self, module: str, name: str):
            if module == "torch._utils" and name.startswith("_rebuild_tensor"):
                return tensor
            if module == "torch._utils" and name == "_rebuild_parameter":
                return lambda data, *rest: data
            if (module, name) == ("collections", "OrderedDict"):
                return collections.OrderedDict
            return _Inert

        def persistent_load(self, pid):
            return None

    try:
        return Reader(io.BytesIO(data)).load()
    except Exception:  # noqa: BLE001 - a layout this reader does not know: torch.load decides
        return None


def precheck(path: str | Path) -> None:
    """Refuse a checkpoint (file or run directory) whose config its tensors do not fit
    (:func:`check_config_fits_weights`) before torch is even imported, so that such a file fails at
    once; a file this cheap reading cannot make out is left to :func:`load_checkpoint`."""
    try:
        path = resolve_checkpoint(path, note=False)  # the loading says it
    except MtkitError:  # no such file: said by the loading, after the flags' checks
        return
    payload = _payload_without_torch(path)
    if not isinstance(payload, dict) or not all(k in payload for k in REQUIRED_KEYS):
        return
    if isinstance(payload["model"], dict) and isinstance(payload["config"], dict):
        checkpoint_config(payload, path)


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

    Checked against the tensors: ``d_model``, the vocabulary sizes, the layer counts, ``d_ff`` and, with
    learned positions, ``max_positions``; sinusoidal positions have no tensor, so ``max_positions`` is
    held to :data:`MAX_POSITIONS`. (``h`` divides ``d_model``: the config's own check.)
    """
    for key, size in (("src_vocab_size", src_vocab_size), ("tgt_vocab_size", tgt_vocab_size)):
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise MtkitError(f"{path}: {key} must be a positive integer, got {size!r}")

    def shape(name: str) -> tuple:
        """The tensor's shape; a missing one is refused here, as the model would be built without it."""
        s = getattr(state.get(name), "shape", None)
        if s is None:
            raise MtkitError(f"{path}: its weights do not fit its config: no '{name}'")
        return tuple(s)

    def refuse(key: str, value: int, name: str, has: tuple) -> None:
        raise MtkitError(f"{path}: its config's {key} is {value} but its weights have {name} of "
                         f"{' × '.join(map(str, has))}")

    m = model_cfg
    src = shape("encoder.embeddings.tokens.weight")
    if len(src) != 2 or src[1] != m.d_model:
        refuse("model.d_model", m.d_model, "encoder.embeddings.tokens.weight", src)
    if src[0] != src_vocab_size:
        raise MtkitError(f"{path}: its src_vocab_size is {src_vocab_size} but its weights have "
                         f"encoder.embeddings.tokens.weight of {src[0]} × {src[1]}")
    out = shape("output_projection.weight")
    if len(out) != 2 or out[0] != tgt_vocab_size:
        raise MtkitError(f"{path}: its tgt_vocab_size is {tgt_vocab_size} but its weights have "
                         f"output_projection.weight of {' × '.join(map(str, out))}")
    if m.share_embeddings == "all" and src_vocab_size != tgt_vocab_size:
        raise MtkitError(f"{path}: its config's model.share_embeddings is 'all' but its src_vocab_size "
                         f"{src_vocab_size} and tgt_vocab_size {tgt_vocab_size} differ")
    for side in ("encoder", "decoder"):
        n, want = layer_count(state, side), getattr(m, f"{side}_layers")
        if n != want:
            raise MtkitError(f"{path}: its config's model.{side}_layers is {want} but its weights have "
                             f"{n} {side} layer" + ("" if n == 1 else "s"))
        w_1 = shape(f"{side}.layers.0.feed_forward.w_1.weight")
        if len(w_1) != 2 or w_1[0] != m.d_ff:
            refuse("model.d_ff", m.d_ff, f"{side}.layers.0.feed_forward.w_1.weight", w_1)
    if m.positions == "learned" and (table := shape("encoder.embeddings.positions.weight"))[0] != m.max_positions:
        refuse("model.max_positions", m.max_positions, "encoder.embeddings.positions.weight", table)
    if m.positions == "sinusoidal" and m.max_positions > MAX_POSITIONS:
        raise MtkitError(f"{path}: its config's model.max_positions is {m.max_positions}, more than the "
                         f"{MAX_POSITIONS} positions mtkit builds a sinusoid table for")


def check_weights_fit(model, state: dict, path: str | Path) -> None:
    """Refuse ``state`` unless it has exactly ``model``'s tensor names and shapes (one line, where
    ``load_state_dict`` would print every mismatch over dozens of lines)."""
    expected = model.state_dict()
    problems = [f"no '{k}'" for k in expected if k not in state]
    problems += [f"an unexpected '{k}'" for k in state if k not in expected]
    problems += [
        f"'{k}' is {tuple(getattr(state[k], 'shape', ()))} where the config makes it {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and getattr(state[k], "shape", None) != v.shape
    ]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise MtkitError(f"{path}: its weights do not fit its config: {problems[0]}{more}")


def stored_step(path: Path) -> int | None:
    """The ``step`` a checkpoint file records, read without loading its tensors (None if unknown)."""
    import torch

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # unreadable: whoever loads it reports why
        return None
    if not isinstance(ckpt, dict):
        return None
    if isinstance(ckpt.get("step"), int):
        return ckpt["step"]
    sources = ckpt.get("averaged_from") or []  # averaged files written before they recorded a step
    m = STEP_PATTERN.match(Path(sources[-1]).name) if sources else None
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


def resolve_checkpoint(path: str | Path, note: bool = True) -> Path:
    """A checkpoint file, or a run directory (its averaged, else best, else last checkpoint).

    A run's ``averaged.pt`` that averages only checkpoints older than the run's newest
    (training went on after ``mtkit average``) is passed over, with a note on stderr (``note``).
    """
    path = Path(path)
    if path.is_dir():
        ckpt_dir = path / "checkpoints"
        steps = step_checkpoints(path)
        fallback = next((c for c in (ckpt_dir / "best.pt", ckpt_dir / "last.pt", *steps[-1:]) if c.is_file()), None)
        averaged = ckpt_dir / "averaged.pt"
        if averaged.is_file():
            newest = step_of(steps[-1]) if steps else None
            upto = stored_step(averaged) if newest is not None else None
            if fallback is None or newest is None or upto is None or upto >= newest:
                return averaged
            if note:
                print(f"note: {averaged} averages up to step {upto}, older than step {newest}; using "
                      f"{fallback.name} (run mtkit average to refresh)", file=sys.stderr)
            return fallback
        if fallback is not None:
            return fallback
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
    step: int | None = None  # the training step (an average's: its last checkpoint's)


def describe(loaded: LoadedModel) -> str:
    """``RUN/checkpoints/best.pt (step 600)``: which weights a command uses, for its log line."""
    return f"{loaded.path} (step {loaded.step})" if loaded.step is not None else str(loaded.path)


def load_model(path: str | Path, device: str = "cpu") -> LoadedModel:
    """Build the model of a checkpoint (file or run directory) in eval mode on ``device``.

    Prints nothing (but :func:`resolve_checkpoint`'s note); callers log :func:`describe`.
    """
    from mtkit.data.vocab import Vocab
    from mtkit.model import Transformer

    path = resolve_checkpoint(path)
    ckpt = load_checkpoint(path)
    config = checkpoint_config(ckpt, path)
    model = Transformer(config.model, ckpt["src_vocab_size"], ckpt["tgt_vocab_size"], kernels=config.kernels)
    check_weights_fit(model, ckpt["model"], path)
    model.load_state_dict(ckpt["model"])
    model.to(device).eval()
    vocab = Vocab.from_bytes(ckpt["vocab"]["src"], ckpt["vocab"].get("tgt"), ckpt["vocab"].get("pieces"))
    step = ckpt.get("step")
    return LoadedModel(model=model, vocab=vocab, config=config, path=path, step=step if isinstance(step, int) else None)

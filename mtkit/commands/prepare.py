"""``mtkit prepare``: clean the corpus, build the SentencePiece vocabulary and binarize it."""

from __future__ import annotations

from pathlib import Path

from mtkit.config import Config
from mtkit.data.prepare import prepare_data
from mtkit.errors import MtkitError


def checkpoint_vocab(path: str | Path) -> tuple:
    """The SentencePiece model(s) stored in a checkpoint, or in a run directory's checkpoint (picked as
    ``mtkit translate -m RUN`` picks it), for ``data.spm.vocab_from``; errors name the path. An imported
    model's piece table (``vocab.pieces``, mtkit.importers) comes third, as ``Vocab.from_bytes`` takes it."""
    from mtkit.runtime.checkpoint import load_checkpoint, resolve_checkpoint

    try:
        ckpt = load_checkpoint(resolve_checkpoint(path), mmap=True)  # its tensors are never read
    except MtkitError as e:
        raise MtkitError(f"data.spm.vocab_from: {e}") from None
    if ckpt["vocab"].get("pieces") is not None:
        return ckpt["vocab"]["src"], ckpt["vocab"].get("tgt"), ckpt["vocab"]["pieces"]
    return ckpt["vocab"]["src"], ckpt["vocab"].get("tgt")


def prepare(config: Config, out_dir: Path, force: bool = False, progress: bool | None = None) -> dict:
    """Prepare ``config.data`` into ``out_dir`` and return its manifest.

    Identical inputs reuse a complete earlier result unless ``force``. A rebuild (``force``
    or changed inputs) replaces ``out_dir`` only if it is empty or an earlier mtkit result
    holding nothing else; ``progress=None`` shows progress bars only when stderr is a
    terminal. With ``data.spm.vocab_from`` the data is encoded with that checkpoint's
    vocabulary, as a run that starts from it needs. User errors raise ``MtkitError``.
    """
    vocab_from = config.data.spm.vocab_from
    models = checkpoint_vocab(vocab_from) if vocab_from else None
    return prepare_data(config.data, Path(out_dir), force=force, progress=progress, vocab_models=models)

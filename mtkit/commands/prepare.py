"""``mtkit prepare``: clean the corpus, build the SentencePiece vocabulary and binarize it."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from mtkit.config import Config
from mtkit.data.prepare import prepare_data


def prepare(config: Config, out_dir: Path, force: bool = False, progress: Optional[bool] = None) -> dict:
    """Prepare ``config.data`` into ``out_dir`` and return its manifest.

    Identical inputs reuse a complete earlier result unless ``force``. A rebuild (``force``
    or changed inputs) replaces ``out_dir`` only if it is empty or an earlier mtkit result
    holding nothing else; ``progress=None`` shows progress bars only when stderr is a
    terminal. User errors raise ``MtkitError``.
    """
    return prepare_data(config.data, Path(out_dir), force=force, progress=progress)

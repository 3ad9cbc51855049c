"""A model given as a local folder or as a Hugging Face hub name (``owner/name``), the latter downloaded
through ``huggingface_hub`` into its cache and read from there. Each way it fails is one MtkitError line."""

from __future__ import annotations

import logging
from pathlib import Path

from mtkit.errors import MtkitError

logger = logging.getLogger(__name__)


def hub_folder(source: str, allow_patterns: list[str], example: str, extra: str) -> Path:
    """``source`` itself when it is a directory; otherwise the hub repository it names, its files matching
    ``allow_patterns`` downloaded. ``example``: a hub name for the message; ``extra``: the pip extra that
    brings huggingface_hub."""
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists() or source.count("/") != 1 or source.startswith((".", "/")):
        raise MtkitError(f"{source}: no such directory (nor a hub name such as {example})")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise MtkitError(f"{source}: not a directory; a hub name needs huggingface_hub "
                         f"(pip install 'mtkit[{extra}]')") from None
    logger.info(f"downloading {source} from the Hugging Face hub")
    try:
        return Path(snapshot_download(source, allow_patterns=allow_patterns))
    except Exception as e:  # noqa: BLE001 (no network, no such repository, no access: one line)
        why = (str(e).splitlines() or [""])[0][:160]
        raise MtkitError(f"{source}: download failed ({type(e).__name__}: {why})") from None

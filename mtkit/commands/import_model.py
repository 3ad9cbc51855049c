"""``mtkit import marian``: a Marian / OPUS-MT model (Hugging Face layout) as an mtkit run directory.

No torch at import time: this module is loaded when the CLI starts.
"""

from __future__ import annotations

import sys
from pathlib import Path


def marian_folder(source: str) -> Path:
    """``source`` itself when it is a directory; otherwise a hub name (``Helsinki-NLP/opus-mt-en-de``),
    downloaded through ``huggingface_hub`` into its cache and read from there."""
    from mtkit.errors import MtkitError
    from mtkit.importers.marian import WEIGHTS

    path = Path(source)
    if path.is_dir():
        return path
    if path.exists() or source.count("/") != 1 or source.startswith((".", "/")):
        raise MtkitError(f"{source}: no such directory (nor a hub name such as Helsinki-NLP/opus-mt-en-de)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise MtkitError(f"{source}: not a directory; a hub name needs huggingface_hub "
                         "(pip install 'mtkit[import]')") from None
    print(f"downloading {source} from the Hugging Face hub", file=sys.stderr)
    try:
        return Path(snapshot_download(source, allow_patterns=["*.json", "*.spm", *WEIGHTS]))
    except Exception as e:  # noqa: BLE001 (no network, no such repository, no access: one line)
        why = (str(e).splitlines() or [""])[0][:160]
        raise MtkitError(f"{source}: download failed ({type(e).__name__}: {why})") from None


def import_marian(source: str, out_dir: Path) -> None:
    """Convert the Marian model in ``source`` (a folder or a hub name) into the run directory ``out_dir``."""
    from mtkit.errors import MtkitError
    from mtkit.importers import write_run
    from mtkit.importers.marian import read_marian

    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):  # before any download
        raise MtkitError(f"{out_dir}: already exists and is not empty; remove it or choose another directory")
    imported = read_marian(marian_folder(source))
    out = write_run(imported, out_dir)
    m, d = imported.config.model, imported.config.decode
    print(f"imported {imported.source} to {out}: {m.encoder_layers}+{m.decoder_layers} layers, d_model {m.d_model}, "
          f"{m.activation}, vocabulary {imported.src_vocab_size}/{imported.tgt_vocab_size}; "
          f"decode: beam {d.beam}, power length penalty {d.alpha}, at most {d.max_len_b} tokens", file=sys.stderr)

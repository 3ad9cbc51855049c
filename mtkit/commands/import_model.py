"""``mtkit import marian``: a Marian / OPUS-MT model (Hugging Face layout) as an mtkit run directory."""

from __future__ import annotations

import sys
from pathlib import Path

from mtkit.importers import write_run
from mtkit.importers.marian import marian_folder, read_marian
from mtkit.importers.nllb import nllb_folder, read_nllb
from mtkit.io import refuse_non_empty


def import_marian(source: str, out_dir: Path) -> None:
    """Convert the Marian model in ``source`` (a folder or a hub name) into the run directory ``out_dir``."""
    refuse_non_empty(out_dir)  # before any download
    imported = read_marian(marian_folder(source))
    out = write_run(imported, out_dir)
    m, d = imported.config.model, imported.config.decode
    longest = f"{d.max_len_a:g} × source + {d.max_len_b}" if d.max_len_a else f"{d.max_len_b}"
    print(f"imported {imported.source} to {out}: {m.encoder_layers}+{m.decoder_layers} layers, d_model {m.d_model}, "
          f"{m.activation}, vocabulary {imported.src_vocab_size}/{imported.tgt_vocab_size}; "
          f"decode: beam {d.beam}, {d.length_penalty} length penalty {d.alpha:g}, at most {longest} tokens",
          file=sys.stderr)


def import_nllb(source: str, out_dir: Path, src_lang: str | None = None, targets: tuple[str, ...] = ()) -> None:
    """Convert the NLLB / M2M100 model in ``source`` (a folder or a hub name) into the run directory ``out_dir``,
    translating from ``src_lang`` into ``targets`` (default: tokenizer_config.json's src_lang, every other code)."""
    refuse_non_empty(out_dir)  # before any download
    imported = read_nllb(nllb_folder(source), src_lang, targets)
    out = write_run(imported, out_dir)
    m, d, data = imported.config.model, imported.config.decode, imported.config.data
    print(f"imported {imported.source} to {out}: {m.encoder_layers}+{m.decoder_layers} layers, d_model {m.d_model}, "
          f"vocabulary {imported.src_vocab_size}; {data.src_lang} into {len(data.pairs)} languages; "
          f"decode: beam {d.beam}, length penalty {d.alpha:g}, at most {d.max_len_b} tokens", file=sys.stderr)

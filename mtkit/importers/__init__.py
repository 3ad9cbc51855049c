"""Importers: models trained elsewhere, written as mtkit run directories (imported only when used).

:mod:`mtkit.importers.marian` reads Marian / OPUS-MT models in the Hugging Face layout;
:func:`write_run` writes what an importer made as a run directory that ``translate``, ``evaluate``,
``score``, ``export`` and ``train --init-from`` take.
"""

from __future__ import annotations

from pathlib import Path

from mtkit.checkpoints.io import model_payload, save_checkpoint
from mtkit.config import config_to_dict, save_config
from mtkit.data.vocab import Vocab
from mtkit.io import atomic_directory, refuse_non_empty

CHECKPOINT = "averaged.pt"  # the name a run directory gives a model without training state


def write_run(imported, out_dir: str | Path) -> Path:
    """Write ``imported`` (a :class:`mtkit.importers.marian.Imported`) as the run directory ``out_dir``:
    ``config.yaml``, the vocabulary files and ``checkpoints/averaged.pt``.

    The directory is built beside ``out_dir`` and renamed into place, so a failure leaves nothing
    behind; an existing non-empty ``out_dir`` is an error.
    """
    out_dir = Path(out_dir)
    refuse_non_empty(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    payload = model_payload(config_to_dict(imported.config), imported.state, imported.vocab,
                            imported.src_vocab_size, imported.tgt_vocab_size, imported_from=imported.source)
    with atomic_directory(out_dir) as tmp:
        save_config(imported.config, tmp / "config.yaml")
        vocab = imported.vocab
        Vocab.from_bytes(vocab["src"], vocab["tgt"], vocab["pieces"]).save(tmp)
        (tmp / "checkpoints").mkdir()
        save_checkpoint(payload, tmp / "checkpoints" / CHECKPOINT)
    return out_dir

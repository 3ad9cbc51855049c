"""``mtkit export ctranslate2``, ``hf`` and ``onnx``: write a checkpoint as a CTranslate2 model directory, a
Hugging Face model folder or two ONNX graphs.

No torch or ctranslate2 at import time (tests/unit/test_layout.py's TORCH_FREE): ``export ctranslate2`` imports
CTranslate2 before torch (imported after torch, it binds to torch's OpenMP runtime), so each exporter, which imports
torch, is imported where it is used.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import replace
from pathlib import Path

from mtkit.checkpoints.io import describe, load_model
from mtkit.config import DecodeOptions
from mtkit.engines.ctranslate2_engine import import_ctranslate2

logger = logging.getLogger(__name__)


def export_ctranslate2(checkpoint: Path, out_dir: Path, quantization: str | None = None) -> None:
    """Export ``checkpoint`` (a file or run directory) to ``out_dir`` for CTranslate2.

    ``quantization``: None keeps float32; or int8, int8_float32, int8_float16,
    int8_bfloat16, int16, float16, bfloat16, float32. The directory also holds the
    SentencePiece model(s), so ``mtkit translate --engine ctranslate2 OUT_DIR`` (or
    ``ctranslate2.Translator(OUT_DIR)``) needs nothing else.
    """
    # CTranslate2 first: imported after torch has run, it binds to torch's OpenMP runtime.
    import_ctranslate2()
    from mtkit.export.ctranslate2 import export_model

    loaded = load_model(checkpoint, "cpu")
    logger.info(f"loaded {describe(loaded)}")  # the CLI says it on stderr
    out = export_model(loaded, out_dir, quantization)
    print(f"exported {loaded.path} to {out} (CTranslate2, {quantization or 'float32'})", file=sys.stderr)


def export_hf(checkpoint: Path, out_dir: Path, decode: DecodeOptions | None = None) -> None:
    """Export ``checkpoint`` (a file or run directory) to ``out_dir`` as a Hugging Face model folder
    (:mod:`mtkit.export.huggingface`); the options ``decode`` sets (beam, alpha, length_penalty, ...) replace
    the recipe's decode settings that ``generation_config.json`` carries."""
    from mtkit.export.huggingface import architecture, export_model

    loaded = load_model(checkpoint, "cpu")
    if decode is not None and decode.given():
        loaded = replace(loaded, config=replace(loaded.config, decode=decode.set_on(loaded.config.decode)))
    logger.info(f"loaded {describe(loaded)}")  # the CLI says it on stderr
    out = export_model(loaded, out_dir)
    print(f"exported {loaded.path} to {out} (Hugging Face, {architecture(loaded.config)})", file=sys.stderr)


def export_onnx(checkpoint: Path, out_dir: Path) -> None:
    """Export ``checkpoint`` (a file or run directory) to ``out_dir`` as ONNX graphs (:mod:`mtkit.export.onnx`)."""
    from mtkit.export.onnx import export_model

    loaded = load_model(checkpoint, "cpu")
    logger.info(f"loaded {describe(loaded)}")  # the CLI says it on stderr
    out = export_model(loaded, out_dir)
    print(f"exported {loaded.path} to {out} (ONNX: encoder.onnx, decoder_step.onnx)", file=sys.stderr)

"""``mtkit export ctranslate2``: write a checkpoint as a CTranslate2 model directory.

No torch or ctranslate2 at import time: this module is loaded when the CLI starts.
"""

from __future__ import annotations

from pathlib import Path


def export_ctranslate2(checkpoint: Path, out_dir: Path, quantization: str | None = None) -> None:
    """Export ``checkpoint`` (a file or run directory) to ``out_dir`` for CTranslate2.

    ``quantization``: None keeps float32; or int8, int8_float32, int8_float16,
    int8_bfloat16, int16, float16, bfloat16, float32. The directory also holds the
    SentencePiece model(s), so ``mtkit translate --engine ctranslate2 OUT_DIR`` (or
    ``ctranslate2.Translator(OUT_DIR)``) needs nothing else.
    """
    # CTranslate2 first: imported after torch has run, it binds to torch's OpenMP runtime.
    from mtkit.runtime.ctranslate2_engine import import_ctranslate2

    import_ctranslate2()
    import sys

    from mtkit.export.ctranslate2 import export_model
    from mtkit.runtime.checkpoint import load_model
    from mtkit.runtime.factory import say_loaded

    loaded = load_model(checkpoint, "cpu")
    say_loaded([loaded])
    out = export_model(loaded, out_dir, quantization)
    print(f"exported {loaded.path} to {out} (CTranslate2, {quantization or 'float32'})", file=sys.stderr)

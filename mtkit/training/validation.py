"""Validation BLEU: translate the validation sources and score them against the raw references."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from mtkit.config import DecodeConfig
from mtkit.io import read_lines


def validation_bleu(model, vocab, data_dir: Path, decode: DecodeConfig, beam: int, device) -> float:
    """Cased detokenized sacreBLEU of ``model`` on ``data_dir``'s valid split (``valid.{src,tgt}.txt``)."""
    import sacrebleu

    from mtkit.translate import Translator

    sources = list(read_lines(Path(data_dir) / "valid.src.txt"))
    references = list(read_lines(Path(data_dir) / "valid.tgt.txt"))
    translator = Translator(SimpleNamespace(model=model, vocab=vocab), replace(decode, beam=beam, nbest=1),
                            device=str(device), log=lambda message: None)
    hypotheses = translator.translate_text(sources)
    return float(sacrebleu.corpus_bleu(hypotheses, [references]).score)

"""Validation BLEU: translate the validation sources and score them against the raw references."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from mtkit.config import DecodeConfig
from mtkit.io import read_lines


def validation_bleu(model, vocab, data_dir: Path, decode: DecodeConfig, beam: int, device,
                    rank: int = 0, world_size: int = 1, lines: tuple[int, int] | None = None) -> float:
    """Detokenized sacreBLEU of ``model`` on ``data_dir``'s valid split (``valid.{src,tgt}.txt``): cased,
    or case-insensitive when the target vocabulary lowercases (``data.spm.lowercase``).

    With several ranks each translates every ``world_size``-th sentence from ``rank`` on, and the
    translations are gathered so that every rank scores the whole set (and gets the same BLEU).
    ``lines``: (start, end) of one pair's segment of a multilingual set (``vocab`` then leads each source
    with that pair's tag: :class:`mtkit.data.languages.TaggedVocab`)."""
    import sacrebleu

    from mtkit.runtime.torch_engine import Translator
    from mtkit.training.distributed import all_gather_objects

    sources = list(read_lines(Path(data_dir) / "valid.src.txt"))
    references = list(read_lines(Path(data_dir) / "valid.tgt.txt"))
    if lines is not None:
        sources, references = sources[lines[0] : lines[1]], references[lines[0] : lines[1]]
    translator = Translator(SimpleNamespace(model=model, vocab=vocab), replace(decode, beam=beam, nbest=1),
                            device=str(device), log=lambda message: None)
    shards = all_gather_objects(translator.translate_text(sources[rank::world_size]))  # shard r: sentences r::world
    hypotheses = [shards[i % world_size][i // world_size] for i in range(len(sources))]
    lowercase = vocab.lowercases("tgt")
    return float(sacrebleu.corpus_bleu(hypotheses, [references], lowercase=lowercase).score)

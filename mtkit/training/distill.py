"""Sequence-level knowledge distillation (Kim & Rush 2016): a teacher's translations of the training sources
become a student's training targets, as mozilla/translations and the WMT efficiency task make their students.

``mtkit run`` on a recipe with ``distill.teacher`` runs these stages before the usual prepare → train →
average → evaluate of the student, each kept in ``WORK/distill/`` and skipped when done:

    shards/settings.json what the shards are made with (the teacher, its decoding: its own recipe's decode
                         section, the training source, the shard size): a run with others is refused rather
                         than mixed in
    shards/NNNNNN.tsv    the teacher's best translation of each source of ``distill.shard_lines`` training
                         pairs in turn, ``TARGET<TAB>LOGPROB<TAB>TOKENS`` a line (its log-probability under
                         the teacher, its pieces with EOS); each written whole (temporary file + rename), so a
                         killed run redoes one shard at most; ``shards/done`` when the last is written
    train.src, train.tgt the student's training pairs: the distilled pairs the filter keeps, then (with
                         ``distill.mix_original``) the original pairs
    filter.json          the counts: pairs translated, dropped by the cross-entropy filter (with the threshold),
                         kept, original pairs added

The filter is mozilla/translations' ``cefilter``: the teacher's per-token cross-entropy of its own output,
``-LOGPROB / TOKENS``; the ``distill.filter_share`` of pairs with the highest is dropped (a teacher unsure of
its output: a noisy source, a hallucination). The student's data is then prepared with the teacher's
SentencePiece model (``data.spm.vocab_from``), so the two share one vocabulary.

Streaming throughout: sources are read from the recipe's training source as prepare reads them, each shard's
translations go to disk, and the filter holds one float (and one bit) per pair, never the translations.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from mtkit.api import LoadOptions, load_models
from mtkit.checkpoints.io import stored_config
from mtkit.config import Config, SourceConfig, config_from_dict, config_to_dict
from mtkit.data.sources import iter_pairs
from mtkit.errors import MtkitError, counted, shown
from mtkit.io import atomic_path, atomic_write_text, read_bounded, read_json_file, read_lines, sentence_progress

logger = logging.getLogger(__name__)  # what it does, said on the mtkit logger

DONE = "done"  # in shards/: written after the last shard, with their number
SETTINGS = "settings.json"  # in shards/: what made them (made_with)


def chunks(items: Iterable, size: int) -> Iterator[list]:
    """``items`` in lists of ``size`` (the last one shorter)."""
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def shard_path(folder: Path, number: int) -> Path:
    return folder / f"{number:06d}.tsv"


def _field(text: str) -> str:
    """A translation as one TSV field (a tab or a line break in a decoded piece becomes a space)."""
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ")


def translate_shards(translate: Callable[[list[str]], list], sources: Iterable[str], folder: Path,
                     shard_lines: int) -> int:
    """Translate ``sources`` with ``translate`` (an engine's: lines in, Translations out), ``shard_lines`` at a
    time, each shard written whole; shards already on disk are kept (their sources read past, not translated).
    Returns the number of shards."""
    folder.mkdir(parents=True, exist_ok=True)
    done = _shards_done(folder)
    if done is not None:
        return done
    count = kept = 0
    for count, chunk in enumerate(chunks(sources, shard_lines), 1):
        path = shard_path(folder, count - 1)
        if path.is_file():
            kept += 1
            continue
        lines = []
        for t in translate(chunk):
            best = t.candidates[0] if t.candidates else None
            if best is None:  # an empty source: an empty target
                lines.append("\t0.0\t1\n")
            else:
                lines.append(f"{_field(best.text)}\t{best.logprob!r}\t{len(best.ids) + 1}\n")
        with atomic_path(path) as tmp:
            tmp.write_text("".join(lines), encoding="utf-8")
    if kept:
        logger.info(f"distill: {kept} of {count} shards were translated before; kept")
    atomic_write_text(folder / DONE, f"{count}\n")
    return count


MAX_DONE_BYTES = 64  # the done marker: a number and a newline


def _shards_done(folder: Path) -> int | None:
    """The number of shards when the last is written (the ``done`` marker), else None. A marker that is not
    a regular file, not a number, or counts more shards than the folder holds files is one line naming it."""
    path = folder / DONE
    if not os.path.lexists(path):
        return None
    data = read_bounded(path, MAX_DONE_BYTES, "distillation shards' done marker")
    text = data.decode("ascii", "replace").strip()
    if not (text.isascii() and text.isdigit()):
        raise MtkitError(f"{path}: not a number of shards ({shown(text)}); remove it to finish the shards again")
    count = int(text)
    if count > sum(1 for _ in os.scandir(folder)):  # each shard is a file in the folder: bounded by its size
        raise MtkitError(f"{path}: {count} shards, more than the folder holds; remove it to finish the shards again")
    return count


def read_shards(folder: Path, shards: int) -> Iterator[tuple[str, float, int]]:
    """The distilled targets in order: (text, log-probability, tokens)."""
    for number in range(shards):
        path = shard_path(folder, number)
        for n, line in enumerate(read_lines(path), 1):  # a regular file's (a FIFO, /dev/zero refused), UTF-8
            parts = line.split("\t")
            try:
                text, logprob, tokens = parts[0], float(parts[1]), int(parts[2])
            except (IndexError, ValueError):
                raise MtkitError(f"{path}: line {n}: not TARGET<TAB>LOGPROB<TAB>TOKENS; remove the file "
                                 "to translate its shard again") from None
            yield text, logprob, tokens


def worst(cross_entropies, share: float):
    """A boolean mask of the ``share`` of pairs with the highest cross-entropy (ties: the earlier ones dropped
    first), over an array of one float per pair."""
    values = np.asarray(cross_entropies, dtype=np.float64)
    drop = math.floor(share * len(values) + 1e-9)
    mask = np.zeros(len(values), dtype=bool)
    if drop:
        mask[np.argsort(-values, kind="stable")[:drop]] = True
    return mask


def write_corpus(config: Config, folder: Path, shards: int) -> dict:
    """``train.src`` / ``train.tgt`` from the shards (the filter's kept pairs) and, with ``distill.mix_original``,
    the original pairs; ``filter.json`` with the counts."""
    d, settings = config.data, config.distill
    scored = read_shards(folder / "shards", shards)
    entropies = np.fromiter((-logprob / max(tokens, 1) for _, logprob, tokens in scored), dtype=np.float64)
    dropped = worst(entropies, settings.filter_share)
    counts: dict = {"translated": int(len(entropies)), "dropped": int(dropped.sum()),
                    "filter_share": settings.filter_share, "mix_original": settings.mix_original,
                    "threshold": float(entropies[dropped].min()) if dropped.any() else None}
    with atomic_path(folder / "train.src") as src_tmp, atomic_path(folder / "train.tgt") as tgt_tmp:
        with open(src_tmp, "w", encoding="utf-8") as src_out, open(tgt_tmp, "w", encoding="utf-8") as tgt_out:
            distilled = zip(training_sources(config), read_shards(folder / "shards", shards), strict=True)
            kept = 0
            try:
                for n, (source, (target, _, _)) in enumerate(distilled):
                    if not dropped[n]:
                        src_out.write(_field(source) + "\n")
                        tgt_out.write(target + "\n")
                        kept += 1
            except ValueError:  # zip's strict check: one ended before the other
                raise MtkitError(f"{folder}: data.train has not as many pairs as were translated ({len(dropped)}): "
                                 f"it changed since; remove {folder} to translate it again") from None
            original = 0
            if settings.mix_original:
                for source, target in iter_pairs(d.train, d.src_lang, d.tgt_lang, d.clean.invalid_utf8):
                    src_out.write(_field(source) + "\n")
                    tgt_out.write(_field(target) + "\n")
                    original += 1
    counts.update(kept=kept, original=original)
    atomic_write_text(folder / "filter.json", json.dumps(counts, indent=2) + "\n")
    threshold = (f" (per-token cross-entropy {counts['threshold']:.3f} and above)" if counts["threshold"] is not None
                 else "")
    logger.info(f"distill: {counted(counts['translated'], 'pair')} translated, {counts['dropped']} dropped by the "
                f"filter{threshold}, "
                f"{kept} kept" + (f", {counted(original, 'original pair')} added" if settings.mix_original else ""))
    return counts


def training_sources(config: Config) -> Iterator[str]:
    """The sources of ``data.train``, streamed as prepare reads them."""
    d = config.data
    return (source for source, _ in iter_pairs(d.train, d.src_lang, d.tgt_lang, d.clean.invalid_utf8))


def student_config(config: Config, folder: Path) -> Config:
    """The recipe with the distilled corpus as ``data.train`` and the teacher's SentencePiece model."""
    d = config.data
    train = SourceConfig(kind="files", src=str(folder / "train.src"), tgt=str(folder / "train.tgt"))
    return replace(config, data=replace(d, train=train, spm=replace(d.spm, vocab_from=config.distill.teacher[0])))


# made_with's keys, as the recipe names them.
MADE_WITH = {"teacher": "distill.teacher", "decode": "decoding (the teacher's decode section)", "train": "data.train",
             "languages": "data.src_lang or tgt_lang", "shard_lines": "distill.shard_lines"}


def made_with(config: Config) -> dict:
    """What the shards hold depends on: the teacher, how it decodes, the training sources, the shard size."""
    d = config.data
    return {"teacher": list(config.distill.teacher), "decode": config_to_dict(teacher_decoding(config)),
            "train": config_to_dict(d.train), "languages": [d.src_lang, d.tgt_lang],
            "shard_lines": config.distill.shard_lines}


def teacher_decoding(config: Config):
    """How the teacher translates: as its own recipe decodes (the decode section stored in the first teacher;
    the distillation recipe's own decode section is the student's), one hypothesis per source, searched
    (never sampled), without MBR."""
    return replace(stored_config(config.distill.teacher[0]).decode, nbest=1, sampling=False, mbr="off")


def _normalized(found: dict) -> dict:
    """``settings.json`` as this version writes it: a decode or source section written before a key was added
    gets the key's default (a new setting, at its default, changes no translation)."""
    found = dict(found)
    for key, section in (("decode", "decode"), ("train", None)):
        value = found.get(key)
        if not isinstance(value, dict):
            continue
        try:
            if section == "decode":
                found[key] = config_to_dict(config_from_dict({"decode": value}).decode)
            else:
                found[key] = config_to_dict(SourceConfig(**value))
        except (MtkitError, TypeError, ValueError):
            pass  # left as it is: it then differs, and the run is refused with the key named
    return found


def _check_made_with(config: Config, shards: Path) -> None:
    """Refuse shards that other settings made (they would be mixed with this run's), naming the first."""
    path = shards / SETTINGS
    wanted = made_with(config)
    if not path.is_file():
        shards.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(wanted, indent=2) + "\n")
        return
    found = _normalized(_read_json(path) or {})
    differ = next((key for key in wanted if found.get(key) != wanted[key]), None)
    if differ is not None:
        raise MtkitError(f"{shards.parent}: its translations were made with another {MADE_WITH[differ]}; remove "
                         f"{shards.parent} or use another work directory")


def distill(config: Config, folder: Path, progress: bool = True) -> Config:
    """Run the distillation stages of ``config`` (a recipe with ``distill.teacher``) in ``folder``, skipping
    those done, and return the student's recipe (:func:`student_config`)."""
    folder = Path(folder)
    shards = folder / "shards"
    _check_made_with(config, shards)
    settings = config.distill
    written = _read_json(folder / "filter.json")
    if (written is not None and (folder / "train.src").is_file() and (folder / "train.tgt").is_file()
            and (written.get("filter_share"), written.get("mix_original")) == (settings.filter_share,
                                                                                settings.mix_original)):
        logger.info(f"distill: {folder / 'train.src'} and train.tgt are written; skipped")
        return student_config(config, folder)
    count = _shards_done(shards)
    if count is None:
        teacher = [Path(p) for p in settings.teacher]
        # What was loaded goes to the mtkit logger (the CLI says it on stderr); the thread count as the CLI's.
        engine = load_models(teacher, LoadOptions(engine="torch", threads=0, any_target=False,
                                                  decode=teacher_decoding(config))).engine
        bar = sentence_progress(enabled=progress)

        def translate(lines: list[str]) -> list:
            done = engine.translate(lines)
            if bar is not None:
                bar.update(len(lines))
            return done

        try:
            count = translate_shards(translate, training_sources(config), shards, settings.shard_lines)
        finally:
            if bar is not None:
                bar.close()
    write_corpus(config, folder, count)
    return student_config(config, folder)


def _read_json(path: Path) -> dict | None:
    """A record this module wrote (settings.json, filter.json), None when missing or unreadable."""
    try:
        found = read_json_file(path, 1 << 20, "distillation record")
    except MtkitError:
        return None
    return found if isinstance(found, dict) else None

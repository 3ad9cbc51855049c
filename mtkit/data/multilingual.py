"""The multilingual side of prepare (``data.pairs``): one SentencePiece model over every language's
sample, and every pair encoded into one store per split, pair after pair, each a contiguous segment
led by its target-language tag."""

from __future__ import annotations

import collections
import dataclasses
import logging
import random
import time
from pathlib import Path

from mtkit.config import DataConfig, SourceConfig, config_to_dict
from mtkit.data.cleaning import make_normalizer, within_words
from mtkit.data.encode import SPLITS, _append_eval, _encode_train, _Part, _progress, rule_names
from mtkit.data.languages import Pair, config_pairs, tag_id, tag_piece, targets
from mtkit.data.store import ParallelStoreWriter, id_dtype
from mtkit.data.vocab import Vocab, train_model
from mtkit.errors import MtkitError, counted

logger = logging.getLogger(__name__)


def _sample_languages(data: DataConfig, progress: bool) -> tuple[dict[tuple[str, str], list[str]], int]:
    """Pass 1 of a multilingual recipe: a reservoir sample per language (and per model when the
    vocabularies are separate), so that every language has an equal share of the SentencePiece
    sample whatever its pairs' sizes; a side that several pairs share (en in en-de and en-fr from
    one file) is read once. Returns {(model, language): sentences} and the pairs read."""
    clean, spm_cfg = data.clean, data.spm
    normalize = make_normalizer(clean)
    pairs = [(i, p) for i, p in enumerate(data.pairs) if p.train is not None]
    sides: dict[tuple[str, str], int] = collections.Counter()  # (model, language) -> sides that feed it
    for _, p in pairs:
        for side, lang in (("src", p.src_lang), ("tgt", p.tgt_lang)):
            sides[("joint" if spm_cfg.joint else side, lang)] += 1
    per_model = collections.Counter(model for model, _ in sides)
    reservoirs: dict[tuple[str, str], list[str]] = {key: [] for key in sides}
    seen_count = dict.fromkeys(sides, 0)
    read_sides: set = set()
    rng = random.Random(0)
    read = 0
    with _progress(progress, "train: sample for SentencePiece") as bar:
        for i, p in pairs:
            wanted = []
            for side, lang in (("src", p.src_lang), ("tgt", p.tgt_lang)):
                key = ("joint" if spm_cfg.joint else side, lang)
                origin = (key[0], *_side_origin(p.train, side, lang))
                if origin not in read_sides:
                    read_sides.add(origin)
                    wanted.append((0 if side == "src" else 1, key))
            if not wanted:
                continue
            part = _Part(p.train, p.src_lang, p.tgt_lang, f"data.pairs[{i}].train", tag=0)
            for pair in part.pairs("train", clean.invalid_utf8):
                read += 1
                if read % 10000 == 0:
                    bar.update(10000)
                for which, key in wanted:
                    text = normalize(pair[which])
                    if not text or not within_words(text, text, clean.max_len):
                        continue
                    capacity = max(1, spm_cfg.sample_size // per_model[key[0]])
                    reservoir = reservoirs[key]
                    seen_count[key] += 1
                    if len(reservoir) < capacity:
                        reservoir.append(text)
                    else:
                        j = rng.randrange(seen_count[key])
                        if j < capacity:
                            reservoir[j] = text
        bar.update(read % 10000)
    return reservoirs, read


def _side_origin(source: SourceConfig, side: str, lang: str) -> tuple:
    """What one side of a training source reads, so that a side shared by several pairs is sampled once:
    a file, a TSV column, a dataset column, or the demo's sentences in one language."""
    if source.kind == "files":
        return ("files", source.src if side == "src" else source.tgt)
    if source.kind == "tsv":
        return ("tsv", source.path, side)
    if source.kind == "demo":
        return ("demo", source.size, source.seed, lang)
    field = (source.src_field if side == "src" else source.tgt_field) or lang
    return ("hf", source.name, source.config, source.split, field)


def _train_multilingual_vocab(data: DataConfig, workers: int,
                              progress: bool) -> tuple[tuple[bytes, bytes | None], dict, dict]:
    """SentencePiece for a multilingual recipe: one model over every language (or a source and a
    target model), with the pairs' target-language tags reserved as whole pieces of the model of their
    side (``data.tag_side``)."""
    spm_cfg, timings = data.spm, {}
    start = time.perf_counter()
    reservoirs, read = _sample_languages(data, progress)
    timings["sample"] = round(time.perf_counter() - start, 2)
    if not any(reservoirs.values()):
        raise MtkitError(f"data.pairs: no training pairs left after cleaning ({read} read, all empty or too long)")
    tags = [tag_piece(lang) for lang in targets(config_pairs(data))]
    start = time.perf_counter()
    sample = {model: [t for (m, _), texts in reservoirs.items() if m == model for t in texts]
              for model in ("joint", "src", "tgt")}
    if spm_cfg.joint:
        models = (train_model(sample["joint"], spm_cfg, workers, tags), None)
    else:
        on_source = data.tag_side == "source"
        models = (train_model(sample["src"], spm_cfg, workers, tags if on_source else ()),
                  train_model(sample["tgt"], spm_cfg, workers, () if on_source else tags))
    timings["spm_train"] = round(time.perf_counter() - start, 2)
    info = {"trained": True, "sample_sentences": sum(map(len, reservoirs.values())),
            "sample_per_language": {f"{lang}" if spm_cfg.joint else f"{model}.{lang}": len(texts)
                                    for (model, lang), texts in reservoirs.items()},
            "tags": tags}
    return models, info, timings


def _build_pairs(data: DataConfig, vocab: Vocab, out_dir: Path, workers: int, progress: bool, timings: dict,
                 splits: dict, dropped: dict) -> list[dict]:
    """Encode every pair of a multilingual recipe into one store per split, pair after pair (each a
    contiguous segment of its split), each source (or target: ``data.tag_side``) led by its target-language
    tag; fills ``splits``,
    ``dropped`` and ``timings`` and returns the manifest's ``pairs``: languages, tag, sources, and
    per split the segment's ``start`` and ``pairs`` (and for train what cleaning dropped)."""
    dtype = id_dtype(max(vocab.src_size, vocab.tgt_size))
    entries = []
    for p in data.pairs:
        name = Pair(p.src_lang, p.tgt_lang).name
        entries.append({"src_lang": p.src_lang, "tgt_lang": p.tgt_lang, "name": name, "tag": tag_piece(p.tgt_lang),
                        "tag_id": tag_id(vocab, p.tgt_lang, data.tag_side), "tag_side": data.tag_side,
                        "sources": {s: config_to_dict(getattr(p, s)) for s in SPLITS if getattr(p, s) is not None},
                        "splits": {}, "dropped": {}})
    parts = [_Part(p.train, p.src_lang, p.tgt_lang, f"data.pairs[{i}].train", e["tag_id"], data.tag_side)
             for i, (p, e) in enumerate(zip(data.pairs, entries))]
    if any(p.train is not None for p in data.pairs):
        start = time.perf_counter()
        writer = ParallelStoreWriter(out_dir, "train", dtype)
        for p, part, entry in zip(data.pairs, parts, entries):
            if p.train is None:
                continue
            result = _encode_train(data, vocab, out_dir, workers, progress, part, writer)
            entry["splits"]["train"], entry["dropped"]["train"] = result["stats"], result["dropped"]
            entry["examples"] = {"train": result["examples"]}
            drops = ", ".join(f"{rule} {n}" for rule, n in result["dropped"].items())
            if result["stats"]["pairs"] == 0:
                raise MtkitError(f"{part.key}: no training pairs left after cleaning ({result['stats']['read']} read; "
                                 f"dropped: {drops})")
        splits["train"] = writer.close()
        splits["train"]["read"] = sum(e["splits"]["train"]["read"] for e in entries if "train" in e["splits"])
        dropped["train"] = {rule: sum(e["dropped"]["train"][rule] for e in entries if "train" in e["dropped"])
                            for rule in rule_names(data.clean)}
        timings["encode_train"] = round(time.perf_counter() - start, 2)
    for split in ("valid", "test"):
        if all(getattr(p, split) is None for p in data.pairs):
            continue
        start = time.perf_counter()
        writer = ParallelStoreWriter(out_dir, split, dtype)
        skipped = 0
        with open(out_dir / f"{split}.src.txt", "w", encoding="utf-8") as fs, \
                open(out_dir / f"{split}.tgt.txt", "w", encoding="utf-8") as ft:
            for i, (p, entry) in enumerate(zip(data.pairs, entries)):
                if getattr(p, split) is None:
                    continue
                first = len(writer)
                part = dataclasses.replace(parts[i], source=getattr(p, split), key=f"data.pairs[{i}].{split}")
                skipped += _append_eval(data, part, split, vocab, writer, fs, ft)
                entry["splits"][split] = {"start": first, "pairs": len(writer) - first}
                if len(writer) == first:
                    raise MtkitError(f"{part.key}: the {split} set is empty")
                logger.info(f"{split} {entry['name']}: kept {counted(len(writer) - first, 'pair')}")
        splits[split] = writer.close()
        splits[split]["read"] = splits[split]["pairs"] + skipped
        dropped[split] = {"invalid_utf8": skipped}
        timings[f"encode_{split}"] = round(time.perf_counter() - start, 2)
    return entries

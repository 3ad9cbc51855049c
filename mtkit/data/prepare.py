"""The data pipeline: read -> clean -> SentencePiece -> binarized store, into one prepared directory.

Training data takes two streaming passes and never sits in memory whole:

1. *scan*: normalize each pair and keep a reservoir sample of at most
   ``spm.sample_size`` sentences (pairs longer than ``clean.max_len`` words are
   left out of it) to train SentencePiece on (skipped when a model is given);
2. *encode*: chunks of pairs go to a pool of ``data.workers`` processes that
   normalize, drop empty sides, encode with SentencePiece and apply the
   token-length and ratio rules; the main process removes duplicates (8-byte
   hashes) and appends the ids to the store. At most ``2 * workers`` chunks are
   in flight, so memory stays flat whatever the corpus size.

Validation and test sets are only normalized (every line kept) and are also
written as cleaned text, the references evaluation scores against.

Everything is built in a temporary sibling directory whose ``manifest.json``
is written last; the directory is then renamed onto ``out_dir``. An
interrupted run therefore never leaves a directory that looks complete.

The passes are :mod:`mtkit.data.encode`'s, a multilingual recipe's (``data.pairs``) are
:mod:`mtkit.data.multilingual`'s, and the safety rules for what already exists and the process
hygiene are :mod:`mtkit.data.workdir`'s.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mtkit.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, DataConfig, SourceConfig, config_to_dict
from mtkit.data.encode import SPLITS, _encode_corpora, _encode_eval, _encode_train, _sample_for_spm
from mtkit.data.filters import check_filters
from mtkit.data.multilingual import _build_pairs, _train_multilingual_vocab
from mtkit.data.report import cleaning_report, render_text, share_warnings
from mtkit.data.sources import source_files
from mtkit.data.store import MANIFEST, MANIFEST_FORMAT, load_manifest
from mtkit.data.vocab import Vocab, train_model
from mtkit.data.workdir import _check_out_dir, _owner, _remove_dead_leftovers, _replace_dir, die_with_parent
from mtkit.errors import MtkitError, counted
from mtkit.io import atomic_write_text, naming_output
from mtkit.version import __version__

logger = logging.getLogger(__name__)

# ------------------------------------------------------------------ fingerprint


def resolve_source(source: SourceConfig) -> SourceConfig:
    """The source with local paths made absolute (hub names stay as they are)."""
    changes: dict[str, Any] = {}
    for name in ("src", "tgt", "path"):
        value = getattr(source, name)
        if value:
            changes[name] = str(Path(value).expanduser().resolve())
    if source.kind == "hf" and source.name and Path(source.name).expanduser().exists():
        changes["name"] = str(Path(source.name).expanduser().resolve())
    return dataclasses.replace(source, **changes)


def resolve_data(data: DataConfig) -> DataConfig:
    changes: dict[str, Any] = {s: resolve_source(getattr(data, s)) for s in SPLITS if getattr(data, s) is not None}
    if data.pairs:
        changes["pairs"] = tuple(dataclasses.replace(p, **{s: resolve_source(getattr(p, s)) for s in SPLITS
                                                           if getattr(p, s) is not None}) for p in data.pairs)
    if data.corpora:
        changes["corpora"] = tuple(dataclasses.replace(c, train=resolve_source(c.train)) for c in data.corpora)
    spm_changes = {k: str(Path(v).expanduser().resolve()) for k in ("model", "tgt_model", "vocab_from")
                   if (v := getattr(data.spm, k))}
    if data.alignments is not None and data.alignments != "eflomal":
        changes["alignments"] = str(Path(data.alignments).expanduser().resolve())
    clean = data.clean
    if clean.filters is not None and clean.filters.dual_xent is not None:
        dual = clean.filters.dual_xent
        dual = dataclasses.replace(dual, **{k: str(Path(getattr(dual, k)).expanduser().resolve())
                                            for k in ("forward", "backward")})
        clean = dataclasses.replace(clean, filters=dataclasses.replace(clean.filters, dual_xent=dual))
    return dataclasses.replace(data, spm=dataclasses.replace(data.spm, **spm_changes), clean=clean, **changes)


def fingerprint(data: DataConfig, vocab_models: tuple[bytes, bytes | None] | None = None) -> str:
    """Hash of the resolved data config (less ``workers``, which changes no output), mtkit's
    version, each input file's size and mtime, and the given vocabulary's bytes (``data.spm.vocab_from``)."""
    files = []
    for holder in (data, *data.pairs, *data.corpora):
        for split in SPLITS:
            source = getattr(holder, split, None)
            if source is not None:
                files.extend(source_files(source))
    files.extend(Path(p) for p in (data.spm.model, data.spm.tgt_model) if p)
    if data.alignments is not None and data.alignments != "eflomal":
        files.append(Path(data.alignments))
    if data.clean.filters is not None and data.clean.filters.dual_xent is not None:
        files.extend(Path(getattr(data.clean.filters.dual_xent, k)) for k in ("forward", "backward"))
    stamps = []
    for path in files:
        with contextlib.suppress(OSError):  # a missing file is reported by the reader
            st = path.stat()
            stamps.append([str(path), st.st_size, st.st_mtime_ns])
    settings = config_to_dict(dataclasses.replace(data, workers=0))
    if not data.pairs:
        del settings["pairs"]  # a single-pair recipe keeps the fingerprint it had before data.pairs existed
    if data.alignments is None:
        del settings["alignments"]  # and a recipe without alignments the one it had before they existed
    for key, default in (("filters", None), ("examples", 3), ("warn_share", 0.2)):  # and without filters
        if settings["clean"][key] == default:
            del settings["clean"][key]
    for pair in settings.get("pairs", []):  # training and evaluation settings: no output of prepare changes
        del pair["weight"], pair["lc_tok_ref"]
    if not data.corpora:
        del settings["corpora"]  # (nor one without corpora)
    for corpus in settings.get("corpora", []):
        del corpus["weight"]
    vocab = [hashlib.sha256(m if isinstance(m, bytes) else json.dumps(m).encode()).hexdigest() if m is not None
             else None for m in vocab_models] if vocab_models else None  # (an imported model's piece table third)
    blob = json.dumps({"version": __version__, "data": settings, "files": stamps, "vocab": vocab},
                      sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def read_manifest(out_dir: Path) -> dict | None:
    """The manifest of a complete mtkit result in ``out_dir``, or None (missing, damaged or unknown)."""
    try:
        return load_manifest(out_dir)
    except MtkitError:
        return None


def _train_vocab(data: DataConfig, workers: int, progress: bool) -> tuple[tuple[bytes, bytes | None], dict, dict]:
    """Sample the training data and train SentencePiece on it; returns the serialized model(s)."""
    spm_cfg, timings = data.spm, {}
    if data.pairs:
        return _train_multilingual_vocab(data, workers, progress)
    start = time.perf_counter()
    srcs, tgts, read = _sample_for_spm(data, progress)
    timings["sample"] = round(time.perf_counter() - start, 2)
    if not srcs:
        raise MtkitError(f"data.train: no training pairs left after cleaning ({read} read, all empty or too long)")
    start = time.perf_counter()
    tags = sorted({c.tag for c in data.corpora if c.tag})  # tagged corpora's tags, whole pieces of the source
    if spm_cfg.joint:
        models = (train_model(srcs + tgts, spm_cfg, workers, tags), None)
    else:
        models = (train_model(srcs, spm_cfg, workers, tags), train_model(tgts, spm_cfg, workers))
    timings["spm_train"] = round(time.perf_counter() - start, 2)
    info = {"trained": True, "sample_pairs": len(srcs), "sample_sentences": len(srcs) * (2 if spm_cfg.joint else 1)}
    return models, info, timings


def _make_vocab(data: DataConfig, workers: int, progress: bool, timings: dict,
                vocab_models: tuple[bytes, bytes | None] | None = None) -> tuple[Vocab, dict]:
    spm_cfg = data.spm
    if spm_cfg.vocab_from:
        if vocab_models is None:  # the checkpoint is read above the data layer (mtkit.commands.prepare)
            raise MtkitError("data.spm.vocab_from: the checkpoint's vocabulary was not passed in")
        vocab = Vocab.from_bytes(*vocab_models)
        sha = {side: hashlib.sha256(m).hexdigest() for side, m in zip(("src", "tgt"), vocab_models) if m is not None}
        return vocab, {"trained": False, "reused": [spm_cfg.vocab_from], "sha256": sha}
    if spm_cfg.tgt_model and not spm_cfg.model:
        raise MtkitError("data.spm.tgt_model: needs data.spm.model (the source model) as well")
    if spm_cfg.model and spm_cfg.joint and spm_cfg.tgt_model:
        raise MtkitError("data.spm.tgt_model: given with data.spm.joint: true; set data.spm.joint: false")
    if spm_cfg.model and not spm_cfg.joint and not spm_cfg.tgt_model:
        raise MtkitError("data.spm.joint is false: give the target model in data.spm.tgt_model as well")
    if spm_cfg.model:
        tgt_path = Path(spm_cfg.tgt_model) if spm_cfg.tgt_model else None
        vocab = Vocab.from_files(Path(spm_cfg.model), tgt_path)
        info = {"trained": False, "reused": [spm_cfg.model] + ([spm_cfg.tgt_model] if spm_cfg.tgt_model else [])}
        return vocab, info
    if data.pairs and not any(p.train is not None for p in data.pairs):
        raise MtkitError("data.pairs: no pair has a training source to build the vocabulary from "
                         "(or set data.spm.model)")
    if data.train is None and not data.pairs and not data.corpora:
        raise MtkitError("data.train: no training source to build the vocabulary from (or set data.spm.model)")
    # Sampling and training run in a child process: the sample and SentencePiece's trainer
    # take memory that CPython would not give back, and the encoding workers forked later
    # would each inherit it.
    fork = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(1, fork, die_with_parent, (os.getpid(),)) as pool:
        models, info, child_timings = pool.submit(_train_vocab, data, workers, progress).result()
    timings.update(child_timings)
    vocab = Vocab.from_bytes(*models)
    sizes = {"vocabulary": vocab.src_size} if vocab.joint else \
        {"source vocabulary": vocab.src_size, "target vocabulary": vocab.tgt_size}
    for name, size in sizes.items():
        # hard_vocab_limit=False lets SentencePiece stop early on a small sample; say so.
        if size < spm_cfg.vocab_size:
            logger.warning(f"warning: data.spm.vocab_size {spm_cfg.vocab_size} is more than this training sample "
                           f"supports; the {name} has {size} pieces")
    return vocab, info


# ------------------------------------------------------------------- pipeline


def build(data: DataConfig, out_dir: Path, workers: int, progress: bool, fp: str,
          vocab_models: tuple[bytes, bytes | None] | None = None) -> dict:
    """Build every artefact of a prepared directory into ``out_dir`` (a fresh, empty folder)."""
    total_start = time.perf_counter()
    timings: dict[str, float] = {}
    vocab, vocab_info = _make_vocab(data, workers, progress, timings, vocab_models)
    files = vocab.save(out_dir)
    splits: dict[str, dict] = {}
    dropped: dict[str, dict] = {}
    examples: dict[str, dict] = {}
    pairs = corpora = None
    if data.pairs:
        pairs = _build_pairs(data, vocab, out_dir, workers, progress, timings, splits, dropped)
    elif data.train is not None or data.corpora:
        start = time.perf_counter()
        if data.corpora:
            result = _encode_corpora(data, vocab, out_dir, workers, progress)
            corpora = result["corpora"]
        else:
            result = _encode_train(data, vocab, out_dir, workers, progress)
        timings["encode_train"] = round(time.perf_counter() - start, 2)
        splits["train"], dropped["train"] = result["stats"], result["dropped"]
        examples["train"] = result["examples"]
        drops = ", ".join(f"{rule} {n}" for rule, n in result["dropped"].items())
        if result["stats"]["pairs"] == 0:
            raise MtkitError(
                f"data.train: no training pairs left after cleaning ({result['stats']['read']} read; dropped: {drops})"
            )
    for split in ("valid", "test"):
        if getattr(data, split) is not None and not data.pairs:
            start = time.perf_counter()
            result = _encode_eval(data, split, vocab, out_dir)
            timings[f"encode_{split}"] = round(time.perf_counter() - start, 2)
            splits[split], dropped[split] = result["stats"], result["dropped"]
            invalid = result["dropped"]["invalid_utf8"]
            logger.info(f"{split}: kept {counted(result['stats']['pairs'], 'pair')}"
                        + (f" (skipped {invalid} invalid UTF-8)" if invalid else ""))
    timings["total"] = round(time.perf_counter() - total_start, 2)
    manifest = {
        "format": MANIFEST_FORMAT,
        "mtkit_version": __version__,
        "fingerprint": fp,
        "src_lang": data.src_lang,
        "tgt_lang": data.tgt_lang,
        "sources": {s: config_to_dict(getattr(data, s)) for s in SPLITS if getattr(data, s) is not None},
        "clean": config_to_dict(data.clean),
        "dropped": dropped,
        "examples": examples,
        "vocab": {
            "type": data.spm.model_type if vocab_info["trained"] else "reused",
            "joint": vocab.joint,
            "src_size": vocab.src_size,
            "tgt_size": vocab.tgt_size,
            "requested_size": data.spm.vocab_size if vocab_info["trained"] else None,
            "character_coverage": data.spm.character_coverage if vocab_info["trained"] else None,
            "lowercase": {"src": vocab.lowercases("src"), "tgt": vocab.lowercases("tgt")},
            "special_ids": {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID},
            "files": files,
            **{k: v for k, v in vocab_info.items() if k != "trained"},
        },
        "splits": splits,
        "workers": workers,
        "timings_s": timings,
    }
    if corpora is not None:  # several corpora of one pair: each one's segment of the store, tag and drops
        manifest["corpora"] = corpora
    if pairs is not None:  # a multilingual store: its pairs replace the single pair's languages and sources
        for key in ("src_lang", "tgt_lang", "sources", "examples"):  # (and each pair has its examples)
            del manifest[key]
        manifest["pairs"] = pairs
    return manifest


def prepare_data(data: DataConfig, out_dir: Path, force: bool = False, progress: bool | None = None,
                 vocab_models: tuple[bytes, bytes | None] | None = None) -> dict:
    """Run the pipeline on ``data`` into ``out_dir``; reuse a complete result for identical inputs.

    ``vocab_models``: the serialized SentencePiece model(s) of ``data.spm.vocab_from``'s checkpoint
    (``Vocab.model_bytes`` form), which the caller reads: the data layer knows no checkpoints.
    """
    out_dir = Path(os.path.abspath(Path(out_dir).expanduser()))  # "." and ".." have no name to put beside
    if progress is None:
        progress = sys.stderr.isatty()
    data = resolve_data(data)
    if data.train is None and data.valid is None and data.test is None and not data.pairs and not data.corpora:
        raise MtkitError("data: no source configured (set data.train, data.valid or data.test)")
    for pair in (data, *data.pairs):
        check_filters(data.clean.filters, pair.src_lang, pair.tgt_lang)
    fp = fingerprint(data, vocab_models)
    _remove_dead_leftovers(out_dir)
    existing = read_manifest(out_dir) if out_dir.is_dir() else None
    if existing is not None and existing.get("fingerprint") == fp and not force:
        logger.info(f"{out_dir}: already prepared from identical inputs; reusing it "
                    "(`mtkit prepare --force` rebuilds it)")
        return existing
    _check_out_dir(out_dir)  # before the work, so that a refusal costs nothing
    workers = data.workers if data.workers > 0 else (os.cpu_count() or 1)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-{_owner()}-", dir=out_dir.parent))
    except OSError as e:  # a folder mtkit may not write in: the user's path, never a candidate temporary's
        raise OSError(e.errno, e.strerror, str(out_dir)) from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would otherwise stick to out_dir
    try:
        manifest = build(data, tmp, workers, progress, fp, vocab_models)
        atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
        for path in tmp.iterdir():  # atomic writes create 0600 files; give them the usual mode
            os.chmod(path, 0o666 & ~umask)
        _replace_dir(tmp, out_dir)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):  # a full disk names the output (out_dir/spm.model), not the temporary
            raise naming_output(e, tmp, out_dir) from None
        raise
    sections = cleaning_report(manifest)
    if sections:
        logger.info(render_text(sections))
    for line in share_warnings(sections, data.clean.warn_share):
        logger.warning(line)
    logger.info(f"{out_dir}: prepared in {manifest['timings_s']['total']:.1f} s")
    return manifest

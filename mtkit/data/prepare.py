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

Safety rules for what already exists:

* ``out_dir`` is replaced (``--force`` or changed inputs) only if it is empty or
  holds an mtkit ``manifest.json`` and nothing but the files prepare writes, so
  that no rebuild ever deletes a file mtkit did not write; the current directory
  and its parents are never replaced.
* The temporaries beside ``out_dir`` carry their owner's PID and host
  (``.{name}.tmp-{pid}@{host}-*``, ``.{name}.old-{pid}@{host}-*``); the next run on
  the same host removes those whose owner is gone (after a crash or a SIGKILL), never
  those of a live process or of another host sharing the folder.
* The encoding workers and the SentencePiece child ask Linux to kill them when
  their parent dies, so a killed ``mtkit prepare`` leaves no orphan holding memory.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import itertools
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

import mtkit
from mtkit.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, CleanConfig, DataConfig, SourceConfig, config_to_dict
from mtkit.data.cleaning import RULES, Deduplicator, length_mask, make_normalizer, pair_hash, within_words
from mtkit.data.sources import iter_pairs, source_files
from mtkit.data.store import MANIFEST, MANIFEST_FORMAT, ParallelStoreWriter, id_dtype, load_manifest
from mtkit.data.vocab import Vocab, train_model
from mtkit.errors import MtkitError
from mtkit.io import atomic_write_text

SPLITS = ("train", "valid", "test")
CHUNK_PAIRS = 8192  # pairs per task sent to an encoding worker


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


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
    spm_changes = {k: str(Path(v).expanduser().resolve()) for k in ("model", "tgt_model", "vocab_from")
                   if (v := getattr(data.spm, k))}
    return dataclasses.replace(data, spm=dataclasses.replace(data.spm, **spm_changes), **changes)


def fingerprint(data: DataConfig, vocab_models: tuple[bytes, bytes | None] | None = None) -> str:
    """Hash of the resolved data config (less ``workers``, which changes no output), mtkit's
    version, each input file's size and mtime, and the given vocabulary's bytes (``data.spm.vocab_from``)."""
    files = []
    for holder in (data, *data.pairs):
        for split in SPLITS:
            source = getattr(holder, split)
            if source is not None:
                files.extend(source_files(source))
    files.extend(Path(p) for p in (data.spm.model, data.spm.tgt_model) if p)
    stamps = []
    for path in files:
        with contextlib.suppress(OSError):  # a missing file is reported by the reader
            st = path.stat()
            stamps.append([str(path), st.st_size, st.st_mtime_ns])
    settings = config_to_dict(dataclasses.replace(data, workers=0))
    if not data.pairs:
        del settings["pairs"]  # a single-pair recipe keeps the fingerprint it had before data.pairs existed
    for pair in settings.get("pairs", []):  # training and evaluation settings: no output of prepare changes
        del pair["weight"], pair["lc_tok_ref"]
    vocab = [hashlib.sha256(m if isinstance(m, bytes) else json.dumps(m).encode()).hexdigest() if m is not None
             else None for m in vocab_models] if vocab_models else None  # (an imported model's piece table third)
    blob = json.dumps({"version": mtkit.__version__, "data": settings, "files": stamps, "vocab": vocab},
                      sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def read_manifest(out_dir: Path) -> dict | None:
    """The manifest of a complete mtkit result in ``out_dir``, or None (missing, damaged or unknown)."""
    try:
        return load_manifest(out_dir)
    except MtkitError:
        return None


# -------------------------------------------------------------- process hygiene

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """Have Linux SIGKILL this process when its parent ``parent`` dies (a no-op elsewhere).

    Without it a child of a SIGKILLed ``mtkit prepare`` can live on, adopted by init and
    holding its memory: the SentencePiece trainer, for one, then waits forever on a
    queue that nobody feeds.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):  # no prctl in this libc: the orphan risk stays as before
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)


def _pool_context() -> multiprocessing.context.BaseContext:
    # On Linux, fork makes this process the workers' direct parent, which die_with_parent
    # relies on; the forkserver (Python 3.14's default there) would be their parent instead.
    return multiprocessing.get_context("fork" if sys.platform.startswith("linux") else None)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _owner() -> str:
    """``{pid}@{host}``: who made a temporary; a PID alone means nothing on another host."""
    return f"{os.getpid()}@{re.sub(r'[^A-Za-z0-9.-]', '_', socket.gethostname())}"


def _remove_dead_leftovers(out_dir: Path) -> None:
    """Remove the temporaries beside ``out_dir`` of earlier runs on this host whose process is gone."""
    if os.name != "posix" or not out_dir.parent.is_dir():  # on Windows, os.kill(pid, 0) sends a Ctrl-C
        return
    host = _owner().partition("@")[2]
    pattern = re.compile(rf"\.{re.escape(out_dir.name)}\.(?:tmp|old)-(\d+)@{re.escape(host)}-[a-z0-9_]+")
    for path in out_dir.parent.iterdir():
        match = pattern.fullmatch(path.name)
        if match is None or not path.is_dir() or path.is_symlink():
            continue
        pid = int(match.group(1))
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(path, ignore_errors=True)
            log(f"{path}: removed; left behind by process {pid}, which no longer runs")


# ------------------------------------------------------------- out_dir safety

# Every file a prepared directory may hold; anything else there is the user's.
_OUTPUT_NAME = re.compile(
    r"(?:manifest\.json|spm(?:\.src|\.tgt)?\.model|pieces\.json"
    r"|(?:train|valid|test)\.(?:store\.json|(?:src|tgt)\.(?:bin|idx\.npy|len\.npy|txt)))"
)


def _written_by_mtkit(manifest_path: Path) -> bool:
    """True if ``manifest_path`` is a JSON object with mtkit's ``format`` key (of any version)."""
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and type(manifest.get("format")) is int


def _check_out_dir(out_dir: Path) -> None:
    """Raise MtkitError unless writing ``out_dir`` (replacing what is there) deletes nothing of the user's."""
    resolved = out_dir.resolve()
    try:
        cwd = Path.cwd().resolve()
    except FileNotFoundError:  # the current directory was deleted: nothing of it to protect
        cwd = None
    if cwd is not None and (resolved == cwd or resolved in cwd.parents):
        raise MtkitError(f"{out_dir}: is the current directory or one of its parents; choose another directory")
    if not out_dir.exists() and not out_dir.is_symlink():
        return
    if not out_dir.is_dir():
        raise MtkitError(f"{out_dir}: exists already and is not a directory; check it or choose another path")
    entries = sorted(p.name for p in out_dir.iterdir())
    if not entries:
        return
    if MANIFEST not in entries:
        raise MtkitError(f"{out_dir}: holds files mtkit did not write (no {MANIFEST}); choose another directory")
    if not _written_by_mtkit(out_dir / MANIFEST):
        raise MtkitError(f"{out_dir}: holds files mtkit did not write ({MANIFEST} is not mtkit's);"
                         " choose another directory")
    foreign = [name for name in entries if not _OUTPUT_NAME.fullmatch(name) or (out_dir / name).is_dir()]
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise MtkitError(f"{out_dir}: holds files mtkit did not write ({shown}); move them out or choose"
                         " another directory")


# --------------------------------------------------------------------- workers

_STATE: tuple[Vocab, Any, CleanConfig, np.dtype, int | None, str] | None = None


def _init_worker(models: tuple[bytes, bytes | None], clean: CleanConfig, dtype: str, tag: int | None = None,
                 tag_side: str = "source", parent: int | None = None) -> None:
    global _STATE
    if parent is not None:
        die_with_parent(parent)
    _STATE = (Vocab.from_bytes(*models), make_normalizer(clean), clean, np.dtype(dtype), tag, tag_side)


def _flat(ids: list[list[int]], total: int, dtype: np.dtype) -> np.ndarray:
    return np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=total)


def _encode_chunk(pairs: list[tuple[str, str]]) -> dict:
    """Normalize, encode and length-filter one chunk of training pairs (runs in a worker)."""
    assert _STATE is not None
    vocab, normalize, clean, dtype, tag, tag_side = _STATE
    srcs, tgts = [], []
    empty = 0
    for s, t in pairs:
        s, t = normalize(s), normalize(t)
        if clean.drop_empty and (not s or not t):
            empty += 1
            continue
        srcs.append(s)
        tgts.append(t)
    src_ids, tgt_ids = vocab.encode_src_batch(srcs), vocab.encode_tgt_batch(tgts)
    src_lens = np.fromiter(map(len, src_ids), dtype=np.int32, count=len(src_ids))
    tgt_lens = np.fromiter(map(len, tgt_ids), dtype=np.int32, count=len(tgt_ids))
    keep, too_long, ratio = length_mask(src_lens, tgt_lens, clean)
    if too_long or ratio:
        src_ids = list(itertools.compress(src_ids, keep))
        tgt_ids = list(itertools.compress(tgt_ids, keep))
        srcs = list(itertools.compress(srcs, keep))
        tgts = list(itertools.compress(tgts, keep))
        src_lens, tgt_lens = src_lens[keep], tgt_lens[keep]
    hashes = None
    if clean.dedup:
        hashes = np.fromiter(map(pair_hash, srcs, tgts), dtype=np.uint64, count=len(srcs))
    # A multilingual store: the target-language tag leads every source, or every target with
    # data.tag_side "target" (not counted by max_len either way).
    if tag is not None and tag_side == "source":
        src_ids = [[tag, *ids] for ids in src_ids]
        src_lens = src_lens + 1
    elif tag is not None:
        tgt_ids = [[tag, *ids] for ids in tgt_ids]
        tgt_lens = tgt_lens + 1
    return {
        "src_ids": _flat(src_ids, int(src_lens.sum()), dtype), "src_lens": src_lens,
        "tgt_ids": _flat(tgt_ids, int(tgt_lens.sum()), dtype), "tgt_lens": tgt_lens,
        "hashes": hashes, "dropped": {"empty": empty, "too_long": too_long, "ratio": ratio},
    }


def _chunks(pairs: Iterable[tuple[str, str]], size: int) -> Iterator[list[tuple[str, str]]]:
    it = iter(pairs)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def _select(ids: np.ndarray, lens: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keep whole examples of a flat id array ``(sum(lens),)`` by a per-example mask ``(B,)``."""
    return ids[np.repeat(keep, lens)], lens[keep]


def _progress(progress: bool, desc: str):
    from tqdm import tqdm

    return tqdm(desc=desc, unit=" pairs", unit_scale=True, disable=not progress, file=sys.stderr,
                dynamic_ncols=True, mininterval=0.5)


# ---------------------------------------------------------------------- passes


def _sample_for_spm(data: DataConfig, progress: bool) -> tuple[list[str], list[str], int]:
    """Pass 1: reservoir-sample sentences for SentencePiece; returns (src, tgt, pairs read)."""
    clean, spm_cfg = data.clean, data.spm
    normalize = make_normalizer(clean)
    # A joint model sees both sides of each sampled pair: sample_size sentences in all.
    capacity = max(1, spm_cfg.sample_size // 2 if spm_cfg.joint else spm_cfg.sample_size)
    rng = random.Random(0)
    reservoir: list[tuple[str, str]] = []
    seen = read = 0
    pairs = iter_pairs(data.train, data.src_lang, data.tgt_lang, clean.invalid_utf8, "train")
    with _progress(progress, "train: sample for SentencePiece") as bar:
        for s, t in pairs:
            read += 1
            if read % 10000 == 0:
                bar.update(10000)
            s, t = normalize(s), normalize(t)
            if not s or not t or not within_words(s, t, clean.max_len):
                continue
            seen += 1
            if len(reservoir) < capacity:
                reservoir.append((s, t))
            else:
                j = rng.randrange(seen)
                if j < capacity:
                    reservoir[j] = (s, t)
        bar.update(read % 10000)
    return [s for s, _ in reservoir], [t for _, t in reservoir], read


@dataclasses.dataclass(frozen=True)
class _Part:
    """What one pass over a split reads: a single-pair recipe's split, or one pair's of ``data.pairs``."""

    source: SourceConfig | None
    src_lang: str
    tgt_lang: str
    key: str | None = None  # the config key errors name (None: data.<split>)
    tag: int | None = None  # the target-language tag id that leads each source (multilingual) ...
    tag_side: str = "source"  # ... or each target (data.tag_side)

    def pairs(self, split: str, invalid_utf8: str, skipped: collections.Counter | None = None):
        return iter_pairs(self.source, self.src_lang, self.tgt_lang, invalid_utf8, split, skipped=skipped,
                          key=self.key, demo_languages=self.tag is not None)


def _single(data: DataConfig, split: str) -> _Part:
    return _Part(getattr(data, split), data.src_lang, data.tgt_lang)


def _encode_train(data: DataConfig, vocab: Vocab, out_dir: Path, workers: int, progress: bool,
                  part: _Part | None = None, writer: ParallelStoreWriter | None = None) -> dict:
    """Pass 2: encode the training pairs in parallel into the store; returns split stats and drops.

    ``part``: one pair of a multilingual recipe, appended to ``writer`` (which the caller closes);
    by default the recipe's one pair into a store of its own."""
    clean = data.clean
    dtype = id_dtype(max(vocab.src_size, vocab.tgt_size))
    skipped: collections.Counter = collections.Counter()
    dropped = dict.fromkeys(RULES, 0)
    own_writer = writer is None
    part = part or _single(data, "train")
    if writer is None:  # (not `writer or …`: an empty writer is falsy)
        writer = ParallelStoreWriter(out_dir, "train", dtype)
    first = len(writer)
    dedup = Deduplicator() if clean.dedup else None
    read = 0

    def take(result: dict) -> None:
        for rule, n in result["dropped"].items():
            dropped[rule] += n
        src_ids, src_lens = result["src_ids"], result["src_lens"]
        tgt_ids, tgt_lens = result["tgt_ids"], result["tgt_lens"]
        if dedup is not None:
            keep = dedup.keep(result["hashes"])
            if not keep.all():
                dropped["duplicate"] += int((~keep).sum())
                src_ids, src_lens = _select(src_ids, src_lens, keep)
                tgt_ids, tgt_lens = _select(tgt_ids, tgt_lens, keep)
        writer.add_batch(src_ids, src_lens, tgt_ids, tgt_lens)

    def counted(chunks: Iterator[list]) -> Iterator[list]:
        nonlocal read
        for chunk in chunks:
            read += len(chunk)
            yield chunk

    pairs = part.pairs("train", clean.invalid_utf8, skipped)
    chunks = counted(_chunks(pairs, CHUNK_PAIRS))
    models = vocab.model_bytes() if vocab.pieces() is None else (*vocab.model_bytes(), vocab.pieces())
    init_args = (models, clean, dtype.name, part.tag, part.tag_side)
    with _progress(progress, "train: encode") as bar:
        if workers <= 1:
            _init_worker(*init_args)
            for chunk in chunks:
                take(_encode_chunk(chunk))
                bar.update(len(chunk))
        else:
            with _pool_context().Pool(workers, _init_worker, (*init_args, os.getpid())) as pool:
                pending: collections.deque = collections.deque()
                for chunk in chunks:
                    pending.append((len(chunk), pool.apply_async(_encode_chunk, (chunk,))))
                    if len(pending) >= 2 * workers:  # bounded: the reader never runs far ahead
                        n, result = pending.popleft()
                        take(result.get())
                        bar.update(n)
                while pending:
                    n, result = pending.popleft()
                    take(result.get())
                    bar.update(n)
    dropped["invalid_utf8"] = skipped["invalid_utf8"]
    stats = writer.close() if own_writer else {"start": first, "pairs": len(writer) - first}
    stats["read"] = read + skipped["invalid_utf8"]
    return {"stats": stats, "dropped": dropped}


def _encode_eval(data: DataConfig, split: str, vocab: Vocab, out_dir: Path) -> dict:
    """Validation/test: normalize only, keep every line; write the store and the cleaned text."""
    writer = ParallelStoreWriter(out_dir, split, id_dtype(max(vocab.src_size, vocab.tgt_size)))
    with open(out_dir / f"{split}.src.txt", "w", encoding="utf-8") as fs, \
            open(out_dir / f"{split}.tgt.txt", "w", encoding="utf-8") as ft:
        skipped = _append_eval(data, _single(data, split), split, vocab, writer, fs, ft)
    stats = writer.close()
    stats["read"] = stats["pairs"] + skipped
    if stats["pairs"] == 0:
        raise MtkitError(f"data.{split}: the {split} set is empty")
    return {"stats": stats, "dropped": {"invalid_utf8": skipped}}


def _append_eval(data: DataConfig, part: _Part, split: str, vocab: Vocab, writer: ParallelStoreWriter, fs, ft) -> int:
    """Append one validation/test source to ``writer`` and the text files; returns the invalid lines skipped."""
    normalize = make_normalizer(data.clean)
    skipped: collections.Counter = collections.Counter()
    for chunk in _chunks(part.pairs(split, data.clean.invalid_utf8, skipped), CHUNK_PAIRS):
        # A newline inside an HF example would break line alignment of the text files.
        srcs = [normalize(s).replace("\n", " ") for s, _ in chunk]
        tgts = [normalize(t).replace("\n", " ") for _, t in chunk]
        fs.writelines(s + "\n" for s in srcs)
        ft.writelines(t + "\n" for t in tgts)
        for s_ids, t_ids in zip(vocab.encode_src_batch(srcs), vocab.encode_tgt_batch(tgts)):
            if part.tag is not None and part.tag_side == "source":
                s_ids = [part.tag, *s_ids]
            elif part.tag is not None:
                t_ids = [part.tag, *t_ids]
            writer.add(s_ids, t_ids)
    return skipped["invalid_utf8"]


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
    if data.train is None and not data.pairs:
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
            log(f"warning: data.spm.vocab_size {spm_cfg.vocab_size} is more than this training sample supports;"
                f" the {name} has {size} pieces")
    return vocab, info


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
    if spm_cfg.joint:
        models = (train_model(srcs + tgts, spm_cfg, workers), None)
    else:
        models = (train_model(srcs, spm_cfg, workers), train_model(tgts, spm_cfg, workers))
    timings["spm_train"] = round(time.perf_counter() - start, 2)
    info = {"trained": True, "sample_pairs": len(srcs), "sample_sentences": len(srcs) * (2 if spm_cfg.joint else 1)}
    return models, info, timings


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
    from mtkit.data.languages import config_pairs, tag_piece, targets

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
    pairs = None
    if data.pairs:
        pairs = _build_pairs(data, vocab, out_dir, workers, progress, timings, splits, dropped)
    elif data.train is not None:
        start = time.perf_counter()
        result = _encode_train(data, vocab, out_dir, workers, progress)
        timings["encode_train"] = round(time.perf_counter() - start, 2)
        splits["train"], dropped["train"] = result["stats"], result["dropped"]
        drops = ", ".join(f"{rule} {n}" for rule, n in result["dropped"].items())
        log(f"train: kept {result['stats']['pairs']} of {result['stats']['read']} pairs (dropped: {drops})")
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
            log(f"{split}: kept {result['stats']['pairs']} pairs"
                + (f" (skipped {result['dropped']['invalid_utf8']} invalid UTF-8)" if result["dropped"]["invalid_utf8"]
                   else ""))
    timings["total"] = round(time.perf_counter() - total_start, 2)
    manifest = {
        "format": MANIFEST_FORMAT,
        "mtkit_version": mtkit.__version__,
        "fingerprint": fp,
        "src_lang": data.src_lang,
        "tgt_lang": data.tgt_lang,
        "sources": {s: config_to_dict(getattr(data, s)) for s in SPLITS if getattr(data, s) is not None},
        "clean": config_to_dict(data.clean),
        "dropped": dropped,
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
    if pairs is not None:  # a multilingual store: its pairs replace the single pair's languages and sources
        for key in ("src_lang", "tgt_lang", "sources"):
            del manifest[key]
        manifest["pairs"] = pairs
    return manifest


def _build_pairs(data: DataConfig, vocab: Vocab, out_dir: Path, workers: int, progress: bool, timings: dict,
                 splits: dict, dropped: dict) -> list[dict]:
    """Encode every pair of a multilingual recipe into one store per split, pair after pair (each a
    contiguous segment of its split), each source (or target: ``data.tag_side``) led by its target-language
    tag; fills ``splits``,
    ``dropped`` and ``timings`` and returns the manifest's ``pairs``: languages, tag, sources, and
    per split the segment's ``start`` and ``pairs`` (and for train what cleaning dropped)."""
    from mtkit.data.languages import Pair, tag_id, tag_piece

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
            drops = ", ".join(f"{rule} {n}" for rule, n in result["dropped"].items())
            log(f"train {entry['name']}: kept {result['stats']['pairs']} of {result['stats']['read']} pairs "
                f"(dropped: {drops})")
            if result["stats"]["pairs"] == 0:
                raise MtkitError(f"{part.key}: no training pairs left after cleaning ({result['stats']['read']} read; "
                                 f"dropped: {drops})")
        splits["train"] = writer.close()
        splits["train"]["read"] = sum(e["splits"]["train"]["read"] for e in entries if "train" in e["splits"])
        dropped["train"] = {rule: sum(e["dropped"]["train"][rule] for e in entries if "train" in e["dropped"])
                            for rule in RULES}
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
                log(f"{split} {entry['name']}: kept {len(writer) - first} pairs")
        splits[split] = writer.close()
        splits[split]["read"] = splits[split]["pairs"] + skipped
        dropped[split] = {"invalid_utf8": skipped}
        timings[f"encode_{split}"] = round(time.perf_counter() - start, 2)
    return entries


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
    if data.train is None and data.valid is None and data.test is None and not data.pairs:
        raise MtkitError("data: no source configured (set data.train, data.valid or data.test)")
    fp = fingerprint(data, vocab_models)
    _remove_dead_leftovers(out_dir)
    existing = read_manifest(out_dir) if out_dir.is_dir() else None
    if existing is not None and existing.get("fingerprint") == fp and not force:
        log(f"{out_dir}: already prepared from identical inputs; reusing it (`mtkit prepare --force` rebuilds it)")
        return existing
    _check_out_dir(out_dir)  # before the work, so that a refusal costs nothing
    workers = data.workers if data.workers > 0 else (os.cpu_count() or 1)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-{_owner()}-", dir=out_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would otherwise stick to out_dir
    try:
        manifest = build(data, tmp, workers, progress, fp, vocab_models)
        atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
        for path in tmp.iterdir():  # atomic writes create 0600 files; give them the usual mode
            os.chmod(path, 0o666 & ~umask)
        _replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"{out_dir}: prepared in {manifest['timings_s']['total']:.1f} s")
    return manifest


def _replace_dir(new: Path, out_dir: Path) -> None:
    """Move ``new`` onto ``out_dir``; an old result loses its manifest first, so it never looks complete."""
    _check_out_dir(out_dir)  # again: the user may have added files during a long build
    if out_dir.exists():
        with contextlib.suppress(FileNotFoundError):
            (out_dir / MANIFEST).unlink()
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-{_owner()}-", dir=out_dir.parent))
        os.replace(out_dir, old / "dir")
        os.replace(new, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, out_dir)

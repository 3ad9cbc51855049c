"""The passes over a corpus that prepare makes: the SentencePiece sample (a reservoir of at most
``spm.sample_size`` sentences), the encoding of training pairs in a pool of workers (normalize, drop
empty sides, encode, apply the length and ratio rules; duplicates removed in the main process; at most
``2 * workers`` chunks in flight, so memory stays flat whatever the corpus size), and the validation
and test sets (normalized, every line kept, also written as cleaned text).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import random
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from mtkit.config import CleanConfig, DataConfig, SourceConfig
from mtkit.data.alignments import EFLOMAL, LINK_DTYPE, AlignmentWriter, eflomal_blocks, file_alignments, piece_links
from mtkit.data.cleaning import Deduplicator, length_mask, make_normalizer, pair_hash, within_words
from mtkit.data.filters import dual_xent_keep, filter_names, make_filters, with_dual_xent
from mtkit.data.sources import iter_pairs
from mtkit.data.store import ParallelStoreWriter, id_dtype
from mtkit.data.vocab import Vocab
from mtkit.data.word_alignment import parse_pharaoh
from mtkit.data.workdir import _pool_context, die_with_parent
from mtkit.errors import MtkitError

SPLITS = ("train", "valid", "test")
CHUNK_PAIRS = 8192  # pairs per task sent to an encoding worker




# --------------------------------------------------------------------- workers

_STATE: tuple[Vocab, Any, CleanConfig, np.dtype, int | None, str, list] | None = None


def _init_worker(models: tuple[bytes, bytes | None], clean: CleanConfig, dtype: str, tag: int | None = None,
                 tag_side: str = "source", langs: tuple[str, str] = ("", ""), parent: int | None = None) -> None:
    global _STATE
    if parent is not None:
        die_with_parent(parent)
    _STATE = (Vocab.from_bytes(*models), make_normalizer(clean), clean, np.dtype(dtype), tag, tag_side,
              make_filters(clean.filters, *langs))


class _Drops:
    """What one chunk's rules and filters dropped: counts, and the first ``limit`` examples of each
    ({"pair": number in data.train, "src", "tgt", "why"})."""

    def __init__(self, limit: int) -> None:
        self.counts: collections.Counter = collections.Counter()
        self.examples: dict[str, list[dict]] = {}
        self.limit = limit

    def add(self, rule: str, number: int, src: str | None, tgt: str | None, why: str) -> None:
        self.counts[rule] += 1
        kept = self.examples.setdefault(rule, [])
        if len(kept) < self.limit:
            kept.append({"pair": number, "src": _clip(src), "tgt": _clip(tgt), "why": why} if src is not None
                        else {"pair": number, "why": why})


EXAMPLE_CHARS = 500  # of each side of an example kept in the manifest (a crawled line can be megabytes)


def _clip(text: str | None) -> str | None:
    return text if text is None or len(text) <= EXAMPLE_CHARS else text[: EXAMPLE_CHARS - 1] + "…"


def _flat(ids: list[list[int]], total: int, dtype: np.dtype) -> np.ndarray:
    return np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=total)


def _encode_chunk(pairs: list[tuple[str, str]], first: int = 0, alignments: list[str] | None = None,
                  dual: list[tuple[bool, float]] | None = None, where: str = "data.alignments") -> dict:
    """Normalize, filter, encode and length-filter one chunk of training pairs (runs in a worker); pair ``k`` is
    pair ``first + k + 1`` of data.train. With ``alignments`` (a Pharaoh line per pair, from ``where``), each
    kept pair's piece links; with ``dual``, each pair's (kept, score) under the dual cross-entropy filter."""
    assert _STATE is not None
    vocab, normalize, clean, dtype, tag, tag_side, filters = _STATE
    drops = _Drops(clean.examples)
    srcs, tgts, numbers, aligned = [], [], [], []
    for k, (s, t) in enumerate(pairs):
        s, t = normalize(s), normalize(t)
        number = first + k + 1
        if clean.drop_empty and (not s or not t):
            drops.add("empty", number, s, t, f"{'source' if not s else 'target'} empty")
            continue
        why = None
        for name, test in filters:
            if (why := test(s, t)) is not None:
                drops.add(name, number, s, t, why)
                break
        if why is not None:
            continue
        if dual is not None and not dual[k][0]:
            drops.add("dual_xent", number, s, t, f"score {dual[k][1]:.3f}")
            continue
        srcs.append(s)
        tgts.append(t)
        numbers.append(number)
        if alignments is not None:
            aligned.append((alignments[k], number))
    src_ids, tgt_ids = vocab.encode_src_batch(srcs), vocab.encode_tgt_batch(tgts)
    src_lens = np.fromiter(map(len, src_ids), dtype=np.int32, count=len(src_ids))
    tgt_lens = np.fromiter(map(len, tgt_ids), dtype=np.int32, count=len(tgt_ids))
    keep, too_long, ratio = length_mask(src_lens, tgt_lens, clean)
    if too_long or ratio:
        for i in np.flatnonzero(~keep).tolist():
            n_s, n_t = int(src_lens[i]), int(tgt_lens[i])
            if clean.max_len > 0 and max(n_s, n_t) > clean.max_len:
                drops.add("too_long", numbers[i], srcs[i], tgts[i], f"{n_s} | {n_t} tokens > {clean.max_len}")
            else:
                drops.add("ratio", numbers[i], srcs[i], tgts[i], f"{n_s} | {n_t} tokens")
        src_ids = list(itertools.compress(src_ids, keep))
        tgt_ids = list(itertools.compress(tgt_ids, keep))
        srcs = list(itertools.compress(srcs, keep))
        tgts = list(itertools.compress(tgts, keep))
        numbers = list(itertools.compress(numbers, keep))
        aligned = list(itertools.compress(aligned, keep)) if alignments is not None else aligned
        src_lens, tgt_lens = src_lens[keep], tgt_lens[keep]
    hashes = None
    if clean.dedup:
        hashes = np.fromiter(map(pair_hash, srcs, tgts), dtype=np.uint64, count=len(srcs))
    links = _piece_links(vocab, srcs, tgts, aligned, where) if alignments is not None else None
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
        "hashes": hashes, "numbers": np.asarray(numbers, dtype=np.int64), "dropped": dict(drops.counts),
        "examples": drops.examples, "links": links,
    }


def _piece_links(vocab: Vocab, srcs: list[str], tgts: list[str], aligned: list[tuple[str, int]], where: str
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The (source piece, target piece) links of each pair's Pharaoh line: (K, 2) links and (B,) counts."""
    found = [piece_links(parse_pharaoh(line, len(s.split()), len(t.split()), f"{where}: line {number}"),
                         vocab.src_words(s), vocab.tgt_text_words(t))
             for s, t, (line, number) in zip(srcs, tgts, aligned, strict=True)]
    counts = np.fromiter(map(len, found), dtype=np.int64, count=len(found))
    return (np.concatenate(found) if found else np.zeros((0, 2), dtype=LINK_DTYPE)), counts


def _chunks(pairs: Iterable[tuple[str, str]], size: int) -> Iterator[list[tuple[str, str]]]:
    it = iter(pairs)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def _select(ids: np.ndarray, lens: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keep whole examples of a flat id array ``(sum(lens),)`` by a per-example mask ``(B,)``."""
    return ids[np.repeat(keep, lens)], lens[keep]


def _progress(progress: bool, desc: str):
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
    if data.corpora:  # every corpus, one after the other (their weights are training's, not the sample's)
        pairs = itertools.chain.from_iterable(
            iter_pairs(c.train, data.src_lang, data.tgt_lang, clean.invalid_utf8, "train",
                       key=f"data.corpora[{i}].train") for i, c in enumerate(data.corpora))
    else:
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


def rule_names(clean: CleanConfig) -> tuple[str, ...]:
    """The rules and filters a training pair goes through, in order (the report's rows); a rule that is off
    (``drop_empty: false``, ``max_len: 0``, ``max_ratio: 0``, ``dedup: false``) is none of them, so that the
    report never shows it dropping nothing."""
    return ("invalid_utf8", *(("empty",) if clean.drop_empty else ()), *filter_names(clean.filters),
            *(("too_long",) if clean.max_len > 0 else ()), *(("ratio",) if clean.max_ratio > 0 else ()),
            *(("duplicate",) if clean.dedup else ()))


def _encode_train(data: DataConfig, vocab: Vocab, out_dir: Path, workers: int, progress: bool,
                  part: _Part | None = None, writer: ParallelStoreWriter | None = None) -> dict:
    """Pass 2: encode the training pairs in parallel into the store; returns split stats, drops and their
    examples.

    ``part``: one pair of a multilingual recipe, appended to ``writer`` (which the caller closes);
    by default the recipe's one pair into a store of its own."""
    clean = data.clean
    dtype = id_dtype(max(vocab.src_size, vocab.tgt_size))
    skipped: collections.Counter = collections.Counter()
    dropped = dict.fromkeys(rule_names(clean), 0)
    examples: dict[str, list[dict]] = {}
    own_writer = writer is None
    part = part or _single(data, "train")
    if writer is None:  # (not `writer or …`: an empty writer is falsy)
        writer = ParallelStoreWriter(out_dir, "train", dtype)
    first = len(writer)
    dedup = Deduplicator() if clean.dedup else None
    read = 0
    aligner = None
    if data.alignments is not None and own_writer:
        aligner = AlignmentWriter(out_dir, "train")

    def note(rule: str, found: list[dict]) -> None:
        kept = examples.setdefault(rule, [])
        kept.extend(found[: clean.examples - len(kept)])

    def take(result: dict) -> None:
        for rule, n in result["dropped"].items():
            dropped[rule] += n
        for rule, found in result["examples"].items():
            note(rule, found)
        src_ids, src_lens = result["src_ids"], result["src_lens"]
        tgt_ids, tgt_lens = result["tgt_ids"], result["tgt_lens"]
        links = result["links"]
        if dedup is not None:
            keep = dedup.keep(result["hashes"])
            if not keep.all():
                dropped["duplicate"] += int((~keep).sum())
                note("duplicate", [{"pair": int(n), "why": "an earlier pair again"}
                                   for n in result["numbers"][~keep][: clean.examples].tolist()])
                src_ids, src_lens = _select(src_ids, src_lens, keep)
                tgt_ids, tgt_lens = _select(tgt_ids, tgt_lens, keep)
                if links is not None:
                    links = _select(*links, keep)
        writer.add_batch(src_ids, src_lens, tgt_ids, tgt_lens)
        if aligner is not None:
            aligner.add_batch(*links)

    def counted(chunks: Iterator[list]) -> Iterator[tuple[int, list]]:
        nonlocal read
        for chunk in chunks:
            yield read, chunk
            read += len(chunk)

    items: Iterator = ((pair, None, None) for pair in part.pairs("train", clean.invalid_utf8, skipped))
    where = "data.alignments"
    if aligner is not None:
        aligned, where = _with_alignments((pair for pair, _, _ in items), data)
        items = ((pair, line, None) for pair, line in aligned)
    dual = clean.filters.dual_xent if clean.filters is not None else None
    if dual is not None:
        items = _with_dual_xent(items, dual, clean)
    chunks = counted(_chunks(items, CHUNK_PAIRS))
    models = vocab.model_bytes() if vocab.pieces() is None else (*vocab.model_bytes(), vocab.pieces())
    init_args = (models, clean, dtype.name, part.tag, part.tag_side, (part.src_lang, part.tgt_lang))
    with _progress(progress, "train: encode") as bar:
        if workers <= 1:
            _init_worker(*init_args)
            for at, chunk in chunks:
                take(_encode_chunk(*_task(chunk, at, where)))
                bar.update(len(chunk))
        else:
            with _pool_context().Pool(workers, _init_worker, (*init_args, os.getpid())) as pool:
                pending: collections.deque = collections.deque()
                for at, chunk in chunks:
                    pending.append((len(chunk), pool.apply_async(_encode_chunk, _task(chunk, at, where))))
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
    if aligner is not None:
        stats["alignments"] = {"source": data.alignments, **aligner.close()}
    stats["read"] = read + skipped["invalid_utf8"]
    return {"stats": stats, "dropped": dropped, "examples": {r: examples[r] for r in dropped if r in examples}}


def _encode_corpora(data: DataConfig, vocab: Vocab, out_dir: Path, workers: int, progress: bool) -> dict:
    """Pass 2 for ``data.corpora``: each corpus in turn into one store (a contiguous segment each, its sources
    led by its tag when it has one); returns the store's stats, the summed drops and examples, and the
    manifest's ``corpora``: name, tag, and each one's segment, drops and examples."""
    writer = ParallelStoreWriter(out_dir, "train", id_dtype(max(vocab.src_size, vocab.tgt_size)))
    entries = []
    for i, corpus in enumerate(data.corpora):
        tag = None
        if corpus.tag:
            tag = vocab.src_piece_id(corpus.tag)
            if tag is None:
                raise MtkitError(f"data.corpora[{i}].tag: the vocabulary has no piece {corpus.tag} (a given "
                                 "SentencePiece model must reserve it as a user-defined symbol)")
        part = _Part(corpus.train, data.src_lang, data.tgt_lang, f"data.corpora[{i}].train", tag)
        result = _encode_train(data, vocab, out_dir, workers, progress, part, writer)
        entries.append({"name": corpus.name, "tag": corpus.tag, "tag_id": tag, "splits": {"train": result["stats"]},
                        "dropped": {"train": result["dropped"]}, "examples": {"train": result["examples"]}})
    stats = writer.close()
    stats["read"] = sum(e["splits"]["train"]["read"] for e in entries)
    rules = rule_names(data.clean)
    dropped = {rule: sum(e["dropped"]["train"][rule] for e in entries) for rule in rules}
    examples = {rule: [x for e in entries for x in e["examples"]["train"].get(rule, [])][: data.clean.examples]
                for rule in rules if any(rule in e["examples"]["train"] for e in entries)}
    return {"stats": stats, "dropped": dropped, "examples": examples, "corpora": entries}


def _task(chunk: list, first: int, where: str) -> tuple:
    """The arguments of :func:`_encode_chunk` for a chunk of (pair, Pharaoh line or None, (kept, score) or None)."""
    lines = [line for _, line, _ in chunk] if chunk[0][1] is not None else None
    dual = [d for _, _, d in chunk] if chunk[0][2] is not None else None
    return [pair for pair, _, _ in chunk], first, lines, dual, where


def _with_dual_xent(items: Iterator, settings, clean: CleanConfig) -> Iterator:
    """The items with each pair's (kept, score) under the dual cross-entropy filter."""
    if clean.invalid_utf8 != "error":
        raise MtkitError("data.clean.filters.dual_xent: needs data.clean.invalid_utf8: error (a skipped pair "
                         "would shift every score after it)")
    forward, backward = (Path(p).expanduser() for p in (settings.forward, settings.backward))
    mask, score = dual_xent_keep(forward, backward, settings.keep)
    where = f"data.clean.filters.dual_xent ({forward})"
    return ((pair, line, d) for (pair, line, _), d in with_dual_xent(items, mask, score, where))


def _with_alignments(pairs: Iterator[tuple[str, str]], data: DataConfig):
    """The training pairs, each with its Pharaoh line (``data.alignments``: eflomal's, on the normalized pairs,
    or a file's), and what errors call the lines' source."""
    if data.alignments == EFLOMAL:
        normalize = make_normalizer(data.clean)
        return eflomal_blocks((normalize(s), normalize(t)) for s, t in pairs), "eflomal's alignments"
    if data.clean.invalid_utf8 != "error":
        raise MtkitError("data.alignments: a Pharaoh file needs data.clean.invalid_utf8: error (a skipped pair "
                         "would shift every line after it)")
    path = Path(data.alignments).expanduser()
    if not path.exists():  # (a FIFO or a device: refused as not a regular file when it is opened)
        raise MtkitError(f"data.alignments {path}: no such file (eflomal, or a Pharaoh file: a line per pair)")
    return file_alignments(pairs, path), f"data.alignments {path}"


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

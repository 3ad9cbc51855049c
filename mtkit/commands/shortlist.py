"""``mtkit shortlist RUN``: count which target pieces co-occur with each source piece in the run's training pairs
and write RUN/shortlist.txt (:mod:`mtkit.shortlist`), which ``translate --shortlist`` reads and the CTranslate2
export ships as its ``vmap.txt``.

The pairs are the training corpus the run's config names (``data.train``, read from where the run was trained:
relative paths from the current folder), or ``--source FILE --target FILE``; encoded with the run's SentencePiece
model(s), as ``prepare`` encodes them (without its cleaning: the shortlist only counts); at most ``max_pairs``, a
seeded sample of a larger corpus.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from mtkit.checkpoints.io import describe, load_model
from mtkit.config import ConfigError, ShortlistConfig, SourceConfig, check_shortlist
from mtkit.data.sources import iter_pairs
from mtkit.errors import MtkitError, counted
from mtkit.shortlist import count_cooccurrence, select, shortlist_path, source_to_target, write_shortlist
from mtkit.shortlist import describe as describe_shortlist

ENCODE_CHUNK = 10_000  # pairs encoded at once (SentencePiece's batch call)
SAMPLE_SEED = 1


@dataclass(frozen=True)
class ShortlistOptions:
    """``mtkit shortlist``'s options: the pairs (``source``/``target`` files; None: the run's ``data.train``) and
    :class:`mtkit.config.ShortlistConfig`'s settings (None: the run's ``shortlist`` section, else its defaults);
    ``progress``: a bar on stderr when it is a terminal."""

    source: Path | None = None
    target: Path | None = None
    per_source: int | None = None
    frequent: int | None = None
    max_pairs: int | None = None
    progress: bool = True


def _settings(saved: ShortlistConfig, options: ShortlistOptions) -> ShortlistConfig:
    """The run's settings with the flags on top, checked; an error names the flag."""
    given = {k: getattr(options, k) for k in ("per_source", "frequent", "max_pairs") if getattr(options, k) is not None}
    settings = dataclasses.replace(saved, **given)
    try:
        check_shortlist(settings, "shortlist")
    except ConfigError as e:
        message = str(e)
        for key in given:
            message = message.replace(f"shortlist.{key}", "--" + key.replace("_", "-"))
        raise MtkitError(message) from None
    return settings


def _source(config, options: ShortlistOptions) -> tuple[SourceConfig, str]:
    """Where the pairs come from, and how messages name it."""
    if (options.source is None) != (options.target is None):
        raise MtkitError("--source and --target go together (the two sides of the training pairs)")
    if options.source is not None:
        return SourceConfig(kind="files", src=str(options.source), tgt=str(options.target)), "--source/--target"
    if config.data.train is None:
        raise MtkitError("the run names no data.train (a multilingual run): give --source FILE --target FILE")
    return config.data.train, "the run's data.train"


def _sampled(pairs, total: int, keep: int, seed: int) -> Iterator[tuple[str, str]]:
    """``keep`` of ``total`` pairs, chosen at random with ``seed`` (all of them when there are no more)."""
    if total <= keep:
        yield from pairs
        return
    chosen = np.zeros(total, dtype=bool)
    chosen[np.random.default_rng(seed).choice(total, size=keep, replace=False)] = True
    for i, pair in enumerate(pairs):
        if i < total and chosen[i]:
            yield pair


def _encoded(pairs, vocab) -> Iterator[tuple[list[int], list[int]]]:
    """(source ids, target ids) of raw pairs, encoded a chunk at a time."""
    pairs = iter(pairs)
    while chunk := list(itertools.islice(pairs, ENCODE_CHUNK)):
        srcs = vocab.encode_src_batch([s for s, _ in chunk])
        tgts = vocab.encode_tgt_batch([t for _, t in chunk])
        yield from zip(srcs, tgts)


def build_shortlist(run: Path, options: ShortlistOptions = ShortlistOptions()) -> Path:
    """Build and write ``run``'s shortlist (a run directory, or a checkpoint in one); return its path."""
    loaded = load_model(run, "cpu")
    settings = _settings(loaded.config.shortlist, options)
    source, named = _source(loaded.config, options)
    data = loaded.config.data

    def pairs():
        try:
            yield from iter_pairs(source, data.src_lang, data.tgt_lang, invalid_utf8="skip")
        except MtkitError as e:
            raise MtkitError(f"{e} ({named}; give other files with --source FILE --target FILE)") from None

    total = sum(1 for _ in pairs())
    if total == 0:
        raise MtkitError(f"{named}: no training pairs to count")
    keep = min(total, settings.max_pairs)
    vocab = loaded.vocab
    with tqdm(total=keep, unit=" pairs", unit_scale=True, file=sys.stderr, dynamic_ncols=True, mininterval=0.5,
              disable=not (options.progress and sys.stderr.isatty()), desc="counting") as bar:
        counts = count_cooccurrence(_encoded(_sampled(pairs(), total, keep, SAMPLE_SEED), vocab), vocab.src_size,
                                    vocab.tgt_size, progress=bar)
    shortlist = select(counts, settings.per_source, settings.frequent, source_to_target(vocab))
    out = shortlist_path(run if Path(run).is_dir() else loaded.path)
    write_shortlist(out, shortlist, vocab)
    sample = f" (a sample of {total:,})" if keep < total else ""
    print(f"wrote {out} from {describe(loaded)}: {describe_shortlist(shortlist)}; "
          f"{counted(keep, 'training pair', spec=',')}{sample}, per source piece {settings.per_source}, "
          f"frequent {settings.frequent}", file=sys.stderr)
    return out

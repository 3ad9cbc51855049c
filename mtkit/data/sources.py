"""Corpus readers: stream (source, target) pairs from files, TSV, Hugging Face or the demo.

Every reader streams: nothing holds the whole corpus in memory. Each user error
(missing file, line-count mismatch, invalid UTF-8, absent language key) raises
:class:`MtkitError` with one line naming the file and line or the config key.
"""

from __future__ import annotations

import collections
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mtkit.config import SourceConfig
from mtkit.data.synthetic import LANGUAGES, demo_pairs
from mtkit.errors import MtkitError, counted
from mtkit.io import count_lines, open_regular, read_lines

# mtkit's split names -> the names Hugging Face datasets usually use.
HF_SPLIT_NAMES = {"train": "train", "valid": "validation", "test": "test"}


def iter_pairs(
    source: SourceConfig,
    src_lang: str,
    tgt_lang: str,
    invalid_utf8: str = "error",
    split_name: str = "train",
    skipped: collections.Counter | None = None,
    key: str | None = None,
    demo_languages: bool = False,
) -> Iterator[tuple[str, str]]:
    """Yield the raw (source, target) pairs of one split, streaming.

    Args:
        source: where the split comes from (``data.<split_name>`` in the config).
        src_lang, tgt_lang: language codes; the HF readers use them as keys.
        invalid_utf8: ``'error'`` raises on an undecodable line; ``'skip'`` drops
            the pair and counts it in ``skipped['invalid_utf8']``.
        split_name: ``train``, ``valid`` or ``test``; names the config key in errors
            and picks the HF split and demo split.
        skipped: optional counter that receives the number of skipped pairs.
        key: the config key errors name (default ``data.<split_name>``; ``data.pairs[i].<split>``).
        demo_languages: the demo corpus in ``src_lang`` -> ``tgt_lang`` (any two of en, de, fr: a
            pair of a multilingual recipe), where a single-pair recipe's is always en -> de.
    """
    key = key or f"data.{split_name}"
    if source.kind == "files":
        if not source.src or not source.tgt:
            raise MtkitError(f"{key}: kind 'files' needs both '{key}.src' and '{key}.tgt'")
        return _iter_files(Path(source.src), Path(source.tgt), invalid_utf8, skipped)
    if source.kind == "tsv":
        if not source.path:
            raise MtkitError(f"{key}: kind 'tsv' needs '{key}.path'")
        return _iter_tsv(Path(source.path), invalid_utf8, skipped)
    if source.kind == "hf":
        if not source.name:
            raise MtkitError(f"{key}: kind 'hf' needs '{key}.name' (a hub name or a local folder)")
        return _iter_hf(source, src_lang, tgt_lang, split_name)
    if source.kind == "demo":
        if source.size <= 0:
            raise MtkitError(f"{key}.size: must be positive, got {source.size}")
        if not demo_languages:
            return demo_pairs(source.size, source.seed, split_name)

        for lang in (src_lang, tgt_lang):
            if lang not in LANGUAGES:
                raise MtkitError(f"{key}: the demo corpus has {', '.join(LANGUAGES)}, not {lang!r}")
        return demo_pairs(source.size, source.seed, split_name, src_lang, tgt_lang)
    raise MtkitError(f"{key}.kind: unknown kind {source.kind!r}")  # the config loader already checks


def _check_file(path: Path) -> None:
    """A one-line error unless ``path`` is a regular file (a FIFO would hang, ``/dev/zero`` never end)."""
    open_regular(path, "no such file", "is a directory, expected a file").close()


def _iter_files(
    src: Path, tgt: Path, invalid_utf8: str, skipped: collections.Counter | None
) -> Iterator[tuple[str, str]]:
    for path in (src, tgt):  # fail before the first pair, not in the middle of a pass
        _check_file(path)
    end = object()
    for s, t in itertools.zip_longest(read_lines(src, invalid_utf8), read_lines(tgt, invalid_utf8), fillvalue=end):
        if s is end or t is end:
            raise MtkitError(
                f"{src} has {counted(count_lines(src), 'line')} but {tgt} has {count_lines(tgt)}: "
                "parallel files must align"
            )
        if s is None or t is None:
            if skipped is not None:
                skipped["invalid_utf8"] += 1
            continue
        yield s, t


def _iter_tsv(path: Path, invalid_utf8: str, skipped: collections.Counter | None) -> Iterator[tuple[str, str]]:
    _check_file(path)
    for number, line in enumerate(read_lines(path, invalid_utf8), start=1):
        if line is None:
            if skipped is not None:
                skipped["invalid_utf8"] += 1
            continue
        src, tab, tgt = line.partition("\t")
        if not tab:
            raise MtkitError(f"{path}: line {number}: expected 'source<TAB>target', found no tab")
        yield src, tgt


def _load_hf(source: SourceConfig, split_name: str) -> Any:
    """``datasets.load_dataset`` for a hub name or a local folder (one code path)."""
    import datasets

    split = source.split or HF_SPLIT_NAMES[split_name]
    name = source.name
    if Path(name).expanduser().exists():
        name = str(Path(name).expanduser().resolve())
    datasets.logging.set_verbosity_error()
    if not sys.stderr.isatty():
        datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(name, source.config, split=split, streaming=source.streaming)
    except Exception as e:  # noqa: BLE001 -- missing data, unknown config or split, no network: all the user's
        lines = str(e).strip().splitlines()
        reason = lines[0] if lines else type(e).__name__
        raise MtkitError(
            f"data.{split_name}: cannot load Hugging Face dataset {source.name!r}"
            f" (config {source.config!r}, split {split!r}): {reason}"
        ) from None


def _iter_hf(source: SourceConfig, src_lang: str, tgt_lang: str, split_name: str) -> Iterator[tuple[str, str]]:
    dataset = _load_hf(source, split_name)
    key = f"data.{split_name}"
    columns = list(dataset.column_names or [])
    where = f"{source.name!r}" + (f" (config {source.config!r})" if source.config else "")
    if "translation" in columns and not (source.src_field or source.tgt_field):
        # The hub's translation layout: {"translation": {"de": ..., "en": ...}}.
        for number, row in enumerate(dataset, start=1):
            pair = row["translation"]
            if src_lang not in pair or tgt_lang not in pair:
                missing = src_lang if src_lang not in pair else tgt_lang
                raise MtkitError(
                    f"{key}: dataset {where} row {number} has no language '{missing}' in 'translation';"
                    f" keys present: {', '.join(sorted(pair))} (set data.src_lang / data.tgt_lang)"
                )
            yield _text(pair[src_lang], key, number), _text(pair[tgt_lang], key, number)
        return
    src_field = source.src_field or src_lang
    tgt_field = source.tgt_field or tgt_lang
    if columns:
        for field, option, lang in ((src_field, "src_field", "src_lang"), (tgt_field, "tgt_field", "tgt_lang")):
            if field not in columns:
                raise MtkitError(
                    f"{key}: dataset {where} has no column '{field}'; keys present: {', '.join(columns)}"
                    f" (set {key}.{option} or data.{lang})"
                )
    for number, row in enumerate(dataset, start=1):
        if src_field not in row or tgt_field not in row:
            raise MtkitError(
                f"{key}: dataset {where} row {number} lacks '{src_field}' or '{tgt_field}';"
                f" keys present: {', '.join(row)}"
            )
        yield _text(row[src_field], key, number), _text(row[tgt_field], key, number)


def _text(value: Any, key: str, number: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MtkitError(f"{key}: row {number}: expected a string, got {type(value).__name__}")
    return value


def source_files(source: SourceConfig) -> list[Path]:
    """The local files (or folder contents) a source reads, for the input fingerprint."""
    if source.kind == "files":
        return [Path(p) for p in (source.src, source.tgt) if p]
    if source.kind == "tsv":
        return [Path(source.path)] if source.path else []
    if source.kind == "hf" and source.name and Path(source.name).expanduser().is_dir():
        folder = Path(source.name).expanduser()
        return sorted(p for p in folder.rglob("*") if p.is_file() and ".cache" not in p.parts)
    return []

"""``mtkit prepare``: clean the corpus, build the SentencePiece vocabulary and binarize it."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from mtkit.checkpoints.io import load_checkpoint, resolve_checkpoint
from mtkit.config import Config, load_config
from mtkit.config.loader import read_yaml
from mtkit.data.prepare import prepare_data
from mtkit.data.report import cleaning_report, write_report
from mtkit.errors import MtkitError
from mtkit.io import output_target


def checkpoint_vocab(path: str | Path) -> tuple:
    """The SentencePiece model(s) stored in a checkpoint, or in a run directory's checkpoint (picked as
    ``mtkit translate -m RUN`` picks it), for ``data.spm.vocab_from``; errors name the path. An imported
    model's piece table (``vocab.pieces``, mtkit.importers) comes third, as ``Vocab.from_bytes`` takes it."""
    try:
        ckpt = load_checkpoint(resolve_checkpoint(path), mmap=True)  # its tensors are never read
    except MtkitError as e:
        raise MtkitError(f"data.spm.vocab_from: {e}") from None
    if ckpt["vocab"].get("pieces") is not None:
        return ckpt["vocab"]["src"], ckpt["vocab"].get("tgt"), ckpt["vocab"]["pieces"]
    return ckpt["vocab"]["src"], ckpt["vocab"].get("tgt")


def prepare(config: Config, out_dir: Path, force: bool = False, progress: bool | None = None) -> dict:
    """Prepare ``config.data`` into ``out_dir`` and return its manifest.

    Identical inputs reuse a complete earlier result unless ``force``. A rebuild (``force``
    or changed inputs) replaces ``out_dir`` only if it is empty or an earlier mtkit result
    holding nothing else; ``progress=None`` shows progress bars only when stderr is a
    terminal. With ``data.spm.vocab_from`` the data is encoded with that checkpoint's
    vocabulary, as a run that starts from it needs. User errors raise ``MtkitError``.
    """
    vocab_from = config.data.spm.vocab_from
    models = checkpoint_vocab(vocab_from) if vocab_from else None
    return prepare_data(config.data, Path(out_dir), force=force, progress=progress, vocab_models=models)


LANGUAGE_FILTERS = ("langid",)  # the filters that judge a pair by its languages


def _check_languages(config: Config, recipe: Path | None, overrides: list[str], flags: dict) -> str | None:
    """A single pair's languages are data.src_lang / data.tgt_lang, en and de when neither the recipe, a --set nor
    --src-lang / --tgt-lang names them. As fairseq-preprocess asks for -s/-t: a filter that judges the languages
    needs them given (an assumed en-de would drop a fr-cs corpus whole); otherwise returns a note that says what
    is assumed (None for languages given, or the demo's corpus: en-de by definition)."""
    data = config.data
    if data.pairs or (data.train is not None and data.train.kind == "demo"):
        return None
    section = (read_yaml(recipe) if recipe is not None else {}).get("data")
    named = {k for k in ("src_lang", "tgt_lang") if isinstance(section, dict) and k in section}
    named |= {k for k in ("src_lang", "tgt_lang") if f"data.{k}" in flags}
    named |= {k for k in ("src_lang", "tgt_lang") for text in overrides if text.startswith((f"data.{k}=", "data="))}
    if len(named) == 2:
        return None
    missing = " and ".join(f"--{k.replace('_', '-')}" for k in ("src_lang", "tgt_lang") if k not in named)
    filters = data.clean.filters
    on = [name for name in LANGUAGE_FILTERS if filters is not None and getattr(filters, name) is not None]
    if on:
        raise MtkitError(f"data.clean.filters.{on[0]}: needs the corpus's languages, but the recipe and flags give "
                         f"no {missing} (the pair {data.src_lang}-{data.tgt_lang} would be assumed); give {missing} "
                         "(or data.src_lang / data.tgt_lang)")
    return (f"note: no {missing} given: the corpus is taken as {data.src_lang}-{data.tgt_lang}; give {missing} to "
            "name its languages")


@dataclass(frozen=True)
class DataFlags:
    """``mtkit prepare``'s data flags, one field each (None: not given)."""

    src: Path | None = None
    tgt: Path | None = None
    tsv: Path | None = None
    hf: str | None = None
    hf_config: str | None = None
    valid_src: Path | None = None
    valid_tgt: Path | None = None
    test_src: Path | None = None
    test_tgt: Path | None = None
    src_lang: str | None = None
    tgt_lang: str | None = None
    demo: bool = False
    vocab_from: Path | None = None
    alignments: str | None = None  # data.alignments: eflomal, or a Pharaoh file
    filters: tuple[str, ...] = ()  # data.clean.filters to turn on with their default settings


def _check_report(report: Path, out: Path) -> None:
    """Refuse, before the work, a ``--report`` that the prepared folder ``out`` holds (or a link into it):
    the report would replace one of its files (its manifest.json), or, as a file prepare did not write,
    make the next rebuild refuse the folder; and one that is no file to write (a block device, a socket)."""
    try:
        output_target(report)
        target, folder = report.resolve(), out.resolve()  # links followed, as the write follows them
    except MtkitError as e:
        raise MtkitError(f"--report {e}") from None
    except RuntimeError:  # Python 3.11's resolve() on a loop of links in a folder above
        raise MtkitError(f"--report {report}: too many levels of symbolic links") from None
    if target == folder or folder in target.parents:
        raise MtkitError(f"--report {report}: inside the prepared folder {out}, which holds prepare's files"
                         " alone; write the report elsewhere")


def prepare_from_flags(recipe: Path | None, out: Path, overrides: list[str] | None, data: DataFlags,
                       force: bool = False, report: Path | None = None) -> None:
    """``mtkit prepare``'s flags as the data section's keys (each error names its flag), over the recipe
    and under ``--set``; then :func:`prepare`, and the cleaning report into ``report`` (Markdown for .md, else
    JSON)."""
    # The options are typed values, never YAML: a file named 1.50 or a language code `no` stays a string.
    flags: dict[str, tuple[str, object]] = {}
    defaults: dict[str, tuple[str, object]] = {}

    def files(split: str, s: Path | None, t: Path | None) -> None:
        prefix = "--" if split == "train" else f"--{split}-"
        if (s is None) != (t is None):
            raise MtkitError(f"{prefix}src and {prefix}tgt go together")
        if s is not None:
            flags.update({f"data.{split}.kind": (f"{prefix}src", "files"),
                          f"data.{split}.src": (f"{prefix}src", str(s)), f"data.{split}.tgt": (f"{prefix}tgt", str(t))})

    files("train", data.src, data.tgt)
    files("valid", data.valid_src, data.valid_tgt)
    files("test", data.test_src, data.test_tgt)
    if data.tsv is not None:
        flags.update({"data.train.kind": ("--tsv", "tsv"), "data.train.path": ("--tsv", str(data.tsv))})
    if data.hf is not None:
        flags.update({"data.train.kind": ("--hf", "hf"), "data.train.name": ("--hf", data.hf),
                      "data.train.split": ("--hf", "train")})
        if data.hf_config:
            flags["data.train.config"] = ("--hf-config", data.hf_config)
    if data.demo:
        for split in ("train", "valid", "test"):
            flags.update({f"data.{split}.kind": ("--demo", "demo"), f"data.{split}.split": ("--demo", split)})
        defaults = {"data.valid.size": ("--demo", 500), "data.test.size": ("--demo", 500),  # --set still wins
                    "data.spm.vocab_size": ("--demo", 400)}
    if data.src_lang is not None:
        flags["data.src_lang"] = ("--src-lang", data.src_lang)
    if data.tgt_lang is not None:
        flags["data.tgt_lang"] = ("--tgt-lang", data.tgt_lang)
    if data.vocab_from is not None:
        flags["data.spm.vocab_from"] = ("--vocab-from", str(data.vocab_from))
    if data.alignments is not None:
        flags["data.alignments"] = ("--alignments", data.alignments)
    for name in data.filters:
        if name == "dual_xent":
            raise MtkitError("--filter dual_xent: needs its score files; give it with --set "
                             "'data.clean.filters.dual_xent={forward: FWD, backward: BWD, keep: 0.9}'")
        flags[f"data.clean.filters.{name}"] = (f"--filter {name}", {})
    config = load_config(recipe, overrides or [], flags, defaults)
    if report is not None:
        _check_report(report, out)
    note = _check_languages(config, recipe, overrides or [], flags)
    given = config.data
    if given.train is None and not given.corpora and not any(p.train is not None for p in given.pairs):
        raise MtkitError("no training data: give a recipe with data.train, data.corpora or data.pairs, or --src/--tgt, "
                         "--tsv, --hf or --demo")
    manifest = prepare(config, out, force=force)
    if note is not None:  # after the report, where a fr-cs corpus's user looks for what was made of it
        print(note, file=sys.stderr)
    if report is not None:
        write_report(cleaning_report(manifest), report)

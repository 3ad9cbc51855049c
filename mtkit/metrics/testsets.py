"""Named test sets from sacrebleu's data API (``wmt14/full`` for WMT14 en-de: 3,003 sentences, what
papers report), with a one-line error when one cannot be downloaded here."""

from __future__ import annotations

import difflib
import os
import socket
from pathlib import Path

from sacrebleu import DATASETS
from sacrebleu.utils import SACREBLEU_DIR

from mtkit.errors import MtkitError
from mtkit.io import read_lines

# ---------------------------------------------------------------- named test sets


def _offline_message(name: str, langpair: str, reason: str) -> str:
    return (
        f"test set {name} ({langpair}) is not in sacrebleu's cache {SACREBLEU_DIR} "
        f"(set by the SACREBLEU environment variable, default ~/.sacrebleu) and could not be downloaded "
        f"({reason}); download it where there is network (sacrebleu -t {name} -l {langpair} --echo src) "
        f"and copy that folder over, or pass local files with --src/--ref"
    )


def _cached(dataset, langpair: str) -> bool:
    """Whether sacrebleu can produce the files without the network (text files or raw downloads present)."""
    try:
        texts = [dataset._get_txt_file_path(langpair, field) for field in dataset.fieldnames(langpair)]
        if all(os.path.exists(path) for path in texts):
            return True
        tarballs = [os.path.join(dataset._rawdir, dataset._get_tarball_filename(url)) for url in dataset.data]
        return all(os.path.exists(t) and os.path.getsize(t) > 0 for t in tarballs)
    except (AttributeError, TypeError):  # sacrebleu internals changed: let the download attempt decide
        return False


def load_testset(
    name: str, langpair: str, download: bool = True, timeout: float = 20.0
) -> tuple[list[str], list[list[str]]]:
    """Sources and reference streams of a sacrebleu test set, e.g. ``load_testset("wmt14/full", "en-de")``.

    ``wmt14/full`` (3,003 sentences) is the WMT14 en-de test set that papers report;
    ``wmt14`` is a filtered subset. Files are looked up in sacrebleu's cache
    (``$SACREBLEU``, default ``~/.sacrebleu``) and downloaded when missing, each
    network operation bounded by ``timeout`` seconds; with ``download=False`` or
    offline this raises :class:`MtkitError` saying where sacrebleu looks and that
    ``--src/--ref`` take local files instead.
    """
    if name not in DATASETS:
        close = difflib.get_close_matches(name, list(DATASETS), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise MtkitError(f"unknown sacrebleu test set {name!r}{hint}; `sacrebleu --list` shows them")
    dataset = DATASETS[name]
    if langpair not in dataset.langpairs:
        raise MtkitError(f"test set {name} has no language pair {langpair!r}; it has {', '.join(dataset.langpairs)}")

    if not _cached(dataset, langpair):
        if not download:
            raise MtkitError(_offline_message(name, langpair, "downloads disabled"))
        previous = socket.getdefaulttimeout()
        socket.setdefaulttimeout(timeout)  # sacrebleu's urlopen has no timeout of its own
        try:
            dataset.get_files(langpair)
        except SystemExit:  # sacrebleu exits on SSL and checksum errors
            raise MtkitError(_offline_message(name, langpair, "sacrebleu aborted the download")) from None
        except Exception as e:  # noqa: BLE001 - URLError, timeouts, broken archives: all mean "not available"
            reason = " ".join(str(getattr(e, "reason", e)).split()) or type(e).__name__
            raise MtkitError(_offline_message(name, langpair, reason)) from None
        finally:
            socket.setdefaulttimeout(previous)

    source = [line.strip() for line in read_lines(Path(dataset.get_source_file(langpair)))]
    refs = [[line.strip() for line in read_lines(Path(path))] for path in dataset.get_reference_files(langpair)]
    return source, refs  # type: ignore[return-value]

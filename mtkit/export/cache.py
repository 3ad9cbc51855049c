"""The CTranslate2 export of a checkpoint, made on first use and kept: what ``--engine ctranslate2`` on a
checkpoint or run directory translates with, so that nobody manages export folders by hand.

The export goes beside the checkpoint, ``RUN/checkpoints/.ctranslate2/NAME.QUANTIZATION/`` (``NAME`` the
checkpoint file's stem: ``averaged``, ``best``, ``step_0001000``), or, where that folder may not be written
(a read-only model directory: one whose mode grants no one writing, even when root runs mtkit), under
``$XDG_CACHE_HOME/mtkit/ctranslate2/`` (``~/.cache``) in a folder named by a hash of the checkpoint's path.
Each export holds ``source.json``: the checkpoint's path, size, modification time and inode, the quantization,
mtkit's version and the export's format. An export whose record differs from the checkpoint as it is now
(training saved again, ``average`` rewrote it, ``last.pt`` was swapped) is made again and replaces the old
one in one rename; a reader of the old one keeps its open files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from mtkit.checkpoints.io import load_model, resolve_checkpoint
from mtkit.engines.capabilities import CAPABILITIES, either
from mtkit.engines.ctranslate2_engine import import_ctranslate2
from mtkit.errors import MtkitError
from mtkit.export.protocol import replace_directory
from mtkit.io import read_json_file
from mtkit.shortlist import shortlist_path
from mtkit.version import __version__

logger = logging.getLogger(__name__)

FOLDER = ".ctranslate2"
STAMP = "source.json"
FORMAT = 2  # what the export holds; 2: its alignment head (mtkit.export.ctranslate2.alignment_of). An older one is
# made again


def _stamp(checkpoint: Path, quantization: str | None) -> dict:
    """What identifies the export of ``checkpoint`` as the file is now."""

    st = os.stat(checkpoint)
    stamp = {"checkpoint": str(checkpoint.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
             "inode": st.st_ino, "quantization": quantization or "float32", "mtkit_version": __version__,
             "format": FORMAT}
    shortlist = shortlist_path(checkpoint)
    if shortlist.is_file():  # the export ships it as vmap.txt: a new or rebuilt shortlist makes it again
        sl = os.stat(shortlist)
        stamp["shortlist"] = {"size": sl.st_size, "mtime_ns": sl.st_mtime_ns, "inode": sl.st_ino}
    return stamp


def _recorded(folder: Path) -> dict | None:
    """The stamp an export holds, None when there is none (or none readable: then it is made again)."""
    try:
        return read_json_file(folder / STAMP, 1 << 16, "stamp")
    except MtkitError:
        return None


def check_quantization(engine: str, quantization: str | None) -> None:
    """``--quantization`` is for an engine whose exports have weight types (``--engine ctranslate2``), and one
    of them (:mod:`mtkit.engines.capabilities`)."""
    if quantization is None:
        return
    weights = CAPABILITIES[engine].quantizations if engine in CAPABILITIES else ()
    if not weights:
        raise MtkitError(f"--quantization needs --engine {either('quantizations')} (which exports a checkpoint on "
                         "first use)")
    if quantization not in weights:
        raise MtkitError(f"--quantization {quantization}: expected one of {', '.join(weights)}")


def _may_write(folder: Path) -> bool:
    """Whether mtkit may write in ``folder`` (or create it): a folder whose mode grants no one writing (a
    shared, read-only model folder) is left alone even by root, whom the kernel would let write."""
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is None:
        return False
    return os.access(existing, os.W_OK) and bool(existing.stat().st_mode & 0o222)


def user_cache() -> Path:
    """``$XDG_CACHE_HOME/mtkit/ctranslate2`` (``~/.cache/mtkit/ctranslate2``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mtkit" / "ctranslate2"


def candidates(checkpoint: Path, quantization: str | None) -> list[Path]:
    """Where the export of ``checkpoint`` may be, in order: beside it, then in the user's cache."""
    name = f"{checkpoint.stem}.{quantization or 'float32'}"
    key = hashlib.sha256(str(checkpoint.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return [checkpoint.parent / FOLDER / name, user_cache() / key / name]


def cached_export(path: str | Path, quantization: str | None = None, quiet: bool = False) -> Path:
    """The CTranslate2 export of the checkpoint ``path`` (a file or run directory), made now unless an export
    of the checkpoint as it is now is kept (:data:`FOLDER`); says which it is (``quiet``: says nothing)."""

    check_quantization("ctranslate2", quantization)
    import_ctranslate2()  # before torch (the export loads it): imported after, it binds to torch's OpenMP
    checkpoint = resolve_checkpoint(path)
    stamp = _stamp(checkpoint, quantization)
    places = candidates(checkpoint, quantization)
    for folder in places:
        if _recorded(folder) == stamp:
            if not quiet:
                logger.info(f"CTranslate2 export of {checkpoint} ({stamp['quantization']}): {folder}")
            return folder
    problems = []
    for folder in places:
        if not _may_write(folder.parent):
            problems.append(f"{folder.parent}: read-only")
            continue
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        except OSError as e:
            problems.append(f"{folder.parent}: {e.strerror or e}")
            continue
        try:
            return _export(checkpoint, quantization, stamp, folder, work, quiet)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    raise MtkitError(f"{checkpoint}: nowhere to keep its CTranslate2 export ({'; '.join(problems)}); export it "
                     "with mtkit export ctranslate2 and give that folder to -m")


def _export(checkpoint: Path, quantization: str | None, stamp: dict, folder: Path, work: Path,
            quiet: bool) -> Path:
    """Export into ``work`` (the exporters' steps: :mod:`mtkit.export.protocol`), record the stamp, then put it
    at ``folder`` in one rename (replacing an outdated export)."""
    # The exporter imports torch: after CTranslate2 (above), and never on the path that finds a kept export.
    from mtkit.export.ctranslate2 import export_model

    if not quiet:
        logger.info(f"exporting {checkpoint} to CTranslate2 ({stamp['quantization']}) once, into {folder}")
    made = export_model(load_model(checkpoint, "cpu"), work / "model", quantization)
    (made / STAMP).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
    return replace_directory(made, folder, work / "outdated")


def ctranslate2_model(path: str | Path, quantization: str | None = None, quiet: bool = False) -> Path:
    """What ``--engine ctranslate2 -m PATH`` translates: a CTranslate2 model folder (its ``model.bin``; mtkit's
    exports, or another tool's) as it is, a checkpoint or run directory through its kept export
    (:func:`cached_export`)."""
    if Path(path).is_dir() and (Path(path) / "model.bin").exists():
        if quantization is not None:
            raise MtkitError(f"--quantization {quantization}: {path} is exported already, with the quantization "
                             "it was exported with; give the checkpoint or run directory instead")
        return Path(path)
    return cached_export(path, quantization, quiet)

"""Where prepare writes, and the processes it starts: the output directory's safety rules, the
temporaries beside it (named for their owner, removed once their owner is gone), the rename that
replaces an earlier output, and children that die with their parent.

* ``out_dir`` is replaced (``--force`` or changed inputs) only if it is empty or holds an mtkit
  ``manifest.json`` and nothing but the files prepare writes, so that no rebuild ever deletes a file
  mtkit did not write; the current directory and its parents are never replaced.
* The temporaries beside ``out_dir`` carry their owner's PID and host (``.{name}.tmp-{pid}@{host}-*``,
  ``.{name}.old-{pid}@{host}-*``); the next run on the same host removes those whose owner is gone
  (after a crash or a SIGKILL), never those of a live process or of another host sharing the folder.
* The encoding workers and the SentencePiece child ask Linux to kill them when their parent dies, so
  a killed ``mtkit prepare`` leaves no orphan holding memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import re
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from mtkit.data.store import MANIFEST
from mtkit.errors import MtkitError
from mtkit.io import MAX_CONFIG_BYTES, read_json_file
from mtkit.io import owner as _owner
from mtkit.io import process_alive as _alive

logger = logging.getLogger(__name__)


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
            logger.info(f"{path}: removed; left behind by process {pid}, which no longer runs")


# ------------------------------------------------------------- out_dir safety

# Every file a prepared directory may hold; anything else there is the user's.
_OUTPUT_NAME = re.compile(
    r"(?:manifest\.json|spm(?:\.src|\.tgt)?\.model|pieces\.json"
    r"|(?:train|valid|test)\.(?:store\.json|(?:src|tgt)\.(?:bin|idx\.npy|len\.npy|txt)))"
)


def _written_by_mtkit(manifest_path: Path) -> bool:
    """True if ``manifest_path`` is a JSON object with mtkit's ``format`` key (of any version)."""
    try:
        manifest = read_json_file(manifest_path, MAX_CONFIG_BYTES, "data manifest")
    except MtkitError:
        return False
    return isinstance(manifest, dict) and type(manifest.get("format")) is int


def _check_out_dir(out_dir: Path) -> None:
    """Raise MtkitError unless writing ``out_dir`` (replacing what is there) deletes nothing of the user's."""
    try:
        resolved = out_dir.resolve()
    except (RuntimeError, OSError):  # Python 3.11's resolve() on a loop of links (3.13: OSError ELOOP)
        raise MtkitError(f"{out_dir}: too many levels of symbolic links") from None
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

"""Small file helpers: atomic writes, and text input that names file and line on errors."""

from __future__ import annotations

import contextlib
import errno
import gzip
import os
import re
import socket
import sys
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from mtkit.errors import MtkitError

# Errors of a write through an open file (no file name of their own): they are the output's.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS}


def _named(error: OSError, tmp: str | None, path: Path) -> OSError:
    """``error`` naming the user's ``path`` where it names our temporary ``tmp`` (or, for a write
    error, nothing): a message never shows ``.NAME.XXXXXXXX.tmp``."""
    if error.filename is not None and str(error.filename) != tmp:
        return error
    if error.filename is None and error.errno not in _WRITE_ERRNOS:
        return error
    return OSError(error.errno, error.strerror, str(path))


def owner() -> str:
    """``{pid}@{host}``: who made a temporary; a PID alone means nothing on another host."""
    return f"{os.getpid()}@{re.sub(r'[^A-Za-z0-9.-]', '_', socket.gethostname())}"


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextlib.contextmanager
def atomic_path(path: str | Path, owned: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success.

    On any exception the temporary file is removed and ``path`` is untouched, so a
    reader never sees a half-written file. An OSError names ``path``, never the temporary
    (a full disk, a folder mtkit may not write in). ``owned``: the temporary's name carries
    this process's :func:`owner` (``.NAME.PID@HOST.XXXXXXXX.tmp``), so that
    :func:`remove_dead_temporaries` can remove it once the process is gone (a SIGKILL).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{owner() + '.' if owned else ''}", suffix=".tmp",
                                   dir=path.parent)
    except OSError as e:
        raise _named(e, None if e.filename is None else str(e.filename), path) from None
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make the result unreadable to others
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and _named(e, tmp, path) is not e:
            raise _named(e, tmp, path) from None
        raise


def remove_dead_temporaries(path: str | Path) -> list[Path]:
    """Remove the :func:`atomic_path` temporaries of ``path`` (made with ``owned``) whose process, on
    this host, no longer runs (killed by SIGKILL, or a crash); never a live process's, nor another
    host's. Says on stderr what it removed; returns it."""
    path = Path(path)
    if os.name != "posix" or not path.parent.is_dir():  # on Windows, os.kill(pid, 0) sends a Ctrl-C
        return []
    host = owner().partition("@")[2]
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(\d+)@{re.escape(host)}\.[A-Za-z0-9_]+\.tmp")
    removed = []
    for candidate in path.parent.iterdir():
        match = pattern.fullmatch(candidate.name)
        if match is None or candidate.is_symlink() or not candidate.is_file():
            continue
        pid = int(match.group(1))
        if pid != os.getpid() and not process_alive(pid):
            with contextlib.suppress(FileNotFoundError):
                candidate.unlink()
                removed.append(candidate)
                print(f"{candidate}: removed; left behind by process {pid}, which no longer runs", file=sys.stderr)
    return removed


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory beside ``path`` (which must not exist, or be empty); on success
    it replaces ``path`` in one rename, on any exception it is removed and ``path`` is untouched."""
    import shutil

    path = Path(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            path.rmdir()  # empty, as the caller checked
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


GZIP_MAGIC = b"\x1f\x8b"


class _GzipReader(gzip.GzipFile):
    """A gzip reader whose errors on damaged data are one-line MtkitErrors naming the file.

    ``gzip`` only finds damage while reading (``BadGzipFile``, ``EOFError`` for a truncated
    file, ``zlib.error``), deep inside the caller's loop; every read path goes through
    these methods, so each caller gets the same message.
    """

    def _checked(self, method, *args):
        try:
            return method(*args)
        except EOFError:
            raise MtkitError(f"{self.name}: gzip data ends early (the file is truncated)") from None
        except (gzip.BadGzipFile, zlib.error) as e:
            raise MtkitError(f"{self.name}: damaged gzip data ({e})") from None

    def read(self, size=-1):
        return self._checked(super().read, size)

    def read1(self, size=-1):
        return self._checked(super().read1, size)

    def peek(self, n):
        return self._checked(super().peek, n)

    def readline(self, size=-1):
        return self._checked(super().readline, size)


def open_binary(path: str | Path) -> IO[bytes]:
    """Open a file for reading bytes, transparently decompressing ``.gz``.

    A ``.gz`` file that is not gzip data is refused at once; damage found later
    while reading raises :class:`MtkitError` naming the file.
    """
    path = Path(path)
    if not path.exists():
        raise MtkitError(f"{path}: no such file")
    if path.is_dir():
        raise MtkitError(f"{path}: is a directory, expected a file")
    if path.suffix != ".gz":
        return open(path, "rb")
    with open(path, "rb") as f:
        magic = f.read(len(GZIP_MAGIC))
    if magic and magic != GZIP_MAGIC:  # an empty file reads as empty, as gzip itself has it
        raise MtkitError(f"{path}: not a gzip file (its name ends in .gz); decompress or rename it")
    return _GzipReader(path, "rb")  # type: ignore[return-value]


def read_lines(path: str | Path, invalid_utf8: str = "error") -> Iterator[str | None]:
    """Yield each line of a (possibly gzipped) UTF-8 file without its newline.

    Invalid UTF-8 raises :class:`MtkitError` naming the file and line, or, with
    ``invalid_utf8='skip'``, yields None for that line (so that the caller keeps
    two parallel files aligned and can count the skip).
    """
    with open_binary(path) as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                if invalid_utf8 == "skip":
                    yield None
                    continue
                raise MtkitError(f"{path}: line {number}: invalid UTF-8 (byte {e.start + 1} of the line)") from None
            yield line.rstrip("\r\n")


def count_lines(path: str | Path) -> int:
    with open_binary(path) as f:
        return sum(1 for _ in f)


def sentence_progress(enabled: bool = True):
    """A tqdm bar on stderr counting sentences (with their rate) when stderr is a terminal and
    ``enabled``; None otherwise (piped or redirected output stays quiet)."""
    if not (enabled and sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(unit="sent", file=sys.stderr, dynamic_ncols=True, smoothing=0.1)


def discard_stdout() -> None:
    """After a BrokenPipeError on stdout (the reader has gone, ``| head``): point stdout at
    /dev/null, so that what it still buffers goes nowhere at exit instead of failing a second time."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)

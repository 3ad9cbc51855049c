"""Small file helpers: atomic writes, and text input that names file and line on errors."""

from __future__ import annotations

import contextlib
import gzip
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator

from mtkit.errors import MtkitError


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success.

    On any exception the temporary file is removed and ``path`` is untouched, so a
    reader never sees a half-written file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make the result unreadable to others
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def open_binary(path: str | Path) -> IO[bytes]:
    """Open a file for reading bytes, transparently decompressing ``.gz``."""
    path = Path(path)
    if not path.exists():
        raise MtkitError(f"{path}: no such file")
    if path.is_dir():
        raise MtkitError(f"{path}: is a directory, expected a file")
    if path.suffix == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


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

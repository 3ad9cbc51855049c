"""Small file helpers: atomic writes, text input that names file and line on errors, and bounded
reads of the small files a model folder holds (JSON configs and vocabularies, SentencePiece models)."""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import logging
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import yaml
from tqdm import tqdm

from mtkit.errors import MtkitError, counted, shown

logger = logging.getLogger(__name__)

# Errors of a write through an open file (no file name of their own): they are the output's.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS}


def _named(error: OSError, tmp: str | None, path: Path) -> OSError:
    """``error`` naming the user's ``path`` where it names our temporary ``tmp`` (or, for a write
    error, nothing): a message never shows ``.NAME.XXXXXXXX.tmp``. A file inside a temporary
    directory ``tmp`` is named as the same file inside ``path``."""
    if error.filename is None:
        return error if error.errno not in _WRITE_ERRNOS else OSError(error.errno, error.strerror, str(path))
    name = str(error.filename)
    if tmp is not None and name == tmp:
        return OSError(error.errno, error.strerror, str(path))
    if tmp is not None and name.startswith(tmp.rstrip(os.sep) + os.sep):
        return OSError(error.errno, error.strerror, str(path) + name[len(tmp.rstrip(os.sep)):])
    return error


def naming_output(error: OSError, tmp: str | Path | None, path: str | Path) -> OSError:
    """``error`` of writing into the temporary ``tmp`` (a file or a directory built beside ``path``, then
    renamed onto it), naming the user's ``path`` instead of the temporary, or instead of nothing (a full
    disk, a file too large: a write has no file name of its own); any other error as it is."""
    return _named(error, None if tmp is None else str(tmp), Path(path))


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


# A process's open descriptor reached through a link (/dev/stdout, /dev/fd/1, /proc/self/fd/1): a magic
# link to an open file, which names no path to put a temporary beside or rename onto.
_DESCRIPTOR = re.compile(r"/proc/[^/]+/fd/\d+|/dev/fd/\d+")
_MAX_LINKS = 40  # Linux's own limit on the links one path lookup follows (ELOOP beyond)


def output_target(path: str | Path) -> tuple[Path, bool]:
    """Where an output named ``path`` goes, and whether it is written through (no temporary, no rename).

    * Nothing there yet, a regular file, a directory: ``(path, False)``: :func:`atomic_path` writes a
      temporary beside it and renames it onto it (onto a directory the rename fails, naming ``path``).
    * A symbolic link: ``(its final target, False)``: the temporary is made beside the target and renamed
      onto it, so that the link stays a link and its target gets the content. A dangling link's target is
      created, as ``sort -o``, ``tee`` and the shell's ``>`` do (GNU ``cp`` alone refuses one): the user
      named the link, and a link made before its target is a common way to say where an output goes;
      the target's folder must exist (refused in one line otherwise: no folders made at a link's say).
    * A character device or a FIFO (``/dev/null``, a terminal, a named pipe), or a process's open
      descriptor (``/dev/stdout``, ``/dev/fd/N``): ``(path, True)``: written through, as ``sort -o``
      does; a rename would replace the device node or the pipe with a regular file.
    * Any other special file (a block device, a socket): refused in one line.
    """
    path = Path(path)
    target, hops = path, 0
    while target.is_symlink():
        if _DESCRIPTOR.fullmatch(str(target)):
            return path, True
        hops += 1
        if hops > _MAX_LINKS:
            raise MtkitError(f"{path}: too many levels of symbolic links")
        target = target.parent / os.readlink(target)  # a relative link is relative to its own folder
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None  # nothing there yet (or its folder is missing: made below, or named by the error)
    if mode is not None and (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
        return path, True
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file"
        raise MtkitError(f"{path}: is {kind}; mtkit writes only files, character devices and FIFOs")
    if target != path and mode is None and not target.parent.is_dir():
        raise MtkitError(f"{path}: a symbolic link to {target}, whose folder does not exist")
    return target, False


@contextlib.contextmanager
def atomic_path(path: str | Path, owned: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success.

    On any exception the temporary file is removed and ``path`` is untouched, so a
    reader never sees a half-written file. An OSError names ``path``, never the temporary
    (a full disk, a folder mtkit may not write in). ``owned``: the temporary's name carries
    this process's :func:`owner` (``.NAME.PID@HOST.XXXXXXXX.tmp``), so that
    :func:`remove_dead_temporaries` can remove it once the process is gone (a SIGKILL).

    A symbolic link is followed (the temporary is made beside its target and renamed onto the target);
    a character device or a FIFO is written through: the path yielded is ``path`` itself, which a
    caller must neither remove nor replace; a block device or a socket is refused (:func:`output_target`).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _named(e, None if e.filename is None else str(e.filename), path) from None
    target, through = output_target(path)
    if through:
        try:
            yield path
        except OSError as e:  # /dev/full's ENOSPC names no file: it is the output's
            if _named(e, None, path) is not e:
                raise _named(e, None, path) from None
            raise
        return
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{owner() + '.' if owned else ''}", suffix=".tmp",
                                   dir=target.parent)
    except OSError as e:
        raise _named(e, None if e.filename is None else str(e.filename), path) from None
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make the result unreadable to others
    try:
        yield Path(tmp)
        os.replace(tmp, target)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and _named(e, tmp, path) is not e:
            raise _named(e, tmp, path) from None
        raise


def remove_dead_temporaries(path: str | Path) -> list[Path]:
    """Remove the :func:`atomic_path` temporaries of ``path`` (made with ``owned``; beside its target where
    ``path`` is a link, none for a device) whose process, on this host, no longer runs (killed by SIGKILL,
    or a crash); never a live process's, nor another host's. Says on stderr what it removed; returns it."""
    path, through = output_target(path)  # a link's temporaries are beside its target
    if through or os.name != "posix" or not path.parent.is_dir():  # on Windows, os.kill(pid, 0) sends a Ctrl-C
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
                logger.info(f"{candidate}: removed; left behind by process {pid}, which no longer runs")
    return removed


def refuse_non_empty(path: str | Path) -> None:
    """The one-line error for an output folder that already holds something (exports, imports write new ones)."""
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise MtkitError(f"{path}: already exists and is not empty; remove it or choose another directory")


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory beside ``path`` (which must not exist, or be empty); on success
    it replaces ``path`` in one rename, on any exception it is removed and ``path`` is untouched."""
    path = Path(path)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    except OSError as e:  # a folder mtkit may not write in: the user's path, not a random candidate name
        raise OSError(e.errno, e.strerror, str(path)) from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would make the result unreadable to others
    try:
        yield tmp
        if path.exists():
            path.rmdir()  # empty, as the caller checked
        os.replace(tmp, path)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and naming_output(e, tmp, path) is not e:
            raise naming_output(e, tmp, path) from None
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


def open_binary(path: str | Path, stream: bool = False) -> IO[bytes]:
    """Open a file for reading bytes, transparently decompressing ``.gz``.

    A ``.gz`` file that is not gzip data is refused at once; damage found later
    while reading raises :class:`MtkitError` naming the file. Only a regular file is read
    (:func:`open_regular`): a FIFO would hang, ``/dev/zero`` is one endless line. ``stream``: the
    user's text read once, front to back, as standard input is (``translate`` and ``score`` inputs):
    a pipe or a terminal is read too (``<(zcat corpus.gz)``, ``/dev/stdin``), its open waiting for its
    writer as ``cat``'s does.
    """
    path = Path(path)
    if stream and path.suffix != ".gz":
        try:
            mode = os.stat(path).st_mode
        except OSError:
            mode = 0  # open_regular names what is wrong
        if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
            try:
                return open(path, "rb")
            except OSError as e:
                raise MtkitError(f"{path}: cannot read ({e.strerror})") from None
    f = open_regular(path, "no such file", "is a directory, expected a file")
    if path.suffix != ".gz":
        return f
    with f:
        magic = f.read(len(GZIP_MAGIC))
    if magic and magic != GZIP_MAGIC:  # an empty file reads as empty, as gzip itself has it
        raise MtkitError(f"{path}: not a gzip file (its name ends in .gz); decompress or rename it")
    return _GzipReader(path, "rb")  # type: ignore[return-value]


def decode_line(raw: bytes, name: str | Path, number: int) -> str:
    """Line ``number`` of ``name`` as text, or :class:`MtkitError` naming both where it is not UTF-8:
    the one message for invalid UTF-8 of every command that reads text (prepare, evaluate, translate,
    score)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MtkitError(f"{name}: line {number}: invalid UTF-8 (byte {e.start + 1} of the line)") from None


STDIN_NAME = "<stdin>"  # how a message names standard input


def standard_input() -> IO[bytes]:
    """Standard input's bytes, or :class:`MtkitError` when descriptor 0 was closed when Python started
    (Python then sets ``sys.stdin`` to None)."""
    if sys.stdin is None:
        raise MtkitError("standard input is closed; give input files, or pipe the input in")
    return sys.stdin.buffer


def standard_output() -> IO[bytes]:
    """Standard output's bytes, or :class:`MtkitError` when descriptor 1 was closed at start."""
    if sys.stdout is None:
        raise MtkitError("standard output is closed; give an output file (--output), or redirect it")
    return sys.stdout.buffer


def read_lines(path: str | Path, invalid_utf8: str = "error") -> Iterator[str | None]:
    """Yield each line of a (possibly gzipped) UTF-8 file without its newline.

    Invalid UTF-8 raises :class:`MtkitError` naming the file and line, or, with
    ``invalid_utf8='skip'``, yields None for that line (so that the caller keeps
    two parallel files aligned and can count the skip).
    """
    with open_binary(path) as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = decode_line(raw, path, number)
            except MtkitError:
                if invalid_utf8 == "skip":
                    yield None
                    continue
                raise
            yield line.rstrip("\r\n")


def count_lines(path: str | Path) -> int:
    with open_binary(path) as f:
        return sum(1 for _ in f)


def sentence_progress(enabled: bool = True):
    """A tqdm bar on stderr counting sentences (with their rate) when stderr is a terminal and
    ``enabled``; None otherwise (piped or redirected output stays quiet)."""
    if not (enabled and sys.stderr.isatty()):
        return None
    return tqdm(unit="sent", file=sys.stderr, dynamic_ncols=True, smoothing=0.1)


def discard_stdout() -> None:
    """After a BrokenPipeError on stdout (the reader has gone, ``| head``): point stdout at
    /dev/null, so that what it still buffers goes nowhere at exit instead of failing a second time."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


# ------------------------------------------------------------------ bounded reads of files from elsewhere

# A JSON or YAML file mtkit reads is a few levels deep (a config's sections, a vocabulary's one mapping);
# this many is far beyond any, and keeps a walk over what was read (a check, a message) far from
# Python's recursion limit. Deeper is refused in one line, never a RecursionError.
MAX_JSON_DEPTH = 64
# Sizes beyond which a file is refused before it is read: each far above what such a file holds.
MAX_CONFIG_BYTES = 16 << 20  # config.json, generation_config.json, tokenizer_config.json, mtkit.json, a data
# manifest: a few KB each
MAX_VOCAB_BYTES = 64 << 20  # vocab.json, a piece table, a SentencePiece model: a few MB (250,000 pieces: ~10 MB)
MAX_RECIPE_BYTES = 1 << 20  # a YAML recipe: a few KB (PyYAML parses in pure Python: a large file costs minutes)


def _depth(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON or YAML) nests at most ``limit`` deep. Iterative, and each container
    measured once (its height kept by id), so that YAML's aliases, which share one object between many
    places, cost their size and are measured where they are deepest; a container that holds itself (a
    recursive YAML alias) is infinitely deep."""
    def children(node: Any) -> list:
        items = node.values() if isinstance(node, dict) else node
        return [c for c in items if isinstance(c, (dict, list, tuple))]

    heights: dict[int, int] = {}
    path: set[int] = set()  # the containers being measured: the ancestors of the one on top
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        node, measured = stack.pop()
        if not isinstance(node, (dict, list, tuple)):
            continue
        key = id(node)
        if measured:  # its children's heights are known
            path.discard(key)
            height = 1 + max((heights[id(c)] for c in children(node)), default=0)
            if height > limit:
                return False
            heights[key] = height
        elif key in path:
            return False  # it holds itself
        elif key not in heights:
            path.add(key)
            stack.append((node, True))
            stack.extend((c, False) for c in children(node) if id(c) not in heights)
    return True


def check_depth(value: Any, where: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    if not _depth(value, max_depth):
        raise MtkitError(f"{where}: nested more than {max_depth} levels deep")


def parse_json(data: bytes | str, where: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """JSON text (UTF-8 bytes or str) parsed, refused in one line naming ``where`` if it is not JSON,
    not UTF-8, or nested more than ``max_depth`` deep (the C parser stops at Python's recursion limit
    with a RecursionError; anything shallower is measured after)."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as e:
        raise MtkitError(f"{where}: not valid UTF-8 (byte {e.start + 1})") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise MtkitError(f"{where}: nested more than {max_depth} levels deep") from None
    except ValueError as e:  # JSONDecodeError, and an integer of more than 4300 digits
        raise MtkitError(f"{where}: not valid JSON ({str(e)[:120]})") from None
    check_depth(value, where, max_depth)
    return value


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB" if n >= 1 << 20 else counted(n, "byte")


def open_regular(path: Path, missing: str, directory: str = "not a regular file") -> IO[bytes]:
    """``path`` opened for reading if it is a regular file (symlinks followed), else one line naming it:
    ``PATH: MISSING``, ``PATH: DIRECTORY``, ``PATH: not a regular file`` (a FIFO would block the open or
    the reading forever, a device such as ``/dev/zero`` never end). Opened without blocking, then
    checked, so that not even the open waits for a FIFO's writer."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise MtkitError(f"{path}: {missing}") from None
    except IsADirectoryError:
        raise MtkitError(f"{path}: {directory}") from None
    except OSError as e:
        raise MtkitError(f"{path}: cannot read ({e.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise MtkitError(f"{path}: {directory if stat.S_ISDIR(mode) else 'not a regular file'}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bounded(path: str | Path, max_bytes: int, what: str) -> bytes:
    """The bytes of the regular file ``path`` (symlinks followed), at most ``max_bytes`` of them.

    Checked before reading, in one line naming ``path``: that it exists, that it is a regular file
    (a FIFO would block forever, ``/dev/zero`` never ends: both are refused, never read), and that
    it is no larger than a ``what`` can be. The file is opened non-blocking, so that even a FIFO
    swapped in after a check cannot hang the read, and no more than ``max_bytes + 1`` are read
    whatever its size says.
    """
    path = Path(path)
    with open_regular(path, "no such file", f"is a directory, expected a {what}") as f:
        too_large = f"{path}: larger than a {what} can be (at most {_mib(max_bytes)})"
        if os.fstat(f.fileno()).st_size > max_bytes:
            raise MtkitError(too_large)
        try:
            data = f.read(max_bytes + 1)
        except OSError as e:
            raise MtkitError(f"{path}: cannot read ({e.strerror})") from None
    if len(data) > max_bytes:  # it grew since fstat
        raise MtkitError(too_large)
    return data


def read_json_file(path: str | Path, max_bytes: int, what: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A JSON file from elsewhere, read by :func:`read_bounded` and parsed by :func:`parse_json`:
    each way it can be wrong (missing, not a regular file, too large, not UTF-8, not JSON, too deep)
    is one :class:`MtkitError` line naming ``path``."""
    return parse_json(read_bounded(path, max_bytes, what), str(path), max_depth)


class _Alias(Exception):
    """A YAML alias met by :class:`_Unaliased` (1-based line, anchor name)."""

    def __init__(self, line: int, anchor: str) -> None:
        super().__init__(line, anchor)
        self.line, self.anchor = line, anchor


class _Unaliased(yaml.SafeLoader):
    """YAML's safe loader, refusing any alias (:func:`read_yaml_file` says why)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Alias(event.start_mark.line + 1, event.anchor)
        return super().compose_node(parent, index)


def read_yaml_file(path: str | Path, max_bytes: int, what: str) -> Any:
    """A YAML file of a model folder (a COMET model's ``hparams.yaml``, the ``config.yaml`` of the run an
    export came from), read by :func:`read_bounded` and parsed by YAML's safe loader, aliases refused: an
    alias names one value in many places (and a merge key ``<<`` copies it there), so that whatever walks
    the result (a check, a message, a copy) would walk it once for each (a "billion laughs" of a KB
    expands to gigabytes); no model's file needs one. Each way it can be wrong (missing, not a regular
    file, too large, not UTF-8, not YAML, an alias, too deep) is one :class:`MtkitError` line naming ``path``."""
    data = read_bounded(path, max_bytes, what)
    try:
        value = yaml.load(data.decode("utf-8"), Loader=_Unaliased)  # noqa: S506 (a safe loader)
    except _Alias as e:
        raise MtkitError(f"{path}: line {e.line}: a YAML alias of anchor {shown(e.anchor)}; "
                         "mtkit reads none in a model's files") from None
    except UnicodeDecodeError as e:
        raise MtkitError(f"{path}: not valid UTF-8 (byte {e.start + 1})") from None
    except RecursionError:  # PyYAML's composer recurses once per level
        raise MtkitError(f"{path}: nested more than {MAX_JSON_DEPTH} levels deep") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark is not None else ""
        problem = getattr(e, "problem", None) or (str(e).splitlines() or [""])[0]
        raise MtkitError(f"{path}:{where} malformed YAML ({problem[:120]})") from None
    except ValueError:  # an integer of more than 4300 digits
        raise MtkitError(f"{path}: malformed YAML (a number too long to read)") from None
    check_depth(value, str(path))
    return value

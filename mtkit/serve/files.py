"""LibreTranslate's file translation: ``POST /translate_file`` takes a document (multipart ``file``,
``source``, ``target``, ``api_key``), translates its text through :mod:`mtkit.documents` (its structure and
formatting kept) and answers ``{"translatedFileUrl": ".../download_file/<name>"}``; ``GET /download_file/<name>``
gives the translated file, named as the upload with the target language (``report.docx`` -> ``report_de.docx``).

The document's work (reading, placing tags, writing) runs in worker threads of its own (at most
:data:`MAX_FILE_JOBS` documents at once, beyond them a 503), never on the event loop; its sentences go to the
model's batcher as /translate's do, in parts of at most ``--max-sentences`` lines and ``--max-chars`` characters,
so that text requests are decoded between them and no engine is used from two threads but the batcher's.

A translated file is kept in a private folder (made 0700 by :func:`tempfile.mkdtemp`) under a name of our own,
for :data:`KEEP_SECONDS` (LibreTranslate's 30 minutes), at most :data:`MAX_STORED_FILES` files and
:data:`MAX_STORED_BYTES` bytes (the oldest go first); a download is looked up by its exact name among those we
made, so that no request names a path (``../``, anything not made here: 404). The folder goes when the server
stops.
"""

from __future__ import annotations

import importlib
import logging
import re
import shutil
import tempfile
import threading
import time
import unicodedata
import urllib.parse
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from mtkit.documents import EXTENSIONS, FORMATS, Limits, identity, translate_bytes
from mtkit.errors import MtkitError, shown
from mtkit.text.lines import clean_output

logger = logging.getLogger(__name__)

KEEP_SECONDS = 1800.0  # LibreTranslate's remove_translated_files: files older than 30 minutes go
MAX_STORED_FILES = 256
MAX_STORED_BYTES = 1 << 30
MAX_FILE_JOBS = 4  # documents translated at the same time (each holds a worker thread and its document)
_NAME = re.compile(r"[0-9a-f]{32}\.[A-Za-z0-9_.-]{1,160}")  # what stored files' names look like


def supported_formats() -> dict[str, str]:
    """``{extension: format}`` of the document formats this installation reads: those of
    :data:`mtkit.documents.EXTENSIONS` whose module (and the libraries it imports) can be imported."""
    found = {}
    for ext, fmt in sorted(EXTENSIONS.items()):
        try:
            importlib.import_module(f"mtkit.documents.{FORMATS[fmt][0]}")
        except ImportError:  # a format module not there, or its library not installed
            continue
        found[ext] = fmt
    return found


def upload_name(filename: str) -> str:
    """The last part of an upload's file name as a browser may send it (``C:\\\\fakepath\\\\a.docx``, a path),
    without control characters, shortened to 120 characters (the extension kept): shown, never a path."""
    base = re.split(r"[\\/]", filename)[-1]
    base = "".join(c for c in base if c.isprintable()).strip()
    if len(base) > 120:
        suffix = PurePosixPath(base).suffix[:20]
        base = base[: 120 - len(suffix)] + suffix
    return base


def translated_name(filename: str, target: str) -> str:
    """The download's name: the upload's with ``_target`` before its extension (argos-translate-files' and so
    LibreTranslate's: ``report.docx`` -> ``report_de.docx``)."""
    path = PurePosixPath(upload_name(filename) or "document")
    return f"{path.stem or 'document'}_{target}{path.suffix}"


def _url_safe(name: str) -> str:
    """``name`` in ASCII letters, digits, ``_``, ``.`` and ``-`` (werkzeug's secure_filename, as LibreTranslate
    names its files' URLs), at most 160 characters."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", ascii_name).strip("._") or "document"
    return safe[-160:]


def attachment(name: str) -> str:
    """A Content-Disposition for a download named ``name`` (RFC 6266: ``filename*`` in UTF-8 for a name that is
    not plain ASCII, an ASCII ``filename`` beside it for old clients)."""
    plain = _url_safe(name)
    if plain == name:
        return f'attachment; filename="{name}"'
    return f"attachment; filename=\"{plain}\"; filename*=UTF-8''{urllib.parse.quote(name, safe='')}"


@dataclass
class _Stored:
    path: Path
    shown: str  # the download's name
    size: int
    made: float


class FileStore:
    """The translated files: kept for ``keep`` seconds, at most ``max_files`` of them and ``max_bytes`` in all
    (the oldest removed first), in a folder made on the first :meth:`put` and removed by :meth:`close`."""

    def __init__(self, keep: float = KEEP_SECONDS, max_files: int = MAX_STORED_FILES,
                 max_bytes: int = MAX_STORED_BYTES, clock: Callable[[], float] = time.monotonic) -> None:
        self.keep, self.max_files, self.max_bytes, self.clock = keep, max_files, max_bytes, clock
        self._files: OrderedDict[str, _Stored] = OrderedDict()  # oldest first
        self._lock = threading.Lock()
        self._folder: Path | None = None
        self._bytes = 0

    def put(self, data: bytes, shown_name: str) -> str:
        """Keep ``data``, to be downloaded as ``shown_name``; returns its name in the download's URL."""
        name = f"{uuid.uuid4().hex}.{_url_safe(shown_name)}"
        with self._lock:
            if self._folder is None:
                self._folder = Path(tempfile.mkdtemp(prefix="mtkit-serve-files-"))
            self._purge(adding=len(data))
            path = self._folder / uuid.uuid4().hex  # our own name on disk: nothing of the upload's
            path.write_bytes(data)
            self._files[name] = _Stored(path, shown_name, len(data), self.clock())
            self._bytes += len(data)
        return name

    def read(self, name: str) -> tuple[bytes, str] | None:
        """The file stored as ``name`` and its download's name; None for a name we did not make or that expired."""
        if not _NAME.fullmatch(name):
            return None
        with self._lock:
            self._purge()
            found = self._files.get(name)
            return None if found is None else (found.path.read_bytes(), found.shown)

    def _purge(self, adding: int | None = None) -> None:
        """Remove the expired files, then (``adding``: the size of a file to keep) the oldest until it fits
        (under the lock)."""
        now = self.clock()
        while self._files:
            name, oldest = next(iter(self._files.items()))
            fits = adding is None or (len(self._files) < self.max_files and self._bytes + adding <= self.max_bytes)
            if now - oldest.made <= self.keep and fits:
                break
            del self._files[name]
            self._bytes -= oldest.size
            oldest.path.unlink(missing_ok=True)

    def __len__(self) -> int:
        return len(self._files)

    def close(self) -> None:
        with self._lock:
            self._files.clear()
            self._bytes = 0
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
                self._folder = None


class Busy(Exception):
    """:data:`MAX_FILE_JOBS` documents are being translated already."""


class FileWork:
    """A server's file translation: the formats it reads, the worker threads documents are translated in, the
    bound on how many at once, and the translated files."""

    def __init__(self, max_file_bytes: int, jobs: int = MAX_FILE_JOBS, store: FileStore | None = None) -> None:
        self.max_file_bytes = max_file_bytes
        self.formats = supported_formats()
        self.store = store or FileStore()
        self.executor = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="mtkit-serve-file")
        self._slots = threading.Semaphore(jobs)
        self._lock = threading.Lock()
        self.running = 0  # documents being worked on (a worker thread's, until its work returns)

    def extensions(self) -> list[str]:
        return list(self.formats)

    def submit(self, work: Callable[[], bytes]):
        """Run ``work`` in a worker thread (a concurrent future), or raise :class:`Busy`."""
        if not self._slots.acquire(blocking=False):
            raise Busy()
        with self._lock:
            self.running += 1

        def done() -> None:
            with self._lock:
                self.running -= 1
            self._slots.release()

        def run() -> bytes:
            try:
                return work()
            finally:
                done()

        try:
            return self.executor.submit(run)
        except RuntimeError:  # the server is stopping
            done()
            raise Busy() from None

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.store.close()


class Cancelled(Exception):
    """The request a worker thread translates for is gone (its client went away): stop its work."""


class EngineFailed(Exception):
    """The batcher failed a part of the document (the engine's error, or a busy or slow server): not the
    document's fault; :attr:`error` is answered as /translate would answer it."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def chunks(sentences: list[str], max_lines: int, max_chars: int) -> list[list[str]]:
    """``sentences`` cut into parts of at most ``max_lines`` lines and ``max_chars`` characters (a longer
    sentence alone), in order."""
    found: list[list[str]] = []
    part: list[str] = []
    chars = 0
    for sentence in sentences:
        if part and (len(part) >= max_lines or chars + len(sentence) > max_chars):
            found.append(part)
            part, chars = [], 0
        part.append(sentence)
        chars += len(sentence)
    if part:
        found.append(part)
    return found


def read_document(data: bytes, fmt: str, name: str, texts, max_bytes: int) -> bytes:
    """:func:`mtkit.documents.translate_bytes`, each failure of the document's (an :class:`MtkitError`, one line;
    or anything a format's library raises on a stranger's file) an :class:`MtkitError` naming ``name``;
    :class:`EngineFailed` and a cancelled request pass through."""
    try:
        return translate_bytes(data, fmt, texts, name, Limits(max_bytes=max_bytes))
    except (MtkitError, EngineFailed, Cancelled):
        raise
    except ImportError as e:  # a format module that imports its library only now
        raise MtkitError(f"{name}: this server cannot read {fmt} documents ({e.name or e} is not installed)") from None
    except RecursionError:
        raise MtkitError(f"{name}: nested too deeply to read") from None
    except Exception as e:  # noqa: BLE001 - a library's error on a malformed file: the file's fault, said in a line
        logger.warning("a document could not be read", exc_info=True)
        raise MtkitError(f"{name}: cannot be read as a {fmt} document ({type(e).__name__}: "
                         f"{shown(str(e))})") from None


def sentence_translator(translate_part: Callable[[list[str]], list], max_lines: int, max_chars: int):
    """A :class:`mtkit.documents.Texts`' sentence translator over ``translate_part`` (lines to the batcher, one
    :class:`mtkit.engines.engine.Translation` each), in parts of ``max_lines`` lines and ``max_chars`` characters;
    its failures are :class:`EngineFailed` (not the document's)."""

    def translate(sentences: list[str]) -> list[tuple[str, list]]:
        out: list[tuple[str, list]] = []
        for part in chunks(sentences, max_lines, max_chars):
            try:
                got = translate_part(part)
            except Cancelled:
                raise
            except Exception as e:  # noqa: BLE001 - answered as the text API answers it, after the document
                raise EngineFailed(e) from None
            out.extend((clean_output(t.best.text), list(t.best.alignment or [])) for t in got)
        return out

    return translate


class Sample:
    """A sentence translator that gives every sentence back (each word aligned to itself) and keeps the first
    ``chars`` characters of the text: a document's language is detected on them (``source`` auto)."""

    def __init__(self, chars: int) -> None:
        self.chars = chars
        self.found: list[str] = []
        self._size = 0

    def __call__(self, sentences: list[str]) -> list[tuple[str, list]]:
        for sentence in sentences:
            if self._size >= self.chars:
                break
            self.found.append(sentence)
            self._size += len(sentence) + 1
        return identity(sentences)

    @property
    def text(self) -> str:
        return " ".join(self.found)[: self.chars]

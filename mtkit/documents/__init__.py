"""Documents in, documents out: a file's text translated, its structure and formatting kept.

A format module (one per family: :mod:`.office` for .docx/.pptx, :mod:`.odf`, :mod:`.epub`, :mod:`.subtitles` for
.srt/.vtt, :mod:`.markdown`, :mod:`.html`, :mod:`.plain`) reads a document's bytes, hands its text to a
:class:`Texts` as fragments of inline markup (a paragraph or a cue each, its formatting as tags: ``<g id="3">``
around a run, ``<x id="4"/>`` for what must stay as it is) and writes the same document back with each fragment
replaced by its translation, the tags placed around the target words aligned to those they wrapped
(:mod:`mtkit.text.markup`). What a format module needs is imported when its format is asked for.

Every archive is opened through :mod:`.archive` (entries counted and sized, and their inflation bounded, before
anything is inflated; names that leave the folder refused) and every XML part is vetted there by defusedxml
before a library parses it; the output is written to a temporary file and renamed (:func:`mtkit.io.atomic_path`).

No torch here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from html import escape, unescape  # by name: the submodule .html (the format) takes the name html here
from pathlib import Path

from mtkit.data.word_alignment import word_spans
from mtkit.documents.limits import Limits
from mtkit.errors import MtkitError
from mtkit.io import atomic_path, remove_dead_temporaries
from mtkit.text.markup import MarkupError, translate_markup

# format -> (the module that reads and writes it, the extensions it is taken from, binary?)
FORMATS: dict[str, tuple[str, tuple[str, ...], bool]] = {
    "docx": ("office", (".docx",), True),
    "pptx": ("office", (".pptx",), True),
    "odt": ("odf", (".odt",), True),
    "odp": ("odf", (".odp",), True),
    "epub": ("epub", (".epub",), True),
    "srt": ("subtitles", (".srt",), False),
    "vtt": ("subtitles", (".vtt",), False),
    "md": ("markdown", (".md", ".markdown"), False),
    "html": ("html", (".html", ".htm", ".xhtml"), False),
    "txt": ("plain", (".txt",), False),
}
DOCUMENT_FORMATS = tuple(FORMATS)
EXTENSIONS = {ext: name for name, (_, exts, _) in FORMATS.items() for ext in exts}

Aligned = Sequence[tuple[int, int]]
SentenceTranslator = Callable[[list[str]], list[tuple[str, Aligned]]]


def format_of(path: str | Path, given: str | None = None) -> str:
    """The document format of ``path``: ``given`` (``--format``) or its extension's; :class:`MtkitError` for neither."""
    if given is not None:
        if given not in FORMATS:
            raise MtkitError(f"--format {given}: not a document format (one of {', '.join(DOCUMENT_FORMATS)})")
        return given
    found = EXTENSIONS.get(Path(path).suffix.lower())
    if found is None:
        raise MtkitError(f"{path}: no document format for {Path(path).suffix or 'a name without an extension'} "
                         f"(one of {', '.join(sorted(EXTENSIONS))}; or say --format)")
    return found


def is_binary(fmt: str) -> bool:
    """Whether ``fmt`` is an archive (written only to a file, never to stdout)."""
    return FORMATS[fmt][2]


class Texts:
    """What a format hands its text to: fragments of inline markup in, the same fragments translated out.

    ``translate`` takes plain sentences and gives each one's translation and word alignment (pairs of
    ``text.split()`` word indices); without alignments (``aligned`` False: an ONNX engine) every tag cuts the
    fragment and only the text between tags is translated. ``done``: fragments translated so far, for a bar.
    """

    def __init__(self, translate: SentenceTranslator, aligned: bool = True,
                 progress: Callable[[int], None] | None = None) -> None:
        self._translate, self.aligned, self._progress = translate, aligned, progress
        self.done = 0

    def fragments(self, fragments: Sequence[str], kind: str = "xml", where: str = "") -> list[str]:
        """Each fragment (``xml``: every tag inline; ``html``: block tags cut sentences) translated, its tags
        placed; ``where`` names the document part in an error for markup that is not well-formed."""
        if not fragments:
            return []
        try:
            out = translate_markup(fragments, kind, self._translate, inline=self.aligned)
        except MarkupError as e:
            raise MtkitError(f"{where + ': ' if where else ''}{e}") from None
        self.done += len(fragments)
        if self._progress is not None:
            self._progress(len(fragments))
        return out

    def plain(self, texts: Sequence[str], where: str = "") -> list[str]:
        """Plain texts (no markup: ``<`` and ``&`` are text) translated."""
        escaped = [escape(t, quote=False) for t in texts]
        return [unescape(t) for t in self.fragments(escaped, "xml", where)]


def identity(sentences: list[str]) -> list[tuple[str, Aligned]]:
    """Every sentence translated to itself, each word aligned to itself: a round trip that must give back the
    document it was given (the format modules' tests)."""
    return [(s, [(i, i) for i in range(len(word_spans(s)))]) for s in sentences]


def translate_bytes(data: bytes, fmt: str, texts: Texts, name: str, limits: Limits = Limits()) -> bytes:
    """The document ``data`` (format ``fmt``; ``name`` names it in errors) with its text translated through
    ``texts``; :class:`MtkitError` (one line naming ``name``) for a file that is not a well-formed, bounded
    document of that format."""
    if len(data) > limits.max_bytes:
        raise MtkitError(f"{name}: {len(data):,} bytes, more than the {limits.max_bytes:,} a document may have")
    try:
        module = importlib.import_module(f"{__name__}.{FORMATS[fmt][0]}")
    except ModuleNotFoundError as e:
        if e.name is None or e.name.startswith(__name__):
            raise
        raise MtkitError(f"{name}: a {fmt} document needs {e.name}, which is not installed: "
                         "pip install 'mtkit[documents]'") from None
    return module.translate(data, fmt, texts, name, limits)


XML_PARTS = (".xml", ".rels", ".opf", ".ncx", ".xhtml", ".htm", ".html", ".svg")


def precheck(data: bytes, fmt: str, name: str, limits: Limits = Limits()) -> None:
    """What can be refused before a model loads or a request queues, at a cost bounded by the size: the size, an
    archive's directory and entries (:class:`mtkit.documents.archive.Archive`) and its XML parts (vetted), a text
    format's encoding. A file that passes may still be refused by its format's reader."""
    if len(data) > limits.max_bytes:
        raise MtkitError(f"{name}: {len(data):,} bytes, more than the {limits.max_bytes:,} a document may have")
    if not is_binary(fmt):
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            raise MtkitError(f"{name}: line {line}: not valid UTF-8 (byte {e.start:,})") from None
        return
    from mtkit.documents.archive import Archive  # defusedxml and lxml: the documents extra

    archive = Archive(data, name, limits)
    for entry in archive.names():
        if entry.lower().endswith(XML_PARTS) and not entry.lower().endswith((".htm", ".html")):
            if fmt == "epub" and b"<!DOCTYPE" in archive.read(entry):
                continue  # EPUB 2's XHTML and NCX doctypes: the book's reader vets them (mtkit.documents.epub)
            archive.xml(entry)


def translate_file(source: str | Path, out: str | Path, texts: Texts, fmt: str | None = None,
                   limits: Limits = Limits()) -> str:
    """Translate the document ``source`` into ``out`` (written to a temporary file and renamed: never half-written;
    nothing is written when anything fails). Returns the format."""
    source, out = Path(source), Path(out)
    fmt = format_of(source, fmt)
    try:
        size = source.stat().st_size
        if size > limits.max_bytes:
            raise MtkitError(f"{source}: {size:,} bytes, more than the {limits.max_bytes:,} a document may have")
        data = source.read_bytes()
    except OSError as e:
        raise MtkitError(f"{source}: {e.strerror or e}") from None
    result = translate_bytes(data, fmt, texts, str(source), limits)
    remove_dead_temporaries(out)
    with atomic_path(out, owned=True) as tmp:
        Path(tmp).write_bytes(result)
    return fmt

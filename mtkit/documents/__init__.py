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
from dataclasses import dataclass
from html import escape, unescape  # by name: the submodule .html (the format) takes the name html here
from pathlib import Path

from mtkit.data.word_alignment import word_spans
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


@dataclass(frozen=True)
class Limits:
    """What a document from elsewhere may cost: its size on disk, and what its archive may inflate to."""

    max_bytes: int = 256 << 20  # the file itself
    max_entries: int = 10_000  # entries of an archive (.docx, .pptx, .odt, .epub)
    max_inflated: int = 1 << 30  # all entries together, inflated
    max_entry: int = 256 << 20  # one entry, inflated
    max_ratio: int = 200  # inflated / compressed, for an entry past 1 MiB inflated (a zip bomb's is ~1000)


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
    module = importlib.import_module(f"{__name__}.{FORMATS[fmt][0]}")
    return module.translate(data, fmt, texts, name, limits)


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

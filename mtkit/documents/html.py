"""HTML documents (.html, .htm, .xhtml): the whole page translated as one document, its markup kept.

The page is cut at its block tags into runs of text and inline tags (:func:`mtkit.text.markup.blocks`, read as a
browser reads a page: line breaks are spaces, ``<p>`` and ``<li>`` need no closing tag); each run is one fragment
for :class:`~mtkit.documents.Texts`, which places its inline tags back around the aligned words. The doctype,
comments, ``<head>`` (but its ``<title>``, which a browser shows), attributes, and the whitespace and line breaks
between blocks come back as written; so do the elements the web marks not to translate (``translate="no"``,
``class="notranslate"``, ``<code>``, ``<pre>``, ``<script>``, ``<style>``, ``<kbd>``, ``<samp>``, ``<var>``). A run
whose translation is its source comes back byte for byte.

Encoding: UTF-8 (with or without a byte order mark), UTF-16 with a byte order mark, or what a ``<meta charset>``
or the XML declaration in the first bytes says, written back in the same encoding (a character it cannot hold as
a character reference).
"""

from __future__ import annotations

import codecs
import re

from mtkit.documents import Limits, Texts
from mtkit.errors import MtkitError
from mtkit.text.markup import Block, MarkupError, blocks

_SNIFF = 4096  # bytes read for a declared encoding (HTML's prescan reads 1024; a long <head> comment pushes it on)
_DECLARED = re.compile(rb"""<meta[^>]*?charset\s*=\s*["']?\s*([-\w.:]+)|<\?xml[^>]*?encoding\s*=\s*["']([-\w.:]+)""",
                       re.I)
_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))


def decode(data: bytes, name: str) -> tuple[str, str, bytes]:
    """``data`` as text, the encoding to write it back in, and its byte order mark (``b""`` for none); one
    :class:`MtkitError` line for an encoding Python does not know or bytes that are not in it."""
    bom, encoding = next(((b, e) for b, e in _BOMS if data.startswith(b)), (b"", None))
    if encoding is None:
        found = _DECLARED.search(data, 0, _SNIFF)
        declared = (found.group(1) or found.group(2)).decode("ascii") if found else "utf-8"
        try:
            encoding = codecs.lookup(declared).name
        except LookupError:
            raise MtkitError(f"{name}: declares the encoding {declared!r}, which is not one Python knows") from None
        if encoding.startswith(("utf-16", "utf-32")):  # declared in ASCII bytes: it cannot be (HTML reads UTF-8)
            encoding = "utf-8"
    try:
        return data[len(bom):].decode(encoding), encoding, bom
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, len(bom) + e.start) + 1
        raise MtkitError(f"{name}: line {line}: not valid {encoding} (byte {len(bom) + e.start:,})") from None


def translate_text(text: str, texts: Texts, where: str) -> str:
    """A whole (X)HTML document's text translated, its markup kept (module docstring)."""
    try:
        parts = blocks(text)
    except MarkupError as e:
        raise MtkitError(f"{where}: {e}") from None
    runs = [p for p in parts if isinstance(p, Block)]
    done = iter(texts.fragments([run.fragment for run in runs], "html", where))
    return "".join(p.rebuild(next(done)) if isinstance(p, Block) else p for p in parts)


def translate(data: bytes, fmt: str, texts: Texts, name: str, limits: Limits) -> bytes:
    text, encoding, bom = decode(data, name)
    return bom + translate_text(text, texts, name).encode(encoding, "xmlcharrefreplace")

"""EPUB books (.epub): each XHTML content document of the manifest translated as an HTML document
(:mod:`.html`), the table of contents' labels (``toc.ncx``) and the book's ``dc:title`` too; every other entry
byte for byte the same, ``mimetype`` first and stored.

The zip is read through :class:`~mtkit.documents.archive.Archive` (bounded) and written back by it, rather than
through ebooklib, which rebuilds the package document and the navigation as it writes a book (an identity round
trip would not give back the same parts) and parses the XHTML without our vetting. ``META-INF/container.xml``
names the package document (OPF), whose manifest says which entries are XHTML (``application/xhtml+xml``, the
navigation document ``nav.xhtml`` among them) and which is the NCX.

Every XML part is vetted by defusedxml before it is read: no entity declarations (billion laughs), no external
entities. A document type declaration (``<!DOCTYPE html>``, EPUB 2's XHTML 1.1 public identifier) is allowed, as
EPUB books carry one, and with it HTML's named entities (``&nbsp;``, which that DTD defines); one that declares an
entity is refused. A translated part is vetted again: it is well-formed XML as its source was.
"""

from __future__ import annotations

import html
import posixpath
import re
from html.entities import name2codepoint
from urllib.parse import unquote
from xml.etree.ElementTree import Element, ParseError

import defusedxml
from defusedxml.ElementTree import fromstring

from mtkit.documents import Limits, Texts
from mtkit.documents.archive import Archive, vet_xml
from mtkit.documents.html import decode, translate_text
from mtkit.errors import MtkitError

CONTAINER = "META-INF/container.xml"
XHTML = "application/xhtml+xml"
NCX = "application/x-dtbncx+xml"
# a navigation label's or the book title's text (plain: no element inside); [^<>]* never reads past a tag
_NCX_LABEL = re.compile(r"(<(?:\w+:)?(?:navLabel|docTitle)\b[^<>]*>\s*<(?:\w+:)?text\b[^<>]*>)([^<]*)(</)")
_DC_TITLE = re.compile(r"(<dc:title\b[^<>]*>)([^<]*)(</dc:title>)")
_NAMED = re.compile(rb"&([A-Za-z][A-Za-z0-9]{0,31});")
_HTML_ENTITIES = {k: v for k, v in name2codepoint.items() if k not in ("amp", "lt", "gt", "quot", "apos")}


def vetted(data: bytes, where: str) -> Element:
    """``data`` parsed by defusedxml: :class:`MtkitError` naming ``where`` for an entity declaration, an external
    entity or XML that is not well-formed; a doctype without an internal subset allowed (module docstring)."""
    if b"<!DOCTYPE" not in data:
        vet_xml(data, where)
    else:  # XHTML 1.1's DTD names HTML's entities (&nbsp;): read as their characters, as a reader's DTD would
        data = _NAMED.sub(lambda m: f"&#{_HTML_ENTITIES[m.group(1).decode()]};".encode()
                          if m.group(1).decode() in _HTML_ENTITIES else m.group(0), data)
    try:
        return fromstring(data, forbid_dtd=False, forbid_entities=True, forbid_external=True)
    except defusedxml.DefusedXmlException as e:
        raise MtkitError(f"{where}: refused XML ({type(e).__name__}: a DTD or an entity, which a document never "
                         "needs)") from None
    except ParseError as e:
        raise MtkitError(f"{where}: not well-formed XML ({e})") from None


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _package(archive: Archive) -> str:
    """The package document's entry, as ``META-INF/container.xml`` names it."""
    if CONTAINER not in archive.entries:
        raise MtkitError(f"{archive.name}: not an EPUB book (no {CONTAINER})")
    root = vetted(archive.read(CONTAINER), f"{archive.name}: {CONTAINER}")
    found = next((e.get("full-path") for e in root.iter() if _local(e.tag) == "rootfile" and e.get("full-path")),
                 None)
    if found is None or found not in archive.entries:
        raise MtkitError(f"{archive.name}: {CONTAINER} names no package document in the book ({found!r})")
    return found


def _manifest(archive: Archive, opf: str, root: Element) -> list[tuple[str, str]]:
    """(entry, media type) of each manifest item, its href resolved against the package document's folder."""
    items = []
    for item in root.iter():
        if _local(item.tag) != "item" or not item.get("href"):
            continue
        href = unquote(item.get("href").split("#", 1)[0])
        entry = posixpath.normpath(posixpath.join(posixpath.dirname(opf), href))
        if entry.startswith(("../", "/")) or entry == "..":
            raise MtkitError(f"{archive.name}: {opf}: manifest item {href!r} leaves the book")
        items.append((entry, item.get("media-type", "")))
    return items


def _labels(archive: Archive, entry: str, pattern: re.Pattern, texts: Texts) -> None:
    """The plain texts that ``pattern``'s second group finds in the XML part ``entry`` translated in place."""
    where = f"{archive.name}: {entry}"
    vetted(archive.read(entry), where)
    text, encoding, bom = decode(archive.read(entry), where)
    found = list(pattern.finditer(text))
    sources = [html.unescape(m.group(2)) for m in found]
    todo = [k for k, s in enumerate(sources) if s.strip()]
    done = dict(zip(todo, texts.plain([sources[k].strip() for k in todo], where), strict=True))
    pieces, at = [], 0
    for k, m in enumerate(found):
        translated = done.get(k)
        if translated is not None and translated != sources[k].strip():
            source = m.group(2)
            lead, tail = source[: len(source) - len(source.lstrip())], source[len(source.rstrip()):]
            pieces += [text[at : m.start(2)], lead, html.escape(translated, quote=False), tail]
            at = m.end(2)
    pieces.append(text[at:])
    archive.replace(entry, bom + "".join(pieces).encode(encoding, "xmlcharrefreplace"))


def translate(data: bytes, fmt: str, texts: Texts, name: str, limits: Limits) -> bytes:
    archive = Archive(data, name, limits)
    opf = _package(archive)
    items = _manifest(archive, opf, vetted(archive.read(opf), f"{name}: {opf}"))
    done: set[str] = set()
    for entry, media_type in items:
        if media_type not in (XHTML, NCX) or entry in done:  # (an entry listed twice is translated once)
            continue
        done.add(entry)
        if entry not in archive.entries:
            raise MtkitError(f"{name}: {opf}: the manifest names {entry!r}, which is not in the book")
        where = f"{name}: {entry}"
        if media_type == NCX:
            _labels(archive, entry, _NCX_LABEL, texts)
            continue
        source = archive.read(entry)
        vetted(source, where)
        text, encoding, bom = decode(source, where)
        result = bom + translate_text(text, texts, where).encode(encoding, "xmlcharrefreplace")
        vetted(result, f"{where} (translated)")
        archive.replace(entry, result)
    _labels(archive, opf, _DC_TITLE, texts)
    return archive.write()

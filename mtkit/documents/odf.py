"""OpenDocument text (.odt) and presentation (.odp): every paragraph's text translated, the XML around it kept.

The ODF XML is read and written with lxml directly, not through odfpy: odfpy loads a whole document into its own
objects and writes every part anew (declarations, prefixes and the order of attributes change, and parts it does
not know may not survive), while here a part whose text did not change keeps its bytes and a paragraph whose
translation is its own text keeps its XML.

What is translated: every ``text:p`` and ``text:h`` in ``content.xml``'s body (tables, lists, frames and text
boxes, shapes, slides and their ``presentation:notes``), in ``styles.xml``'s master pages (headers and footers,
their ``-left`` and ``-first`` variants, a presentation's master shapes), the texts of ``svg:title`` and
``svg:desc`` (pictures' names and descriptions), a presentation's footer, header and date declarations, and
``meta.xml``'s title, subject and description. A paragraph is one fragment of inline markup (:mod:`.runs`): a
``text:span`` is a run (its tag and attributes, ``text:style-name`` above all, are the run's key), a ``text:a``
hyperlink, a ``text:meta`` and a span that holds other spans are wrappers (nested spans stay nested tags, so an
inner one is placed within the words of the outer one), everything else inside the paragraph is an atom carried
whole to its place (spaces ``text:s``, tabs, line breaks, fields, bookmarks, a picture's ``draw:frame``, a
comment, a ``text:note``). A footnote's or a frame's paragraphs are paragraphs of their own, translated
separately, and their ``text:note`` or ``draw:frame`` stays one atom in the paragraph around it, moved (not
copied) to its place. A paragraph whose translation has its own words keeps its XML as it was.

ODF collapses runs of whitespace in text (``text:s`` and ``text:tab`` say where it counts), so a text's newlines
(pretty-printed XML) are read as the space they show. An atom that separates words (``text:s``, a tab, a line
break) is given spaces around it in the fragment, so that the words on either side are two words to the
translator; when the paragraph is rebuilt the spaces beside every atom are as they were in the source.

Every part is read through :class:`.archive.Archive` (bounded) and vetted by defusedxml before lxml parses it; a
part is replaced only when one of its texts changed, and the archive is written in its order (``mimetype`` first
and stored, as ODF wants).
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from dataclasses import dataclass

from lxml import etree

from mtkit.documents import Limits, Texts
from mtkit.documents.archive import Archive, parse_xml
from mtkit.documents.runs import Fragment, Piece, from_fragment, to_fragment
from mtkit.errors import MtkitError

OFFICE = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
PRESENTATION = "urn:oasis:names:tc:opendocument:xmlns:presentation:1.0"
SVG = "urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0"
DC = "http://purl.org/dc/elements/1.1/"

BODIES = {"odt": "text", "odp": "presentation"}  # format -> the office:body child its documents have
MIMETYPE = "application/vnd.oasis.opendocument."
PARAGRAPHS = (f"{{{TEXT}}}p", f"{{{TEXT}}}h")
SPAN = f"{{{TEXT}}}span"
WRAPPERS = frozenset((f"{{{TEXT}}}a", f"{{{TEXT}}}meta"))  # inline elements around text that are not formatting
SEPARATORS = frozenset((f"{{{TEXT}}}s", f"{{{TEXT}}}tab", f"{{{TEXT}}}line-break"))  # atoms between two words
PLAIN = (f"{{{SVG}}}title", f"{{{SVG}}}desc", f"{{{PRESENTATION}}}header-decl", f"{{{PRESENTATION}}}footer-decl",
         f"{{{PRESENTATION}}}date-time-decl")  # elements whose whole content is one plain text
META = (f"{{{DC}}}title", f"{{{DC}}}subject", f"{{{DC}}}description")
BATCH = 300  # paragraphs per call of Texts.fragments: one call per part for most documents, bounded memory for any
_TAG_SPACES = re.compile(r"\s*(<[^<>]*>)\s*")
_SPACES = re.compile(r"\s+")
_WHITESPACE = re.compile(r"[ \t\r\n]+")  # ODF's whitespace (§6.1.2 of ODF 1.2 part 1): a run of it shows as a space


@dataclass(frozen=True)
class Atom:
    """An element inside a paragraph that is not text, carried whole, with the spans it was in (``run``), which it
    keeps wherever it lands (a page number stays bold), and whether a space was before and after it."""

    element: etree._Element
    run: tuple[Hashable, ...]
    before: bool
    after: bool

    @property
    def separates(self) -> bool:
        return self.element.tag in SEPARATORS


@dataclass
class Paragraph:
    """A ``text:p`` or ``text:h`` and its text as a fragment, read before any paragraph is rebuilt."""

    element: etree._Element
    fragment: Fragment


def translate(data: bytes, fmt: str, texts: Texts, name: str, limits: Limits) -> bytes:
    """The ODF document ``data`` with every text translated through ``texts`` (module docstring)."""
    archive = Archive(data, name, limits)
    _check(archive, name)
    content = _part(archive, "content.xml")
    _check_body(content, fmt, name)
    _translate_part(archive, "content.xml", content, content.find(f"{{{OFFICE}}}body"), texts)
    if "styles.xml" in archive.entries:
        styles = _part(archive, "styles.xml")
        _translate_part(archive, "styles.xml", styles, styles.find(f"{{{OFFICE}}}master-styles"), texts)
    if "meta.xml" in archive.entries:
        meta = _part(archive, "meta.xml")
        items = [e for e in meta.iterfind(f"{{{OFFICE}}}meta/*") if e.tag in META]
        if _plain(items, texts, f"{archive.name}: meta.xml"):
            archive.replace("meta.xml", _serialize(meta, archive.read("meta.xml")))
    return archive.write()


def _check(archive: Archive, name: str) -> None:
    """An ODF package: its ``mimetype`` (where there is one) an OpenDocument type, a ``content.xml``, and not
    encrypted (an encrypted part is not XML: saying so is more use than a parse error)."""
    if "mimetype" in archive.entries:
        mimetype = archive.read("mimetype").decode("ascii", "replace").strip()
        if not mimetype.startswith(MIMETYPE):
            raise MtkitError(f"{name}: not an OpenDocument file (its mimetype is {mimetype[:80]!r})")
    manifest = archive.entries.get("META-INF/manifest.xml")
    if manifest is not None and b"encryption-data" in manifest.data:
        raise MtkitError(f"{name}: the document is encrypted (saved with a password); save it without one first")
    if "content.xml" not in archive.entries:
        raise MtkitError(f"{name}: not an OpenDocument file (no content.xml in the archive)")


def _check_body(content: etree._Element, fmt: str, name: str) -> None:
    """``content.xml`` of a document of ``fmt``'s kind (``office:body`` holds ``office:text`` or
    ``office:presentation``)."""
    body = content.find(f"{{{OFFICE}}}body")
    kinds = [etree.QName(e).localname for e in body if isinstance(e.tag, str)] if body is not None else []
    if content.tag != f"{{{OFFICE}}}document-content" or not kinds:
        raise MtkitError(f"{name}: content.xml is not an OpenDocument document's content (no office:body)")
    if kinds[0] != BODIES[fmt]:
        raise MtkitError(f"{name}: an OpenDocument {kinds[0]} document, not {BODIES[fmt]} (.{fmt})")


def _part(archive: Archive, entry: str) -> etree._Element:
    return parse_xml(archive.read(entry), f"{archive.name}: {entry}")


def _translate_part(archive: Archive, entry: str, root: etree._Element, within: etree._Element | None,
                    texts: Texts) -> None:
    """Translate the paragraphs and plain texts under ``within`` and put the part back when any changed."""
    if within is None:
        return
    where = f"{archive.name}: {entry}"
    paragraphs = [Paragraph(p, to_fragment(_pieces(p))) for p in within.iter(*PARAGRAPHS)]
    todo = [p for p in paragraphs if p.fragment.text.strip()]
    changed = False
    for at in range(0, len(todo), BATCH):
        batch = todo[at : at + BATCH]
        for paragraph, markup in zip(batch, texts.fragments([p.fragment.markup for p in batch], "xml", where),
                                     strict=True):
            if _text(markup) != _text(paragraph.fragment.markup):
                _rebuild(paragraph.element, from_fragment(paragraph.fragment, markup))
                changed = True
    changed = _plain(list(within.iter(*PLAIN)), texts, where) or changed
    if changed:
        archive.replace(entry, _serialize(root, archive.read(entry)))


def _text(markup: str) -> str:
    """The words of ``markup``: its plain text without the whitespace beside its tags, every other run of
    whitespace one space. A translation whose words are its source's (the identity) leaves the paragraph as it
    was: :func:`mtkit.text.markup.place` puts tags around whole words, so "<g>bike</g>." would come back as
    "<g>bike.</g>" and "<g>A </g>dog" as "<g>A</g> dog", and the source's XML is what such a translation means."""
    return Fragment(markup=_SPACES.sub(" ", _TAG_SPACES.sub(r"\1", markup)).strip()).text


def _plain(elements: list[etree._Element], texts: Texts, where: str) -> bool:
    """Translate those of ``elements`` that hold one plain text (no child element); whether any changed."""
    elements = [e for e in elements if len(e) == 0 and (e.text or "").strip()]
    changed = False
    for element, text in zip(elements, texts.plain([e.text for e in elements], where), strict=True):
        if text != element.text:
            element.text, changed = text, True
    return changed


def _key(element: etree._Element) -> tuple[str, tuple[tuple[str, str], ...]]:
    """An inline element as a hashable it can be made again from: its tag and its attributes, in order."""
    return element.tag, tuple(element.attrib.items())


def _pieces(paragraph: etree._Element) -> list[Piece]:
    """The paragraph's text and atoms in order, each with its run (the innermost span around it, when that holds
    no other span) and its wrappers (hyperlinks and the spans that hold other spans, outermost first: nested
    spans stay nested tags, so an inner one is placed within the words of the outer one); a separator with a
    space on each side. An explicit stack: spans nested to any depth cost no recursion."""
    found: list[tuple[str | etree._Element, tuple[etree._Element, ...]]] = []
    holding: set[etree._Element] = set()  # the spans that hold another span
    todo: list[tuple[object, tuple[etree._Element, ...], etree._Element | None]] = []

    def enter(element: etree._Element, chain: tuple[etree._Element, ...], span: etree._Element | None) -> None:
        items = [(element.text, chain, span)] if element.text else []
        for child in element:
            items.append((child, chain, span))
            if child.tail:
                items.append((child.tail, chain, span))
        todo.extend(reversed(items))

    enter(paragraph, (), None)
    while todo:
        item, chain, span = todo.pop()
        if isinstance(item, str):
            found.append((_WHITESPACE.sub(" ", item), chain))
        elif item.tag == SPAN:
            if span is not None:
                holding.add(span)
            enter(item, chain + (item,), item)
        elif item.tag in WRAPPERS:
            enter(item, chain + (item,), span)
        else:
            found.append((item, chain))
    pieces = []
    for item, chain in found:
        run = tuple(_key(e) for e in chain if e.tag == SPAN and e not in holding)
        wrappers = tuple(_key(e) for e in chain if e.tag != SPAN or e in holding)
        pieces.append(Piece(item, run, wrappers) if isinstance(item, str) else Piece("", run, wrappers, item))
    out: list[Piece] = []
    for k, piece in enumerate(pieces):
        if piece.atom is None:
            out.append(piece)
            continue
        before = k > 0 and pieces[k - 1].atom is None and pieces[k - 1].text.endswith(" ")
        after = k + 1 < len(pieces) and pieces[k + 1].atom is None and pieces[k + 1].text.startswith(" ")
        atom = Atom(piece.atom, piece.run, before, after)
        if atom.separates and k > 0 and not before:
            out.append(Piece(" ", out[-1].run, out[-1].wrappers))
        out.append(Piece("", piece.run, piece.wrappers, atom))
        if atom.separates and k + 1 < len(pieces) and not after:
            out.append(Piece(" ", piece.run, piece.wrappers))
    return out


def _rebuild(paragraph: etree._Element, pieces: list[Piece]) -> None:
    """The paragraph's content made again from ``pieces``: its own attributes kept, each text in the spans of its
    run inside its wrappers (hyperlinks outermost), each atom moved (not copied) to its place, so that a note's
    or a frame's paragraphs, translated on their own, stay what they are."""
    pieces = _respaced(pieces)
    for child in list(paragraph):
        paragraph.remove(child)  # atoms inside it are moved out below
    paragraph.text = None
    opened: list[tuple[tuple[str, Hashable], etree._Element]] = []
    placed: set[int] = set()
    for piece in pieces:
        atom = piece.atom if isinstance(piece.atom, Atom) else None
        run = atom.run if atom is not None else piece.run or ()
        wanted = [("wrap", w) for w in piece.wrappers] + [("run", r) for r in run]
        common = 0
        while common < min(len(opened), len(wanted)) and opened[common][0] == wanted[common]:
            common += 1
        del opened[common:]
        for kind_key in wanted[common:]:
            tag, attributes = kind_key[1]
            parent = opened[-1][1] if opened else paragraph
            opened.append((kind_key, etree.SubElement(parent, tag, dict(attributes))))
        parent = opened[-1][1] if opened else paragraph
        if atom is None:
            _append_text(parent, piece.text)
            continue
        element = atom.element
        if id(element) in placed:  # the same atom twice (never from markup.place): a copy, so both show
            element = etree.fromstring(etree.tostring(element, with_tail=False))
        placed.add(id(atom.element))
        element.tail = None
        parent.append(element)


def _respaced(pieces: list[Piece]) -> list[Piece]:
    """``pieces`` with the spaces beside each atom as they were in the source: :func:`_pieces` put spaces beside
    a separator for the translator (a space before a tab or after a line break would show), and
    :func:`mtkit.text.markup.place` puts a void tag before the word after it ("Page <field/>" comes back
    "Seite<field/> ", "dog<note/> runs" as "Hund <note/>rennt"). An atom that was glued to the words on both
    sides and lands between two words is glued to the one before it (a footnote's mark)."""
    out = [Piece(p.text, p.run, p.wrappers, p.atom) for p in pieces]
    for k, piece in enumerate(out):
        atom = piece.atom
        if not isinstance(atom, Atom):
            continue
        left = out[k - 1] if k and out[k - 1].atom is None else None
        right = out[k + 1] if k + 1 < len(out) and out[k + 1].atom is None else None
        if left is not None:
            left.text = left.text.rstrip(" ")
        if right is not None:
            right.text = right.text.lstrip(" ")
        words_before = left is not None and (left.text != "" or k > 1)
        words_after = right is not None and (right.text != "" or k + 2 < len(out))
        if words_before and atom.before:
            left.text += " "
        if words_after and (atom.after or (words_before and not atom.before and not atom.separates)):
            right.text = " " + right.text
    return [p for p in out if p.atom is not None or p.text]


def _append_text(parent: etree._Element, text: str) -> None:
    if len(parent):
        parent[-1].tail = (parent[-1].tail or "") + text
    else:
        parent.text = (parent.text or "") + text


def _serialize(root: etree._Element, original: bytes) -> bytes:
    """The part written back with the XML declaration it had (the same bytes up to the root element)."""
    tree = root.getroottree()
    encoding = tree.docinfo.encoding or "UTF-8"
    if encoding.upper().replace("-", "") != "UTF8" or not original.startswith(b"<?xml"):
        return etree.tostring(tree, xml_declaration=True, encoding=encoding)
    end = original.index(b"?>") + 2
    prolog = original[:end] + original[end : len(original) - len(original[end:].lstrip())]
    return prolog + etree.tostring(tree, encoding="UTF-8", xml_declaration=False)

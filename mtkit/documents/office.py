"""Word (.docx) and PowerPoint (.pptx) documents: every paragraph's text translated, the rest of the package as it
was.

The package is opened through :class:`~mtkit.documents.archive.Archive` (bounded; every XML part vetted by
defusedxml) and the parts that hold text are edited as XML with lxml, not through python-docx/python-pptx: those
see the body, tables and headers but not footnotes, endnotes, text boxes, content controls or tracked changes, and
rewrite every part they load, where editing the XML reaches every paragraph wherever it sits and leaves a part's
bytes as they were when none of its paragraphs changed. The parts come from ``[Content_Types].xml``: Word's main
document, headers, footers, footnotes and endnotes; PowerPoint's slides and notes (layouts and masters hold
placeholder prompts, not the presentation's text, and are left alone; so are comments, charts and SmartArt).

A paragraph (``w:p``, ``a:p``) is read into :mod:`.runs` pieces: each run's text with its properties as written
(``w:rPr``/``a:rPr``, PowerPoint's hyperlink included) as its formatting; hyperlinks, content controls, tracked
insertions, smart tags and simple fields as wrappers around their runs; a complex field (``w:fldChar`` begin, its
code, separate, its result, end) and a bookmark that opens and closes in the paragraph as wrappers too, the
field's code carried whole (``w:instrText`` is never translated) and its result translated; tabs, breaks,
pictures, footnote references, deletions and whatever else is not text as atoms carried to their place. Three
rules put atoms where a reader expects them, which an atom alone (put before the word aligned to the one after
it) would miss: atoms before the paragraph's first text or after its last (a footnote's own number, a picture)
stay first or last; an atom written right after a word (``here<footnote/>.``) follows that word's translation; a
tab or a break between two words without spaces is spaced for the translation (else the two read as one word)
and unspaced again. Spelling marks (``w:proofErr``, ``err``) and layout caches (``w:lastRenderedPageBreak``)
describe the English text and are dropped from a paragraph that changes. A paragraph whose text comes back as it
went is left untouched (its formatting is where it was), so the identity round trip gives back the same bytes.

Fragments go to :class:`~mtkit.documents.Texts` a few hundred at a time (the engine batches their sentences). The
paragraphs are walked with explicit stacks (any nesting depth) and changed from the last to the first, so that a
text box inside a paragraph is translated before its paragraph's runs are rebuilt around it.
"""
from __future__ import annotations

import copy
import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from itertools import accumulate

from lxml import etree

from mtkit.documents import Limits, Texts
from mtkit.documents.archive import Archive, parse_xml
from mtkit.documents.runs import Fragment, Piece, from_fragment, to_fragment
from mtkit.errors import MtkitError

BATCH = 256  # fragments per call to Texts.fragments
MAX_NESTED = 16  # fields nested, and bookmarks, in a paragraph that become wrappers (each costs a pass over it)
_XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
_TYPES_NS = "{http://schemas.openxmlformats.org/package/2006/content-types}"
_PARTS = {  # the content types whose parts hold a document's text
    "docx": re.compile(r"(wordprocessingml|ms-word)\.[A-Za-z.]*(main|header|footer|footnotes|endnotes)\+xml$"),
    "pptx": re.compile(r"presentationml\.(slide|notesSlide)\+xml$"),
}
_MAIN = {"docx": re.compile(r"(wordprocessingml|ms-word)\.[A-Za-z.]*main\+xml$"),
         "pptx": re.compile(r"(presentationml|ms-powerpoint)\.[A-Za-z.]*main\+xml$")}
_MAIN_NAME = {"docx": "Word document part", "pptx": "PowerPoint presentation part"}
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")  # what XML 1.0 cannot hold
_EMPTY_G = re.compile(r'<g id="([0-9]+)"></g>')


@dataclass(frozen=True)
class Dialect:
    """What a paragraph is made of in one format: local names in its namespace ``ns``, where both formats call a
    paragraph ``p``, a run ``r``, its properties ``rPr`` and its text ``t``."""

    ns: str
    keep: frozenset[str]  # the paragraph's own children (properties), kept where they are
    drop: frozenset[str]  # what describes the source text only: gone from a changed paragraph
    separators: frozenset[str]  # atoms that part words (a tab, a break)
    wrappers: frozenset[str] = frozenset()  # elements around runs
    wrapper_props: frozenset[str] = frozenset()  # a wrapper's own children (not its content)
    fields: bool = False  # Word's complex fields (w:fldChar, w:instrText)
    ranges: tuple[tuple[str, str], ...] = ()  # marks that open and close a range (bookmarks), matched by their id
    unmarked: tuple[str, ...] = ()  # attributes of a run's properties that are no formatting (spell check marks)

    def q(self, local: str) -> str:
        return f"{{{self.ns}}}{local}"


def word(ns: str) -> Dialect:
    return Dialect(ns, keep=frozenset({"pPr"}),
                   drop=frozenset({"proofErr", "lastRenderedPageBreak", "softHyphen"}),
                   separators=frozenset({"tab", "br", "cr", "ptab"}),
                   wrappers=frozenset({"hyperlink", "ins", "moveTo", "smartTag", "customXml", "sdt", "fldSimple",
                                       "dir", "bdo"}),
                   wrapper_props=frozenset({"smartTagPr", "customXmlPr", "fldData", "sdtPr", "sdtEndPr"}),
                   fields=True, ranges=(("bookmarkStart", "bookmarkEnd"), ("commentRangeStart", "commentRangeEnd")))


def drawing(ns: str) -> Dialect:
    return Dialect(ns, keep=frozenset({"pPr", "endParaRPr"}), drop=frozenset(),
                   separators=frozenset({"br"}), unmarked=("err", "dirty"))


_WORD_NS = {"http://schemas.openxmlformats.org/wordprocessingml/2006/main",
            "http://purl.oclc.org/ooxml/wordprocessingml/main"}
_DRAWING_NS = {False: "http://schemas.openxmlformats.org/drawingml/2006/main",
               True: "http://purl.oclc.org/ooxml/drawingml/main"}


def _local(el, ns: str) -> str:
    """An element's local name in the namespace ``ns``; "" for another namespace, a comment or an instruction."""
    tag = el.tag
    return tag[len(ns) + 2:] if isinstance(tag, str) and tag.startswith(f"{{{ns}}}") else ""


@dataclass(eq=False)
class Atom:
    """What is carried whole: ``origins`` (a run's properties key and one of its children, or None and an element
    of the paragraph), rebuilt in order; a separator glued to the text on a side had a space added there for the
    translation, taken away again."""

    origins: list[tuple[Hashable, etree._Element]]
    separator: bool = False
    glue_left: bool = False
    glue_right: bool = False


@dataclass
class Around:
    """A wrapper that is no element but what is written before and after its words: a complex field's code
    (begin .. separate) and its end around its result, a bookmark's start and end, atoms after the word they
    followed."""

    before: list[tuple[Hashable, etree._Element]]
    after: list[tuple[Hashable, etree._Element]]


@dataclass
class _Item:
    """A run's text, or one thing of a paragraph that is not text, as read (before fields and bookmarks fold)."""

    run: Hashable
    wrappers: tuple[Hashable, ...]
    origin: tuple[Hashable, etree._Element]
    text: str | None = None  # None: an atom
    separator: bool = False
    folded: list[tuple[Hashable, etree._Element]] | None = None  # a field's code carried whole: its origins


@dataclass
class Paragraph:
    """A paragraph read: its fragment and what rebuilding it needs."""

    element: etree._Element
    part: str
    fragment: Fragment
    runs: dict[Hashable, etree._Element]  # formatting key -> a run holding only those properties
    shells: dict[Hashable, object] = field(default_factory=dict)  # wrapper key -> element shell or Around
    head: list[Atom] = field(default_factory=list)  # atoms before its first text (a footnote's number) and after
    tail: list[Atom] = field(default_factory=list)  # its last (a picture): kept first and last, out of the fragment


class Reader:
    """Reads the paragraphs of one part in a dialect."""

    def __init__(self, d: Dialect) -> None:
        self.d = d

    def local(self, el) -> str:
        return _local(el, self.d.ns)

    def run_key(self, run, runs: dict) -> Hashable:
        props = run.find(self.d.q("rPr"))
        if props is None:
            key: Hashable = b""
        else:
            if any(name in props.attrib for name in self.d.unmarked):
                props = copy.deepcopy(props)
                for name in self.d.unmarked:
                    props.attrib.pop(name, None)
            key = etree.tostring(props) if len(props) or props.attrib else b""
        if key not in runs:
            skeleton = etree.Element(run.tag, run.attrib, nsmap=run.nsmap)  # (lxml drops the repeated nsmap)
            if props is not None:
                skeleton.append(copy.deepcopy(props))
            runs[key] = skeleton
        return key

    def wrapper(self, el, shells: dict) -> tuple[Hashable, list] | None:
        """The key and content of a wrapper element, or None when it has no content (then it is an atom)."""
        d = self.d
        holder = el
        if self.local(el) == "sdt":
            holder = el.find(d.q("sdtContent"))
            if holder is None:
                return None
        content = [c for c in holder if not (holder is el and self.local(c) in d.wrapper_props)]
        if not content:
            return None
        shell = etree.Element(el.tag, el.attrib, nsmap=el.nsmap)  # its properties, not its content
        for c in el:
            if self.local(c) in d.wrapper_props:
                shell.append(copy.deepcopy(c))
        if holder is not el:
            etree.SubElement(shell, d.q("sdtContent"))
        key = ("el", etree.tostring(shell))
        shells.setdefault(key, shell)
        return key, content

    def items(self, p, runs: dict, shells: dict) -> list[_Item]:
        """The paragraph's runs' texts and atoms, in order, with the wrappers around each (explicit stack)."""
        d = self.d
        out: list[_Item] = []
        stack = [(iter(p), ())]
        while stack:
            children, wrappers = stack[-1]
            el = next(children, None)
            if el is None:
                stack.pop()
                continue
            name = self.local(el)
            if (len(stack) == 1 and name in d.keep) or name in d.drop:
                continue
            if name == "r":
                key = self.run_key(el, runs)
                for c in el:
                    cname = self.local(c)
                    if cname == "rPr" or cname in d.drop:
                        continue
                    if cname == "t":
                        out.append(_Item(key, wrappers, (key, c), c.text or ""))
                    else:
                        out.append(_Item(key, wrappers, (key, c), separator=cname in d.separators))
                continue
            found = self.wrapper(el, shells) if name in d.wrappers else None
            if found is not None:
                stack.append((iter(found[1]), (*wrappers, found[0])))
            else:
                out.append(_Item(None, wrappers, (None, el), separator=name in d.separators))
        return out

    def fields(self, items: list[_Item], shells: dict) -> list[_Item] | None:
        """Word's complex fields folded: each one's code an atom, its result wrapped, its end the wrapper's
        close; a field that begins or ends in another paragraph as atoms. None: fields that cross wrappers."""
        d = self.d

        def kind(item: _Item) -> str:
            el = item.origin[1]
            return el.get(d.q("fldCharType"), "") if item.text is None and self.local(el) == "fldChar" else ""

        kinds = [kind(i) for i in items]
        if not any(kinds):
            return items
        complete, open_ = [], []
        for k, t in enumerate(kinds):
            if t == "begin":
                if len(open_) == MAX_NESTED:  # (no document nests fields so deep; each level costs a pass)
                    return None
                open_.append([k, None])
            elif t == "separate" and open_ and open_[-1][1] is None:
                open_[-1][1] = k
            elif t == "end" and open_:
                b, s = open_.pop()
                complete.append((b, s, k))
        # code ranges: carried whole (a field without a result whole, one open past the paragraph's end to it)
        texts = list(accumulate((bool(i.text and i.text.strip()) for i in items), initial=0))
        ranges = [(b, s) if s is not None and texts[e] > texts[s + 1] else (b, e) for b, s, e in complete]
        ranges += [(b, s if s is not None else len(items) - 1) for b, s in open_]
        ranges.sort()
        merged: list[list[int]] = []
        for b, e in ranges:
            if merged and b <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([b, e])
        code_at = {b: e for b, e in merged}
        results = sorted((b, s, e) for b, s, e in complete if s is not None and code_at.get(b) == s)
        ends = {}
        for b, s, e in results:  # outer fields first: an inner one's wrappers hold the outer's
            prefix = items[b].wrappers
            if items[s].wrappers != prefix or items[e].wrappers != prefix or any(
                    items[k].wrappers[:len(prefix)] != prefix for k in range(s, e)):
                return None
            key = ("field", b)
            ends[e] = key
            for k in range(s + 1, e):
                items[k].wrappers = (*prefix, key, *items[k].wrappers[len(prefix):])
        out: list[_Item] = []
        k = 0
        wrapped = {b for b, _, _ in results}
        while k < len(items):
            if k in code_at:
                e = code_at[k]
                if any(items[j].wrappers != items[k].wrappers for j in range(k, e + 1)):
                    return None
                code = [i.origin for i in items[k:e + 1]]
                if k in wrapped:
                    shells[("field", k)] = Around(code, [])
                else:
                    out.append(_Item(items[k].run, items[k].wrappers, items[k].origin, folded=code))
                k = e + 1
            else:
                if k in ends:
                    shells[ends[k]].after = [items[k].origin]
                else:
                    out.append(items[k])
                k += 1
        if any(isinstance(s, Around) and not s.after for s in shells.values()):  # fields nested across each other
            return None
        return out

    def read(self, p, part: str) -> Paragraph | None:
        """The paragraph as a fragment, or None when it has no text (or a structure it cannot rebuild)."""
        runs: dict[Hashable, etree._Element] = {}
        shells: dict[Hashable, object] = {}
        items = self.items(p, runs, shells)
        if not any(i.text and i.text.strip() for i in items):
            return None
        if self.d.fields:
            items = self.fields(items, shells)
            if items is None:
                return None
        if self.d.ranges:
            items = self.ranges(items, shells)
        pieces: list[Piece] = []
        for item in items:
            if item.text is not None:
                pieces.append(Piece(item.text, item.run, item.wrappers))
                continue
            atom = Atom(item.folded or [item.origin], separator=item.separator)
            pieces.append(Piece("", item.run, item.wrappers, atom))
        if not any(piece.atom is None and piece.text.strip() for piece in pieces):  # its text was a field's code
            return None
        first = next(k for k, piece in enumerate(pieces) if piece.atom is None or piece.wrappers)
        last = max(k for k, piece in enumerate(pieces) if piece.atom is None or piece.wrappers)
        head, tail = [piece.atom for piece in pieces[:first]], [piece.atom for piece in pieces[last + 1:]]
        pieces = pieces[first:last + 1]
        for k, piece in enumerate(pieces):  # "Name<tab/>Value" would read "NameValue": spaced for the translation
            atom = piece.atom
            if not (isinstance(atom, Atom) and atom.separator):
                continue
            left = pieces[k - 1] if k else None
            right = pieces[k + 1] if k + 1 < len(pieces) else None
            if left is not None and left.atom is None and left.text[-1:] and not left.text[-1].isspace():
                left.text, atom.glue_left = left.text + " ", True
            if right is not None and right.atom is None and right.text[:1] and not right.text[0].isspace():
                right.text, atom.glue_right = " " + right.text, True
        return Paragraph(p, part, to_fragment(self.glued(pieces, shells)), runs, shells, head, tail)

    def ranges(self, items: list[_Item], shells: dict) -> list[_Item]:
        """A bookmark (or a comment's range) that opens and closes in the paragraph around words as a wrapper of
        them, so that it stays around their translation; one that crosses another wrapper or leaves the
        paragraph stays two atoms."""
        d = self.d
        closing = {end: start for start, end in d.ranges}
        opened: dict[tuple[str, str | None], int] = {}
        pairs: list[tuple[int, int]] = []
        for k, item in enumerate(items):
            if item.text is not None or item.origin[0] is not None or item.folded:
                continue
            name, ident = self.local(item.origin[1]), item.origin[1].get(d.q("id"))
            if name in closing:
                start = opened.pop((closing[name], ident), None)
                if start is not None:
                    pairs.append((start, k))
            elif any(name == start for start, _ in d.ranges):
                opened[(name, ident)] = k
        gone: set[int] = set()
        for s, e in sorted(pairs)[:MAX_NESTED]:  # the outer first, as with fields (each costs a pass)
            prefix = items[s].wrappers
            if e == s + 1 or items[e].wrappers != prefix or any(
                    items[k].wrappers[:len(prefix)] != prefix for k in range(s + 1, e)):
                continue
            key = ("range", s)
            shells[key] = Around([items[s].origin], [items[e].origin])
            for k in range(s + 1, e):
                items[k].wrappers = (*prefix, key, *items[k].wrappers[len(prefix):])
            gone |= {s, e}
        return [item for k, item in enumerate(items) if k not in gone]

    @staticmethod
    def glued(pieces: list[Piece], shells: dict) -> list[Piece]:
        """Atoms written right after a word ("here<footnote/>."), which an atom alone would put before the word
        aligned to the one after it, wrapped with that word instead: written after its translation."""
        out: list[Piece] = []
        after: Around | None = None  # the wrapper of the word just wrapped, while its atoms follow
        for piece in pieces:
            atom, word = piece.atom, (out[-1] if out else None)
            level = len(piece.wrappers)
            glued = (isinstance(atom, Atom) and not atom.separator and word is not None
                     and word.wrappers[:level] == piece.wrappers)
            if glued and after is None:
                glued = word.atom is None and word.text[-1:].strip() != ""
                start = re.search(r"\S+$", word.text).start() if glued else 0
                if glued and len(word.wrappers) > level:  # "<link>here</link><ref/>": only a link that is one word
                    before = out[-2].wrappers[level:level + 1] if len(out) > 1 else ()
                    glued = start == 0 and before != word.wrappers[level:level + 1]
            if not glued:
                out.append(piece)
                after = None
                continue
            if after is None:
                out.pop()
                if start:
                    out.append(Piece(word.text[:start], word.run, word.wrappers))
                key = ("after", len(shells))
                after = shells[key] = Around([], [])
                out.append(Piece(word.text[start:], word.run, (*piece.wrappers, key, *word.wrappers[level:])))
            after.after.extend(atom.origins)
        return out


class Writer:
    """Rebuilds a paragraph's content from its translated pieces."""

    def __init__(self, d: Dialect) -> None:
        self.d = d

    def origins(self, para: Paragraph, origins, sink: Callable, used: set[int]) -> None:
        """Elements carried whole: run children in runs of their own properties (adjacent ones sharing one)."""
        current, current_key = None, None
        for key, el in origins:
            if id(el) in used:  # placed twice by the alignment: a copy (never expected)
                el = copy.deepcopy(el)
            used.add(id(el))
            if key is None:
                sink(el)
                current = None
                continue
            if current is None or key != current_key:
                current, current_key = copy.deepcopy(para.runs[key]), key
                sink(current)
            current.append(el)

    def text(self, para: Paragraph, key: Hashable, text: str, sink: Callable) -> None:
        if not text:
            return
        text = _NOT_XML.sub("", text)
        if not text:
            return
        run = copy.deepcopy(para.runs[key])
        t = etree.SubElement(run, self.d.q("t"))
        t.text = text
        if self.d.fields and (text != text.strip() or "  " in text):  # Word drops unmarked edge spaces
            t.set(_XML_SPACE, "preserve")
        sink(run)

    def rebuild(self, para: Paragraph, pieces: list[Piece]) -> None:
        d, p = self.d, para.element
        trailing = None
        for child in list(p):
            name = _local(child, d.ns)
            if name in d.keep:
                if name != "pPr":
                    trailing = child
                continue
            p.remove(child)
        top = trailing.addprevious if trailing is not None else p.append
        for k, piece in enumerate(pieces):  # a separator's added spaces taken away again
            atom = piece.atom
            if isinstance(atom, Atom) and atom.separator:
                if atom.glue_left and k and pieces[k - 1].atom is None:
                    pieces[k - 1].text = pieces[k - 1].text.rstrip()
                if atom.glue_right and k + 1 < len(pieces) and pieces[k + 1].atom is None:
                    pieces[k + 1].text = pieces[k + 1].text.lstrip()
        used: set[int] = set()
        for atom in para.head:
            self.origins(para, atom.origins, top, used)
        stack: list[tuple[Hashable, Callable]] = [(None, top)]
        placed: set[int] = set()

        def close() -> None:
            key, _ = stack.pop()
            shell = para.shells[key]
            if isinstance(shell, Around):
                self.origins(para, shell.after, stack[-1][1], used)

        for piece in pieces:
            common = 0
            while (common < len(piece.wrappers) and common + 1 < len(stack)
                   and stack[common + 1][0] == piece.wrappers[common]):
                common += 1
            while len(stack) > common + 1:
                close()
            for key in piece.wrappers[common:]:
                shell = para.shells[key]
                if isinstance(shell, Around):
                    self.origins(para, shell.before, stack[-1][1], used)
                    stack.append((key, stack[-1][1]))
                else:
                    made = copy.deepcopy(shell)
                    stack[-1][1](made)
                    inner = made.find(d.q("sdtContent")) if made.tag == d.q("sdt") else made
                    stack.append((key, inner.append))
            if isinstance(piece.atom, Atom):
                placed.add(id(piece.atom))
                self.origins(para, piece.atom.origins, stack[-1][1], used)
            elif piece.atom is None:
                self.text(para, piece.run, piece.text, stack[-1][1])
        while len(stack) > 1:
            close()
        for atom in para.tail:
            self.origins(para, atom.origins, top, used)
        for atom in para.fragment.atoms:  # an atom the translation lost (never expected): kept at the end
            if isinstance(atom, Atom) and id(atom) not in placed:
                self.origins(para, atom.origins, top, used)


def pieces_of(para: Paragraph, markup: str) -> list[Piece]:
    """The translated markup's pieces; a wrapper the alignment left without words kept (empty) in its place,
    empty formatting dropped."""
    frag = para.fragment
    atoms = list(frag.atoms)

    def keep(m: re.Match) -> str:
        kind, _ = frag.keys[int(m.group(1))]
        if kind != "wrap":
            return ""
        atoms.append(None)
        return f'<g id="{m.group(1)}"><x id="{len(atoms) - 1}"/></g>'

    while True:
        fixed = _EMPTY_G.sub(keep, markup)
        if fixed == markup:
            break
        markup = fixed
    return from_fragment(Fragment(frag.markup, frag.keys, atoms, frag.base), markup)


def _parts(archive: Archive, fmt: str) -> list[str]:
    """The parts that hold the text, from the package's content types; :class:`MtkitError` for a package
    without the format's main part."""
    name = archive.name
    if "[Content_Types].xml" not in archive.entries:
        raise MtkitError(f"{name}: not a .{fmt} (no [Content_Types].xml)")
    types = parse_xml(archive.xml("[Content_Types].xml"), f"{name}: [Content_Types].xml")
    overrides = [(o.get("PartName", "").lstrip("/"), o.get("ContentType", ""))
                 for o in types.iter(f"{_TYPES_NS}Override")]
    if not any(_MAIN[fmt].search(kind) and part in archive.entries for part, kind in overrides):
        raise MtkitError(f"{name}: not a .{fmt} (no {_MAIN_NAME[fmt]} in the archive)")
    # (a part named twice is read once; one named but absent is nothing to translate, as Word and PowerPoint see it)
    return list(dict.fromkeys(part for part, kind in overrides if _PARTS[fmt].search(kind) and part in archive.entries))


def _dialect(root, fmt: str) -> Dialect:
    ns = etree.QName(root).namespace or ""
    if fmt == "docx":
        return word(ns if ns in _WORD_NS else next(iter(sorted(_WORD_NS))))
    return drawing(_DRAWING_NS[ns.startswith("http://purl.oclc.org/ooxml/")])


def translate(data: bytes, fmt: str, texts: Texts, name: str, limits: Limits) -> bytes:
    archive = Archive(data, name, limits)
    roots, paragraphs = {}, []
    for part in _parts(archive, fmt):
        root = parse_xml(archive.xml(part), f"{name}: {part}")
        reader = Reader(_dialect(root, fmt))
        roots[part] = (root, Writer(reader.d))
        for p in root.iter(reader.d.q("p")):
            found = reader.read(p, part)
            if found is not None:
                paragraphs.append(found)
    done: list[str] = []
    for k in range(0, len(paragraphs), BATCH):
        chunk = paragraphs[k:k + BATCH]
        done += texts.fragments([p.fragment.markup for p in chunk], "xml", name)
    changed: set[str] = set()
    for para, markup in reversed(list(zip(paragraphs, done, strict=True))):  # inner paragraphs first
        if markup == para.fragment.markup or Fragment(markup).text == para.fragment.text:
            continue  # the same text: its formatting is where it was
        roots[para.part][1].rebuild(para, pieces_of(para, markup))
        changed.add(para.part)
    for part in changed:
        root = roots[part][0]
        info = root.getroottree().docinfo
        archive.replace(part, etree.tostring(root, xml_declaration=True, encoding=info.encoding or "UTF-8",
                                             standalone=info.standalone))
    return archive.write() if changed else data

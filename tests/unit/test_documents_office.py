"""Word and PowerPoint documents (mtkit.documents.office): built with python-docx / python-pptx (the parts they
cannot write injected as XML), translated, and read back with them: the structure as it was, the text
translated, formatting on the words aligned to those it covered, the identity round trip byte for byte."""

from __future__ import annotations

import io
import re
import zipfile

import pytest
from conftest import MODELS

docx = pytest.importorskip("docx")
pptx = pytest.importorskip("pptx")
from docx.enum.text import WD_BREAK  # noqa: E402
from docx.oxml import parse_xml  # noqa: E402
from docx.oxml.ns import nsdecls  # noqa: E402
from docx.shared import RGBColor  # noqa: E402
from lxml import etree  # noqa: E402
from pptx.util import Inches  # noqa: E402

from mtkit.documents import Texts, identity, translate_bytes, translate_file  # noqa: E402
from mtkit.errors import MtkitError  # noqa: E402

MODEL = MODELS / "multi30k-en-de"
W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
R_ID = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}id"
URL = "https://example.org/guide"


def reverse_upper(sentences: list[str]) -> list[tuple[str, list[tuple[int, int]]]]:
    """A 'translation' that is easy to check: the words in reverse order, upper-cased, each aligned to its own."""
    out = []
    for s in sentences:
        words = s.split()
        n = len(words)
        out.append((" ".join(w.upper() for w in reversed(words)), [(i, n - 1 - i) for i in range(n)]))
    return out


def expected(text: str) -> str:
    return reverse_upper([text])[0][0]


# ------------------------------------------------------------------ building the documents


def _add_parts(data: bytes, parts: list[tuple[str, str, str, bytes]]) -> bytes:
    """``data`` (a .docx) with XML parts added: (name, content type, relationship type, bytes) each, related
    from the main document."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for info in src.infolist():
            body = src.read(info)
            if info.filename == "[Content_Types].xml":
                extra = "".join(f'<Override PartName="/{n}" ContentType="{t}"/>' for n, t, _, _ in parts)
                body = body.replace(b"</Types>", extra.encode() + b"</Types>")
            elif info.filename == "word/_rels/document.xml.rels":
                extra = "".join(f'<Relationship Id="rIdX{k}" Type="{r}" Target="{n.split("/")[-1]}"/>'
                                for k, (n, _, r, _) in enumerate(parts))
                body = body.replace(b"</Relationships>", extra.encode() + b"</Relationships>")
            zf.writestr(info, body)
        for n, _, _, body in parts:
            zf.writestr(n, body)
    return out.getvalue()


def _notes(kind: str, text: str) -> bytes:
    """A footnotes or endnotes part: the separators Word writes, and note 1 holding ``text``."""
    tag = kind[:-1]
    return (f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<w:{kind} {nsdecls("w")}>'
            f'<w:{tag} w:type="separator" w:id="-1"><w:p><w:r><w:separator/></w:r></w:p></w:{tag}>'
            f'<w:{tag} w:type="continuationSeparator" w:id="0"><w:p><w:r><w:continuationSeparator/></w:r></w:p>'
            f'</w:{tag}><w:{tag} w:id="1"><w:p><w:pPr><w:pStyle w:val="FootnoteText"/></w:pPr><w:r><w:rPr>'
            f'<w:vertAlign w:val="superscript"/></w:rPr><w:{tag}Ref/></w:r><w:r><w:t xml:space="preserve"> {text}'
            f'</w:t></w:r></w:p></w:{tag}></w:{kind}>').encode()


def _raw(document, xml: str):
    """A paragraph written as XML (what python-docx has no call for), added at the end of the body."""
    p = document.add_paragraph()
    element = parse_xml(xml)
    p._p.addprevious(element)
    p._p.getparent().remove(p._p)
    return element


def build_docx() -> bytes:
    d = docx.Document()
    d.add_heading("The yearly report", 1)
    p = d.add_paragraph("A man in a ", style="Body Text")
    p.add_run("red").bold = True
    p.add_run(" shirt is riding a bike.")
    p = d.add_paragraph("The ")
    p.add_run("small").italic = True
    p.add_run(" dog and the ")
    black = p.add_run("black")
    black.underline, black.font.color.rgb = True, RGBColor(0xFF, 0x00, 0x00)
    p.add_run(" cat.")
    p = d.add_paragraph("Read ")
    rid = d.part.relate_to(URL, "http://schemas.openxmlformats.org/officeDocument/2006/relationships/hyperlink",
                           is_external=True)
    p._p.append(parse_xml(f'<w:hyperlink {nsdecls("w", "r")} r:id="{rid}"><w:r><w:rPr><w:rStyle w:val="Hyperlink"/>'
                          '</w:rPr><w:t>the guide</w:t></w:r></w:hyperlink>'))
    p.add_run(" today.")
    p = d.add_paragraph("Name:")
    p.add_run().add_tab()
    p.add_run("Value")
    p.add_run().add_break(WD_BREAK.LINE)
    p.add_run("Second line.")
    w = nsdecls("w")
    _raw(d, f'<w:p {w}><w:bookmarkStart w:id="0" w:name="here"/><w:r><w:t xml:space="preserve">Page </w:t></w:r>'
            '<w:bookmarkEnd w:id="0"/><w:r><w:fldChar w:fldCharType="begin"/></w:r><w:r><w:instrText '
            'xml:space="preserve"> PAGE </w:instrText></w:r><w:r><w:fldChar w:fldCharType="separate"/></w:r>'
            '<w:r><w:t>1</w:t></w:r><w:r><w:fldChar w:fldCharType="end"/></w:r>'
            '<w:r><w:t xml:space="preserve"> of the report.</w:t></w:r></w:p>')
    _raw(d, f'<w:p {w}><w:r><w:t>A note follows here</w:t></w:r><w:r><w:rPr><w:vertAlign w:val="superscript"/>'
            '</w:rPr><w:footnoteReference w:id="1"/></w:r><w:r><w:t>.</w:t></w:r></w:p>')
    _raw(d, f'<w:p {w}><w:r><w:t xml:space="preserve">The </w:t></w:r><w:ins w:id="5" w:author="me" '
            'w:date="2026-01-01T00:00:00Z"><w:r><w:t>quick</w:t></w:r></w:ins><w:r><w:t xml:space="preserve"> '
            '</w:t></w:r><w:del w:id="6" w:author="me" w:date="2026-01-01T00:00:00Z"><w:r><w:delText>slow'
            '</w:delText></w:r></w:del><w:proofErr w:type="spellStart"/><w:r><w:t xml:space="preserve"> fox '
            'runs.</w:t></w:r><w:proofErr w:type="spellEnd"/></w:p>')
    _raw(d, f'<w:p {w}><w:r><w:t xml:space="preserve">Chosen: </w:t></w:r><w:sdt><w:sdtPr><w:alias w:val="Pick"/>'
            '<w:id w:val="77"/></w:sdtPr><w:sdtContent><w:r><w:t>blue house</w:t></w:r></w:sdtContent></w:sdt>'
            '<w:r><w:t xml:space="preserve"> today.</w:t></w:r></w:p>')
    _raw(d, f'<w:p {w} xmlns:v="urn:schemas-microsoft-com:vml"><w:r><w:t xml:space="preserve">Before the box. '
            '</w:t></w:r><w:r><w:pict><v:shape id="box" style="width:100pt;height:40pt"><v:textbox><w:txbxContent>'
            '<w:p><w:r><w:t>Text in a box.</w:t></w:r></w:p></w:txbxContent></v:textbox></v:shape></w:pict></w:r>'
            '</w:p>')
    _raw(d, f'<w:p {w}><w:r><w:t xml:space="preserve">Today is </w:t></w:r><w:r><w:fldChar w:fldCharType="begin"/>'
            '</w:r><w:r><w:instrText> DATE </w:instrText></w:r><w:r><w:fldChar w:fldCharType="end"/></w:r><w:r><w:t '
            'xml:space="preserve"> a good day.</w:t></w:r></w:p>')
    _raw(d, f'<w:p {w}><w:r><w:fldChar w:fldCharType="begin"/></w:r><w:r><w:instrText> TOC \\o </w:instrText></w:r>'
            '<w:r><w:fldChar w:fldCharType="separate"/></w:r><w:r><w:t>The first chapter</w:t></w:r></w:p>')
    _raw(d, f'<w:p {w}><w:r><w:t>The second chapter</w:t></w:r><w:r><w:fldChar w:fldCharType="end"/></w:r></w:p>')
    _raw(d, f'<w:sdt {w}><w:sdtPr><w:alias w:val="Block"/><w:id w:val="78"/></w:sdtPr><w:sdtContent><w:p><w:r>'
            '<w:t>A paragraph in a control.</w:t></w:r></w:p></w:sdtContent></w:sdt>')
    p = d.add_paragraph("The colour")
    p.add_run("s").italic = True  # formatting inside a word: the identity round trip leaves it where it is
    p.add_run(" of the sea.")
    table = d.add_table(rows=2, cols=2)
    for (r, c), text in zip([(0, 0), (0, 1), (1, 0)], ["The first cell", "The second cell", "A third cell"],
                            strict=True):
        table.cell(r, c).text = text
    inner = table.cell(1, 1).add_table(rows=1, cols=1)
    inner.cell(0, 0).text = "A nested cell"
    section = d.sections[0]
    section.header.paragraphs[0].text = "The default header"
    section.footer.paragraphs[0].text = "The default footer"
    section.different_first_page_header_footer = True
    section.first_page_header.paragraphs[0].text = "The first header"
    d.settings.odd_and_even_pages_header_footer = True
    section.even_page_header.paragraphs[0].text = "The even header"
    buf = io.BytesIO()
    d.save(buf)
    ct = "application/vnd.openxmlformats-officedocument.wordprocessingml."
    rel = "http://schemas.openxmlformats.org/officeDocument/2006/relationships/"
    return _add_parts(buf.getvalue(), [
        ("word/footnotes.xml", ct + "footnotes+xml", rel + "footnotes", _notes("footnotes", "The footnote text.")),
        ("word/endnotes.xml", ct + "endnotes+xml", rel + "endnotes", _notes("endnotes", "The endnote text.")),
    ])


def build_pptx() -> bytes:
    prs = pptx.Presentation()
    slide = prs.slides.add_slide(prs.slide_layouts[1])
    slide.shapes.title.text = "The title slide"
    body = slide.placeholders[1].text_frame
    body.text = "A man in a "
    p = body.paragraphs[0]
    p.add_run().text = "red"
    p.runs[-1].font.bold = True
    p.add_run().text = " shirt is riding a bike."
    p = body.add_paragraph()
    p.add_run().text = "Read "
    link = p.add_run()
    link.text = "the guide"
    link.hyperlink.address = URL
    p.add_run().text = " today."
    body.add_paragraph().text = "First line\vsecond line."
    p = body.add_paragraph()
    p.add_run().text = "The colour of the "
    p.add_run().text = "see"
    p.runs[-1]._r.get_or_add_rPr().set("err", "1")  # a spelling mark: no formatting of its own
    p.add_run().text = " is blue."
    p = body.add_paragraph()
    p.add_run().text = "Slide "
    p._p.append(etree.fromstring(f'<a:fld xmlns:a="{A[1:-1]}" id="{{B6F15528-21DE-4FAA-801E-634DDDAF4B2B}}" '
                                 'type="slidenum"><a:rPr lang="en-US"/><a:t>1</a:t></a:fld>'))
    slide.notes_slide.notes_text_frame.text = "The speaker notes are here."
    slide = prs.slides.add_slide(prs.slide_layouts[5])
    slide.shapes.title.text = "A table and a group"
    table = slide.shapes.add_table(2, 2, Inches(1), Inches(2), Inches(6), Inches(2)).table
    for (r, c), text in zip([(0, 0), (0, 1), (1, 0), (1, 1)], ["The first cell", "The second cell", "A third cell",
                                                              "A fourth cell"], strict=True):
        table.cell(r, c).text = text
    group = slide.shapes.add_group_shape()
    group.shapes.add_textbox(Inches(1), Inches(5), Inches(3), Inches(1)).text_frame.text = "A box in a group."
    buf = io.BytesIO()
    prs.save(buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def docx_bytes() -> bytes:
    return build_docx()


@pytest.fixture(scope="module")
def pptx_bytes() -> bytes:
    return build_pptx()


def entries(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {info.filename: zf.read(info) for info in zf.infolist()}


def count(data: bytes, part: str, tag: str) -> int:
    return sum(1 for _ in etree.fromstring(entries(data)[part]).iter(tag))


def texts_of(data: bytes, part: str, ns: str) -> list[str]:
    """Each paragraph's own text in a part (``t`` elements joined, a text box's left to its own paragraphs, spaces
    collapsed), the empty ones left out."""
    root = etree.fromstring(entries(data)[part])
    found = [" ".join("".join(t.text or "" for t in p.iter(f"{ns}t") if next(t.iterancestors(f"{ns}p")) is p).split())
             for p in root.iter(f"{ns}p")]
    return [t for t in found if t.strip()]


# ------------------------------------------------------------------ .docx


def test_the_identity_round_trip_gives_the_same_docx_byte_for_byte(docx_bytes):
    out = translate_bytes(docx_bytes, "docx", Texts(identity), "x.docx")
    assert entries(out) == entries(docx_bytes)


def test_a_docx_part_none_of_whose_paragraphs_changed_keeps_its_bytes(docx_bytes):
    def header_only(sentences):
        return [(expected(s), [(i, len(s.split()) - 1 - i) for i in range(len(s.split()))]) if "header" in s
                else (s, [(i, i) for i in range(len(s.split()))]) for s in sentences]

    before, after = entries(docx_bytes), entries(translate_bytes(docx_bytes, "docx", Texts(header_only), "x.docx"))
    changed = sorted(name for name in before if before[name] != after[name])
    assert list(after) == list(before)
    assert len(changed) == 3 and all(re.fullmatch(r"word/header[0-9]+\.xml", name) for name in changed)


@pytest.fixture(scope="module")
def docx_out(docx_bytes) -> bytes:
    return translate_bytes(docx_bytes, "docx", Texts(reverse_upper), "x.docx")


def test_every_docx_paragraph_is_translated_wherever_it_is(docx_bytes, docx_out):
    parts = [n for n in entries(docx_bytes) if re.fullmatch(r"word/(document|header\d+|footer\d+|footnotes|"
                                                          r"endnotes)\.xml", n)]
    assert len(parts) == 7  # the document, 3 headers, a footer, the footnotes and the endnotes
    for part in parts:
        source = [t for t in texts_of(docx_bytes, part, W) if re.search("[a-z]", t)]
        translated = texts_of(docx_out, part, W)
        assert not any(re.search("[a-z]{2}", t) for t in translated), (part, translated)  # no English left
        assert len(source) <= len(translated)
    body = texts_of(docx_out, "word/document.xml", W)
    for text in ["The yearly report", "Today is a good day.", "The first chapter", "The second chapter",
                 "A paragraph in a control.", "The first cell", "A nested cell", "Text in a box.", "Before the box."]:
        assert expected(text) in body
    assert expected("The footnote text.") in texts_of(docx_out, "word/footnotes.xml", W)
    assert expected("The endnote text.") in texts_of(docx_out, "word/endnotes.xml", W)
    d = docx.Document(io.BytesIO(docx_out))  # it opens, and python-docx finds every header
    section = d.sections[0]
    assert [section.header.paragraphs[0].text, section.first_page_header.paragraphs[0].text,
            section.even_page_header.paragraphs[0].text, section.footer.paragraphs[0].text] == [
        expected("The default header"), expected("The first header"), expected("The even header"),
        expected("The default footer")]


def test_docx_structure_and_styles_come_back_unchanged(docx_bytes, docx_out):
    before, after = docx.Document(io.BytesIO(docx_bytes)), docx.Document(io.BytesIO(docx_out))
    assert [p.style.name for p in after.paragraphs] == [p.style.name for p in before.paragraphs]
    assert len(after.tables) == len(before.tables)
    assert len(after.tables[0].cell(1, 1).tables) == 1
    for tag in ["p", "tbl", "tc", "pict", "tab", "br", "hyperlink", "footnoteReference", "bookmarkStart",
                "bookmarkEnd", "ins", "del", "sdt", "fldChar", "instrText", "pPr", "sectPr"]:
        assert count(docx_out, "word/document.xml", W + tag) == count(docx_bytes, "word/document.xml", W + tag), tag
    assert entries(docx_out)["word/styles.xml"] == entries(docx_bytes)["word/styles.xml"]


def test_docx_run_formatting_lands_on_the_aligned_words(docx_out):
    paragraphs = docx.Document(io.BytesIO(docx_out)).paragraphs
    red = next(p for p in paragraphs if "RED" in p.text)
    assert red.text == expected("A man in a red shirt is riding a bike.")
    assert [r.text for r in red.runs if r.bold] == ["RED"]  # not the article beside it, nor the full stop
    small = next(p for p in paragraphs if "SMALL" in p.text)
    assert [r.text for r in small.runs if r.italic] == ["SMALL"]
    black = [r for r in small.runs if r.underline]
    assert [r.text for r in black] == ["BLACK"] and black[0].font.color.rgb == RGBColor(0xFF, 0x00, 0x00)


def test_a_docx_hyperlink_wraps_its_translated_words_with_its_relationship(docx_bytes, docx_out):
    def links(data):
        p = next(p for p in docx.Document(io.BytesIO(data)).paragraphs if p.hyperlinks)
        return p, [(h.text, h.address, h._hyperlink.get(R_ID)) for h in p.hyperlinks]

    (_, before), (p, after) = links(docx_bytes), links(docx_out)
    assert p.text == expected("Read the guide today.")
    assert after == [("GUIDE THE", URL, before[0][2])]


def test_docx_tabs_breaks_fields_notes_and_tracked_changes_keep_their_place(docx_out):
    root = etree.fromstring(entries(docx_out)["word/document.xml"])
    paragraphs = list(root.iter(W + "p"))

    def holding(text):
        return next(p for p in paragraphs if text in "".join(t.text or "" for t in p.iter(W + "t")))

    def content(p):
        return [(e.tag[len(W):], e.text or e.get(W + "fldCharType") or "") for e in p.iter()
                if e.tag in {W + "t", W + "tab", W + "br", W + "fldChar", W + "instrText", W + "delText",
                             W + "footnoteReference"}]

    tabbed = content(holding("VALUE"))  # no space glued to the tab or the break
    assert "".join(x if k == "t" else {"tab": "\t", "br": "\n"}[k] for k, x in tabbed) == "LINE.\nSECOND\tVALUE NAME:"
    field = content(holding("REPORT."))
    assert [x for k, x in field if k != "t"] == ["begin", " PAGE ", "separate", "end"]  # the code untranslated
    assert "".join(x for k, x in field if k == "t") == "REPORT. THE OF 1 PAGE"
    note = holding("FOLLOWS")
    ref = next(note.iter(W + "footnoteReference")).getparent()
    assert ref.find(f"{W}rPr/{W}vertAlign").get(W + "val") == "superscript"
    changes = holding("FOX")
    assert ["".join(t.text for t in e.iter(W + "t")) for e in changes.iter(W + "ins")] == ["QUICK"]
    assert [e.text for e in changes.iter(W + "delText")] == ["slow"]
    marked = list(holding("REPORT."))[-3:]  # the bookmark around the translation of the word it marked
    assert [e.tag[len(W):] for e in marked] == ["bookmarkStart", "r", "bookmarkEnd"]
    assert marked[0].get(W + "id") == marked[2].get(W + "id") == "0" and marked[1].findtext(W + "t") == "PAGE"
    runs = list(note)  # the footnote's mark right after the word it followed ("here<ref/>.")
    at = next(k for k, r in enumerate(runs) if (r.findtext(W + "t") or "").endswith("HERE"))
    assert runs[at + 1].find(W + "footnoteReference") is not None  # before the full stop, as in the source
    assert (runs[at + 2].findtext(W + "t") or "").startswith(".")
    notes = etree.fromstring(entries(docx_out)["word/footnotes.xml"])
    own = next(p for p in notes.iter(W + "p") if "FOOTNOTE" in "".join(p.itertext()))
    assert next(e for e in own if e.tag != W + "pPr").find(W + "footnoteRef") is not None  # its number still first
    sdt = next(holding("HOUSE").iter(W + "sdt"))
    assert sdt.find(f"{W}sdtPr/{W}alias").get(W + "val") == "Pick"
    assert "".join(t.text for t in sdt.iter(W + "t")) == "HOUSE BLUE"


def test_a_note_after_a_linked_word_follows_the_link_where_it_moves():
    d = docx.Document()
    rid = d.part.relate_to(URL, "http://schemas.openxmlformats.org/officeDocument/2006/relationships/hyperlink",
                           is_external=True)
    _raw(d, f'<w:p {nsdecls("w", "r")}><w:r><w:t xml:space="preserve">Read </w:t></w:r><w:hyperlink r:id="{rid}">'
            '<w:r><w:t>this</w:t></w:r></w:hyperlink><w:r><w:rPr><w:vertAlign w:val="superscript"/></w:rPr>'
            '<w:endnoteReference w:id="1"/></w:r><w:r><w:t xml:space="preserve"> and the rest.</w:t></w:r></w:p>')
    buf = io.BytesIO()
    d.save(buf)
    out = translate_bytes(buf.getvalue(), "docx", Texts(reverse_upper), "note.docx")
    p = next(etree.fromstring(entries(out)["word/document.xml"]).iter(W + "p"))
    children = [(e.tag[len(W):], "".join(e.itertext())) for e in p]
    at = children.index(("hyperlink", "THIS"))
    assert children[at + 1][0] == "r" and p[at + 1].find(W + "endnoteReference") is not None
    assert "".join(text for _, text in children) == expected("Read this and the rest.")


def test_deeply_nested_wrappers_are_read_without_recursion():
    w = nsdecls("w")
    depth = 200
    xml = (f'<w:p {w}>' + '<w:smartTag w:element="x">' * depth + '<w:r><w:t>The deep words</w:t></w:r>'
           + '</w:smartTag>' * depth + '<w:r><w:t xml:space="preserve"> are here.</w:t></w:r></w:p>')
    d = docx.Document()
    _raw(d, xml)
    buf = io.BytesIO()
    d.save(buf)
    out = translate_bytes(buf.getvalue(), "docx", Texts(reverse_upper), "deep.docx")
    assert texts_of(out, "word/document.xml", W) == [expected("The deep words are here.")]
    assert count(out, "word/document.xml", W + "smartTag") == depth


# ------------------------------------------------------------------ .pptx


def test_the_identity_round_trip_gives_the_same_pptx_byte_for_byte(pptx_bytes):
    out = translate_bytes(pptx_bytes, "pptx", Texts(identity), "x.pptx")
    assert entries(out) == entries(pptx_bytes)


@pytest.fixture(scope="module")
def pptx_out(pptx_bytes) -> bytes:
    return translate_bytes(pptx_bytes, "pptx", Texts(reverse_upper), "x.pptx")


def test_every_pptx_text_frame_and_the_notes_are_translated(pptx_bytes, pptx_out):
    prs = pptx.Presentation(io.BytesIO(pptx_out))
    first, second = prs.slides
    assert first.shapes.title.text == expected("The title slide")
    assert first.notes_slide.notes_text_frame.text == expected("The speaker notes are here.")
    table = next(s for s in second.shapes if s.has_table).table
    assert [table.cell(r, c).text for r in range(2) for c in range(2)] == [
        expected(t) for t in ["The first cell", "The second cell", "A third cell", "A fourth cell"]]
    group = next(s for s in second.shapes if s.shape_type == 6)  # MSO_SHAPE_TYPE.GROUP
    assert [s.text_frame.text for s in group.shapes] == [expected("A box in a group.")]
    before, after = entries(pptx_bytes), entries(pptx_out)
    assert list(after) == list(before)
    untouched = [n for n in before if not re.fullmatch(r"ppt/(slides|notesSlides)/\w+\.xml", n)]
    assert all(before[n] == after[n] for n in untouched)  # layouts, masters, the theme as they were
    for part in [n for n in before if n not in untouched]:
        for tag in ["p", "r", "br", "fld", "tbl", "tc", "grpSp", "endParaRPr", "pPr"]:
            ns = A if tag not in {"grpSp"} else "{http://schemas.openxmlformats.org/presentationml/2006/main}"
            if tag != "r":
                assert count(pptx_out, part, ns + tag) == count(pptx_bytes, part, ns + tag), (part, tag)


def test_pptx_formatting_hyperlinks_breaks_and_fields_keep_their_place(pptx_out):
    body = pptx.Presentation(io.BytesIO(pptx_out)).slides[0].placeholders[1].text_frame
    red, link, lines, spelling, number = body.paragraphs
    assert red.text == expected("A man in a red shirt is riding a bike.")
    assert [r.text for r in red.runs if r.font.bold] == ["RED"]
    assert [(r.text, r.hyperlink.address) for r in link.runs if r.hyperlink.address] == [("GUIDE THE", URL)]
    assert lines.text == "LINE.\vSECOND LINE FIRST"
    assert [e.tag[len(A):] for e in lines._p if e.tag != A + "pPr"].count("br") == 1
    assert [r.text for r in spelling.runs] == [expected("The colour of the see is blue.")]
    assert "err" not in etree.tostring(spelling._p).decode()
    fld = number._p.find(A + "fld")
    assert fld is not None and fld.get("type") == "slidenum" and fld.findtext(A + "t") == "1"


def test_fragments_go_to_texts_a_batch_at_a_time():
    calls = []

    class Counted(Texts):
        def fragments(self, fragments, kind="xml", where=""):
            calls.append(len(fragments))
            return super().fragments(fragments, kind, where)

    d = docx.Document()
    for k in range(300):
        d.add_paragraph(f"Paragraph number {k} is here.")
    buf = io.BytesIO()
    d.save(buf)
    out = translate_bytes(buf.getvalue(), "docx", Counted(reverse_upper), "many.docx")
    assert calls == [256, 44]
    assert texts_of(out, "word/document.xml", W)[-1] == expected("Paragraph number 299 is here.")


def test_translate_file_takes_the_format_from_the_extension(tmp_path, pptx_bytes):
    source, out = tmp_path / "deck.pptx", tmp_path / "deck.de.pptx"
    source.write_bytes(pptx_bytes)
    assert translate_file(source, out, Texts(reverse_upper)) == "pptx"
    assert pptx.Presentation(out).slides[0].shapes.title.text == expected("The title slide")


# ------------------------------------------------------------------ files that are not documents


@pytest.mark.parametrize("fmt", ["docx", "pptx"])
def test_a_truncated_document_is_one_error_naming_it(fmt, docx_bytes, pptx_bytes):
    data = docx_bytes if fmt == "docx" else pptx_bytes
    with pytest.raises(MtkitError, match=rf"^broken\.{fmt}: ") as e:
        translate_bytes(data[: len(data) // 2], fmt, Texts(identity), f"broken.{fmt}")
    assert "\n" not in str(e.value)


def test_a_document_of_the_other_format_is_one_error_naming_it(docx_bytes, pptx_bytes):
    with pytest.raises(MtkitError, match=r"^slides\.docx: not a \.docx"):
        translate_bytes(pptx_bytes, "docx", Texts(identity), "slides.docx")
    with pytest.raises(MtkitError, match=r"^words\.pptx: not a \.pptx"):
        translate_bytes(docx_bytes, "pptx", Texts(identity), "words.pptx")


def _with_part(data: bytes, name: str, body: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for info in src.infolist():
            zf.writestr(info, body if info.filename == name else src.read(info))
    return out.getvalue()


def test_a_docx_whose_document_has_a_dtd_or_is_not_xml_is_refused(docx_bytes):
    laughs = (b'<?xml version="1.0"?>\n<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">'
              b'<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;">]>\n<w:document xmlns:w="' + W[1:-1].encode()
              + b'"><w:body><w:p><w:r><w:t>&lol3;</w:t></w:r></w:p></w:body></w:document>')
    bad = _with_part(docx_bytes, "word/document.xml", laughs)
    with pytest.raises(MtkitError, match=r"^bomb\.docx: word/document\.xml: refused XML") as e:
        translate_bytes(bad, "docx", Texts(identity), "bomb.docx")
    assert "\n" not in str(e.value)
    broken = _with_part(docx_bytes, "word/document.xml", b"<w:document><w:body>")
    with pytest.raises(MtkitError, match=r"^bad\.docx: word/document\.xml: not well-formed"):
        translate_bytes(broken, "docx", Texts(identity), "bad.docx")
    latin = _with_part(docx_bytes, "word/document.xml", b'<?xml version="1.0" encoding="UTF-8"?><w:document xmlns:w="'
                       + W[1:-1].encode() + b'"><w:body><w:p><w:r><w:t>caf\xe9</w:t></w:r></w:p></w:body></w:document>')
    with pytest.raises(MtkitError, match=r"^latin\.docx: word/document\.xml: not well-formed"):
        translate_bytes(latin, "docx", Texts(identity), "latin.docx")
    with pytest.raises(MtkitError, match=r"^text\.pptx: not a readable zip archive"):
        translate_bytes(b"A text file, not a presentation.\n", "pptx", Texts(identity), "text.pptx")


# ------------------------------------------------------------------ the real model


@pytest.fixture(scope="module")
def model():
    if not (MODEL / "config.yaml").exists():
        pytest.skip(f"the trained Multi30k model is not at {MODEL}")
    import mtkit

    return mtkit.load(MODEL)


@pytest.mark.slow
def test_the_real_model_translates_a_docx_with_bold_on_the_aligned_word(model):
    d = docx.Document()
    d.add_heading("A dog runs in the grass.", 1)
    for start in ["A man in a ", "A woman in a "]:
        p = d.add_paragraph(start, style="Body Text")
        p.add_run("red").bold = True
        p.add_run(" shirt is riding a bike.")
    d.add_table(rows=1, cols=1).cell(0, 0).text = "Two children are playing in the water."
    d.sections[0].header.paragraphs[0].text = "A girl is walking on the beach."
    buf = io.BytesIO()
    d.save(buf)
    out = model.translate_document(buf.getvalue(), "docx", name="real.docx")
    before, after = docx.Document(buf), docx.Document(io.BytesIO(out))
    assert [p.style.name for p in after.paragraphs] == [p.style.name for p in before.paragraphs]
    german = [p.text for p in after.paragraphs] + [after.tables[0].cell(0, 0).text,
                                                    after.sections[0].header.paragraphs[0].text]
    assert all(not re.search(r"\b(man|woman|shirt|children|girl|grass|beach)\b", t) for t in german), german
    assert re.search(r"\b(Mann|Frau|Hemd|Kinder|Mädchen|Hund|Strand|Wasser)\b", " ".join(german)), german
    for p in after.paragraphs[1:]:
        bold = [r.text for r in p.runs if r.bold]
        assert len(bold) == 1 and "rot" in bold[0] and len(bold[0].split()) <= 2, (p.text, bold)
        assert [r.text for r in p.runs if not r.bold]  # the rest of the sentence not bold


@pytest.mark.slow
def test_the_real_model_translates_a_pptx_with_bold_on_the_aligned_word(model):
    prs = pptx.Presentation()
    slide = prs.slides.add_slide(prs.slide_layouts[1])
    slide.shapes.title.text = "A dog runs in the grass."
    p = slide.placeholders[1].text_frame.paragraphs[0]
    for text in ["A man in a ", "red", " shirt is riding a bike."]:
        p.add_run().text = text
    p.runs[1].font.bold = True
    slide.notes_slide.notes_text_frame.text = "A girl is walking on the beach."
    buf = io.BytesIO()
    prs.save(buf)
    out = pptx.Presentation(io.BytesIO(model.translate_document(buf.getvalue(), "pptx", name="real.pptx")))
    slide = out.slides[0]
    p = slide.placeholders[1].text_frame.paragraphs[0]
    texts = [slide.shapes.title.text, p.text, slide.notes_slide.notes_text_frame.text]
    bold = [r.text for r in p.runs if r.font.bold]
    assert len(bold) == 1 and "rot" in bold[0] and len(bold[0].split()) <= 2, (p.text, bold)
    assert re.search(r"\b(Hund|Mann|Mädchen)\b", " ".join(texts)) and "shirt" not in p.text, texts

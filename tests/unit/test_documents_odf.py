"""OpenDocument text and presentation (mtkit.documents.odf): documents built here, translated through Texts with
the identity (same document back), a word-level translator written here (true alignments, adjectives moved after
their noun: formatting follows its words) and, marked slow, the real Multi30k model."""

from __future__ import annotations

import importlib.util
import io
import re
import zipfile

import pytest
from conftest import MODELS
from lxml import etree

from mtkit.documents import Limits, Texts, identity, translate_bytes
from mtkit.errors import MtkitError

NS = {
    "office": "urn:oasis:names:tc:opendocument:xmlns:office:1.0",
    "style": "urn:oasis:names:tc:opendocument:xmlns:style:1.0",
    "text": "urn:oasis:names:tc:opendocument:xmlns:text:1.0",
    "table": "urn:oasis:names:tc:opendocument:xmlns:table:1.0",
    "draw": "urn:oasis:names:tc:opendocument:xmlns:drawing:1.0",
    "fo": "urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0",
    "xlink": "http://www.w3.org/1999/xlink",
    "dc": "http://purl.org/dc/elements/1.1/",
    "meta": "urn:oasis:names:tc:opendocument:xmlns:meta:1.0",
    "svg": "urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0",
    "presentation": "urn:oasis:names:tc:opendocument:xmlns:presentation:1.0",
    "manifest": "urn:oasis:names:tc:opendocument:xmlns:manifest:1.0",
}
DECLARED = " ".join(f'xmlns:{k}="{v}"' for k, v in NS.items() if k != "manifest")
MODEL = MODELS / "multi30k-en-de"

TEXT_BODY = """
  <text:h text:style-name="Heading_20_1" text:outline-level="1">A dog in the park</text:h>
  <text:p text:style-name="Standard">A man in a <text:span text:style-name="T1">red</text:span> shirt is riding a
   bike.</text:p>
  <text:p text:style-name="Standard">A <text:span text:style-name="T2">big</text:span> dog runs on the <text:a
   xlink:type="simple" xlink:href="https://example.org/grass?a=1&amp;b=2">green grass</text:a> today.</text:p>
  <text:p text:style-name="Standard">Two women<text:s text:c="2"/>are sitting<text:tab/>on a bench.<text:note
   text:id="ftn1" text:note-class="footnote"><text:note-citation>1</text:note-citation><text:note-body><text:p
   text:style-name="Footnote">A small dog is sleeping.</text:p></text:note-body></text:note></text:p>
  <text:p text:style-name="Standard"><text:span text:style-name="T1">A <text:span text:style-name="T2">big</text:span>
   dog</text:span> is <text:bookmark text:name="here"/>running.</text:p>
  <table:table table:name="Table1"><table:table-column table:number-columns-repeated="2"/><table:table-row>
   <table:table-cell office:value-type="string"><text:p>A man</text:p></table:table-cell>
   <table:table-cell office:value-type="string"><text:p>a dog</text:p></table:table-cell></table:table-row>
  </table:table>
  <text:list text:style-name="L1"><text:list-item><text:p>A girl is running.</text:p></text:list-item>
   <text:list-item><text:p>A boy is jumping.</text:p></text:list-item></text:list>
  <text:p text:style-name="Standard"/>"""
TEXT_MASTER = """
  <style:master-page style:name="Standard" style:page-layout-name="pm1">
   <style:header><text:p text:style-name="Header">A dog in the park</text:p></style:header>
   <style:footer><text:p text:style-name="Footer">Page <text:page-number text:select-page="current">1</text:page-number
    ></text:p></style:footer>
   <style:footer-left><text:p text:style-name="Footer">A man</text:p></style:footer-left>
  </style:master-page>"""
SLIDES = """
  <draw:page draw:name="page1" draw:master-page-name="Default" presentation:presentation-page-layout-name="AL1T0">
   <draw:frame presentation:style-name="pr1" presentation:class="title" svg:width="25cm" svg:height="3cm"
    svg:x="1cm" svg:y="1cm"><draw:text-box><text:p>A dog in the park</text:p></draw:text-box></draw:frame>
   <draw:frame presentation:style-name="pr2" presentation:class="outline" svg:width="25cm" svg:height="10cm"
    svg:x="1cm" svg:y="5cm"><draw:text-box><text:list text:style-name="L2"><text:list-item><text:p>A man in a <text:span
    text:style-name="T1">red</text:span> shirt is riding a bike.</text:p></text:list-item></text:list></draw:text-box>
   </draw:frame>
   <presentation:notes draw:style-name="dp2"><draw:page-thumbnail draw:style-name="gr1" draw:page-number="1"
    presentation:class="page"/><draw:frame presentation:style-name="pr3" presentation:class="notes"><draw:text-box
    ><text:p>A girl is running.</text:p></draw:text-box></draw:frame></presentation:notes>
  </draw:page>
  <draw:page draw:name="page2" draw:master-page-name="Default">
   <draw:frame presentation:class="title"><draw:text-box><text:p>Two women</text:p></draw:text-box></draw:frame>
   <draw:custom-shape draw:style-name="gr2"><svg:title>a big dog</svg:title><text:p>A boy is jumping.</text:p>
    <draw:enhanced-geometry draw:type="rectangle"/></draw:custom-shape>
   <presentation:notes><draw:frame presentation:class="notes"><draw:text-box><text:p>A small dog is sleeping.</text:p
    ></draw:text-box></draw:frame></presentation:notes>
  </draw:page>"""
SLIDE_MASTER = """
  <style:master-page style:name="Default" style:page-layout-name="PM1" draw:style-name="dp1">
   <draw:frame presentation:class="title" presentation:placeholder="true"><draw:text-box/></draw:frame>
  </style:master-page>"""
AUTOMATIC = """<office:automatic-styles>
  <style:style style:name="T1" style:family="text"><style:text-properties fo:font-weight="bold"/></style:style>
  <style:style style:name="T2" style:family="text"><style:text-properties fo:font-style="italic"/></style:style>
 </office:automatic-styles>"""


def odf(kind: str = "text", body: str = TEXT_BODY, master: str = TEXT_MASTER, content: bytes | None = None,
        extra: dict[str, bytes] | None = None) -> bytes:
    """An ODF package as LibreOffice writes one: ``mimetype`` first and stored, the XML parts deflated."""
    mimetype = f"application/vnd.oasis.opendocument.{kind}"
    if content is None:
        content = (f'<?xml version="1.0" encoding="UTF-8"?>\n<office:document-content {DECLARED} office:version="1.3">'
                   f"{AUTOMATIC}<office:body><office:{kind}>{body}</office:{kind}></office:body>"
                   "</office:document-content>").encode()
    styles = (f'<?xml version="1.0" encoding="UTF-8"?>\n<office:document-styles {DECLARED} office:version="1.3">'
              '<office:styles><style:style style:name="Standard" style:family="paragraph"/></office:styles>'
              f"<office:master-styles>{master}</office:master-styles></office:document-styles>").encode()
    meta = (f'<?xml version="1.0" encoding="UTF-8"?>\n<office:document-meta {DECLARED} office:version="1.3">'
            "<office:meta><dc:title>A dog in the park</dc:title><meta:generator>tests</meta:generator></office:meta>"
            "</office:document-meta>").encode()
    manifest = (f'<?xml version="1.0" encoding="UTF-8"?>\n<manifest:manifest xmlns:manifest="{NS["manifest"]}" '
                f'manifest:version="1.3"><manifest:file-entry manifest:full-path="/" manifest:media-type="{mimetype}"/>'
                '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml"/>'
                "</manifest:manifest>").encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(zipfile.ZipInfo("mimetype"), mimetype, compress_type=zipfile.ZIP_STORED)
        parts = {"content.xml": content, "styles.xml": styles, "meta.xml": meta, "META-INF/manifest.xml": manifest,
                 **(extra or {})}
        for entry, data in parts.items():
            zf.writestr(entry, data)
    return out.getvalue()


def entries(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {info.filename: zf.read(info) for info in zf.infolist()}


def tree(data: bytes, part: str = "content.xml") -> etree._Element:
    return etree.fromstring(entries(data)[part])


def count(root: etree._Element, path: str) -> int:
    return len(root.xpath(path, namespaces=NS))


def text_of(element: etree._Element) -> str:
    return "".join(element.itertext())


# ------------------------------------------------------------------ a translator with true alignments

WORDS = {"a": "ein", "man": "Mann", "in": "in", "red": "rot", "shirt": "Hemd", "is": "ist", "riding": "fährt",
         "bike": "Fahrrad", "dog": "Hund", "big": "groß", "runs": "läuft", "on": "auf", "the": "dem", "green": "grün",
         "grass": "Gras", "today": "heute", "two": "zwei", "women": "Frauen", "are": "sind", "sitting": "sitzen",
         "bench": "Bank", "small": "klein", "sleeping": "schläft", "girl": "Mädchen", "running": "rennt",
         "boy": "Junge", "jumping": "springt", "park": "Park", "page": "Seite"}
ADJECTIVES = {"red", "big", "green", "small"}


def toy(sentences: list[str]) -> list[tuple[str, list[tuple[int, int]]]]:
    """Word by word through WORDS (an unknown word upper-cased, a capital kept), an adjective moved after the noun
    it precedes, punctuation kept where it was; each target word aligned to its source word."""
    out = []
    for sentence in sentences:
        words = [re.fullmatch(r"(.*?)([.,!?;:]*)", w).groups() for w in sentence.split()]
        order = list(range(len(words)))
        k = 0
        while k + 1 < len(words):
            if words[k][0].lower() in ADJECTIVES and words[k + 1][0].lower() not in ADJECTIVES:
                order[k], order[k + 1] = order[k + 1], order[k]
                k += 1
            k += 1
        target = []
        for j, i in enumerate(order):
            core = words[i][0]
            word = WORDS.get(core.lower(), core.upper())
            target.append((word[:1].upper() + word[1:] if core[:1].isupper() else word) + words[j][1])
        out.append((" ".join(target), [(i, j) for j, i in enumerate(order)]))
    return out


def structure(data: bytes) -> dict[str, object]:
    content, styles = tree(data), tree(data, "styles.xml")
    paths = ["//text:p", "//text:h", "//table:table-cell", "//text:note", "//text:list-item", "//draw:page",
             "//draw:frame", "//presentation:notes", "//text:a", "//text:s", "//text:tab",
             "//text:bookmark", "//office:automatic-styles//*"]
    found = {path: count(content, path) for path in paths}
    found["span styles"] = sorted(set(content.xpath("//text:span/@text:style-name", namespaces=NS)))
    found.update({"styles " + path: count(styles, path) for path in ("//text:p", "//text:page-number", "//style:*")})
    return found


# ------------------------------------------------------------------ the identity: the same document back


@pytest.mark.parametrize("kind,fmt,body,master", [("text", "odt", TEXT_BODY, TEXT_MASTER),
                                                  ("presentation", "odp", SLIDES, SLIDE_MASTER)])
def test_identity_gives_the_same_parts(kind, fmt, body, master):
    source = odf(kind, body, master)
    texts = Texts(identity)
    out = translate_bytes(source, fmt, texts, f"a.{fmt}", Limits())
    assert entries(out) == entries(source)  # every part byte for byte
    assert texts.done > 0


def test_identity_on_a_document_odfpy_wrote(tmp_path):
    pytest.importorskip("odf", reason="odfpy (another writer of ODF) is not installed")
    from odf.opendocument import OpenDocumentText
    from odf.style import Style, TextProperties
    from odf.text import A, H, P, Span

    doc = OpenDocumentText()
    bold = Style(name="Bold", family="text")
    bold.addElement(TextProperties(fontweight="bold"))
    doc.automaticstyles.addElement(bold)
    doc.text.addElement(H(outlinelevel=1, text="A dog in the park"))
    p = P(text="A man in a ")
    p.addElement(Span(stylename=bold, text="red"))
    p.addText(" shirt is riding a ")
    p.addElement(A(href="https://example.org/", text="bike"))
    p.addText(".")
    doc.text.addElement(p)
    doc.save(str(tmp_path / "a.odt"))
    source = (tmp_path / "a.odt").read_bytes()
    assert entries(translate_bytes(source, "odt", Texts(identity), "a.odt")) == entries(source)
    out = translate_bytes(source, "odt", Texts(toy), "a.odt")
    assert [text_of(e) for e in tree(out).iterfind(".//text:p", NS)] == ["Ein Mann in ein Hemd rot ist fährt ein "
                                                                        "Fahrrad."]


# ------------------------------------------------------------------ a translation: text and formatting


def test_text_document_translated_with_its_structure():
    source = odf()
    out = translate_bytes(source, "odt", Texts(toy), "a.odt")
    assert list(entries(out)) == list(entries(source))
    assert structure(out) == structure(source)
    content = tree(out)
    paragraphs = content.findall(".//office:text/text:p", NS)
    assert text_of(content.find(".//text:h", NS)) == "Ein Hund in dem Park"
    assert content.find(".//text:h", NS).attrib == tree(source).find(".//text:h", NS).attrib

    # the bold span follows "red" behind its noun, without the article before it
    red = paragraphs[0]
    assert red.text == "Ein Mann in ein Hemd " and [text_of(s) for s in red] == ["rot"]
    assert red[0].get(f"{{{NS['text']}}}style-name") == "T1" and red[0].tail == " ist fährt ein Fahrrad."
    assert red.get(f"{{{NS['text']}}}style-name") == "Standard"

    # the italic span and the hyperlink (its address kept) around their words, the words beside them outside
    big = paragraphs[1]
    assert big.text == "Ein Hund " and text_of(big[0]) == "groß" and big[0].tail == " läuft auf dem "
    link = big.find("text:a", NS)
    assert text_of(link) == "Gras grün" and link.tail == " heute."
    assert link.get(f"{{{NS['xlink']}}}href") == "https://example.org/grass?a=1&b=2"

    # spaces, the tab and the footnote carried to their places; the footnote's own paragraph translated
    women = paragraphs[2]
    assert [etree.QName(e).localname for e in women] == ["s", "tab", "note"]
    assert women.text == "Zwei Frauen" and women[0].tail == "sind sitzen" and women[1].tail == "auf ein Bank."
    assert women[0].get(f"{{{NS['text']}}}c") == "2"
    assert text_of(women.find(".//text:note-body", NS)) == "Ein Hund klein ist schläft."
    assert women.find(".//text:note-citation", NS).text == "1"

    # nested spans come back nested; the bookmark in its place
    nested = paragraphs[3]
    bold = nested.findall("text:span[@text:style-name='T1']", NS)
    assert " ".join(text_of(s) for s in bold) == "Ein Hund groß" and text_of(nested) == "Ein Hund groß ist rennt."
    assert [text_of(s) for s in nested.findall("text:span/text:span[@text:style-name='T2']", NS)] == ["groß"]
    assert bold[-1].tail == " ist " and nested.find("text:bookmark", NS).tail == "rennt."

    # the table, the list, the empty paragraph
    assert [text_of(c) for c in content.iterfind(".//table:table-cell", NS)] == ["Ein Mann", "ein Hund"]
    assert [text_of(i) for i in content.iterfind(".//text:list-item", NS)] == ["Ein Mädchen ist rennt.",
                                                                               "Ein Junge ist springt."]
    assert paragraphs[-1].text is None and len(paragraphs[-1]) == 0

    # the header and footers (the page number kept), the title; the styles themselves untouched
    styles = tree(out, "styles.xml")
    assert [text_of(p) for p in styles.iterfind(".//text:p", NS)] == ["Ein Hund in dem Park", "Seite 1", "Ein Mann"]
    assert styles.find(".//text:page-number", NS).get(f"{{{NS['text']}}}select-page") == "current"
    assert etree.tostring(styles.find("office:styles", NS)) == etree.tostring(
        tree(source, "styles.xml").find("office:styles", NS))
    assert etree.tostring(content.find("office:automatic-styles", NS)) == etree.tostring(
        tree(source).find("office:automatic-styles", NS))
    assert tree(out, "meta.xml").find(".//dc:title", NS).text == "Ein Hund in dem Park"

    # another reader (odfpy, where installed) reads it, the spaces and the tab where they were
    if importlib.util.find_spec("odf") is None:
        return
    from odf import teletype
    from odf.opendocument import load
    from odf.text import P

    read = [teletype.extractText(p) for p in load(io.BytesIO(out)).getElementsByType(P)]
    assert read[2].startswith("Zwei Frauen  sind sitzen\tauf ein Bank.")


def test_presentation_translated_with_its_slides_and_notes():
    source = odf("presentation", SLIDES, SLIDE_MASTER)
    out = translate_bytes(source, "odp", Texts(toy), "a.odp")
    assert structure(out) == structure(source)
    content = tree(out)
    pages = content.findall(".//draw:page", NS)
    assert [p.get(f"{{{NS['draw']}}}name") for p in pages] == ["page1", "page2"]
    titles = [text_of(p.find("draw:frame[@presentation:class='title']", NS)) for p in pages]
    assert titles == ["Ein Hund in dem Park", "Zwei Frauen"]
    outline = pages[0].find(".//text:list-item/text:p", NS)
    assert outline.text == "Ein Mann in ein Hemd " and text_of(outline.find("text:span", NS)) == "rot"
    notes = [text_of(p.find("presentation:notes", NS)) for p in pages]
    assert notes == ["Ein Mädchen ist rennt.", "Ein Hund klein ist schläft."]
    shape = pages[1].find("draw:custom-shape", NS)
    assert text_of(shape.find("text:p", NS)) == "Ein Junge ist springt."
    assert shape.find("svg:title", NS).text == "ein Hund groß"
    assert shape.find("draw:enhanced-geometry", NS) is not None


def test_the_mimetype_stays_first_and_stored_and_untouched_parts_keep_their_bytes():
    extra = {"Pictures/a.png": b"\x89PNG not really", "settings.xml": b'<?xml version="1.0"?><x/>'}
    source = odf(extra=extra)
    out = translate_bytes(source, "odt", Texts(toy), "a.odt")
    with zipfile.ZipFile(io.BytesIO(out)) as zf:
        first = zf.infolist()[0]
        assert first.filename == "mimetype" and first.compress_type == zipfile.ZIP_STORED
        assert zf.read(first) == b"application/vnd.oasis.opendocument.text"
        assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in zf.infolist()[1:])
    before, after = entries(source), entries(out)
    assert list(after) == list(before)
    assert [e for e in before if before[e] != after[e]] == ["content.xml", "styles.xml", "meta.xml"]
    assert after["content.xml"].startswith(b'<?xml version="1.0" encoding="UTF-8"?>\n<office:document-content ')


def test_a_part_without_translatable_text_is_left_alone_and_fragments_are_batched():
    calls: list[int] = []

    def counted(sentences):
        calls.append(len(sentences))
        return toy(sentences)

    body = "".join(f"<text:p>A dog {i}</text:p>" for i in range(700))
    source = odf(body=body, master="<style:master-page style:name='Standard'/>")
    texts = Texts(counted)
    out = translate_bytes(source, "odt", texts, "a.odt")
    assert calls == [300, 300, 100, 1]  # content.xml in three batches, then the title; styles.xml had nothing
    assert entries(out)["styles.xml"] == entries(source)["styles.xml"]
    assert text_of(tree(out).findall(".//text:p", NS)[699]) == "Ein Hund 699"


ODD = """<text:p text:style-name="P1"><text:span text:style-name="T1">A red dog &amp; a <text:span
 text:style-name="T2">big</text:span> man &lt;3</text:span></text:p>
 <text:p>A man<text:line-break/>in a red shirt<text:soft-page-break/> is riding.</text:p>
 <text:p><text:span text:style-name="T1">A dog</text:span><text:tab/></text:p>"""


def test_a_paragraph_in_one_span_escapes_breaks_and_atoms_glued_to_a_word():
    source = odf(body=ODD)
    assert entries(translate_bytes(source, "odt", Texts(identity), "a.odt")) == entries(source)
    one, breaks, tab = tree(translate_bytes(source, "odt", Texts(toy), "a.odt")).iterfind(".//office:text/text:p", NS)
    outer = one.find("text:span", NS)
    assert one.text is None and outer.tail is None and len(one) == 1  # the span around it all, as it was
    assert text_of(outer) == "Ein Hund rot & ein Mann groß <3" and text_of(outer.find("text:span", NS)) == "groß"
    assert breaks.text == "Ein Mann" and breaks[0].tail == "in ein Hemd rot" and breaks[1].tail == " ist fährt."
    assert text_of(tab) == "Ein Hund" and etree.QName(tab[-1]).localname == "tab" and tab[-1].tail is None


def test_without_alignments_the_text_between_tags_is_translated():
    source = odf(body=ODD)
    assert entries(translate_bytes(source, "odt", Texts(identity, aligned=False), "a.odt")) == entries(source)
    out = translate_bytes(source, "odt", Texts(toy, aligned=False), "a.odt")
    assert structure(out) == structure(source)
    one = tree(out).find(".//office:text/text:p", NS)
    assert text_of(one) == "Ein Hund rot & ein groß Mann <3"
    assert text_of(one.find(".//text:span/text:span", NS)) == "groß"


# ------------------------------------------------------------------ what is not an ODF document: one line


def test_a_truncated_archive_is_one_error_naming_the_file():
    source = odf()
    with pytest.raises(MtkitError, match=r"^report\.odt: "):
        translate_bytes(source[: len(source) // 2], "odt", Texts(identity), "report.odt")


@pytest.mark.parametrize("content", [
    b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">]>'
    b"<office:document-content xmlns:office='urn:oasis:names:tc:opendocument:xmlns:office:1.0'>&lol2;"
    b"</office:document-content>",
    b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>'
    b"<office:document-content xmlns:office='urn:oasis:names:tc:opendocument:xmlns:office:1.0'>&xxe;"
    b"</office:document-content>",
    b"<office:document-content><unclosed></office:document-content>",
])
def test_a_dtd_an_entity_or_broken_xml_is_one_error_naming_the_part(content):
    with pytest.raises(MtkitError, match=r"^report\.odt: content\.xml: (refused XML|not well-formed)") as e:
        translate_bytes(odf(content=content), "odt", Texts(identity), "report.odt")
    assert "\n" not in str(e.value)


def test_an_entry_leaving_the_folder_is_one_error_naming_the_file():
    with pytest.raises(MtkitError, match=r"^report\.odt: archive entry '\.\./evil' leaves the archive's folder"):
        translate_bytes(odf(extra={"../evil": b"x"}), "odt", Texts(identity), "report.odt")


def test_a_document_of_another_kind_or_no_odf_is_one_error():
    with pytest.raises(MtkitError, match=r"^a\.odt: an OpenDocument presentation document, not text \(\.odt\)"):
        translate_bytes(odf("presentation", SLIDES, SLIDE_MASTER), "odt", Texts(identity), "a.odt")
    docx_like = io.BytesIO()
    with zipfile.ZipFile(docx_like, "w") as zf:
        zf.writestr("word/document.xml", "<w/>")
    with pytest.raises(MtkitError, match=r"^a\.odt: not an OpenDocument file \(no content\.xml"):
        translate_bytes(docx_like.getvalue(), "odt", Texts(identity), "a.odt")
    with pytest.raises(MtkitError, match=r"^a\.odt: content\.xml is not an OpenDocument document's content"):
        translate_bytes(odf(content=b"<html/>"), "odt", Texts(identity), "a.odt")
    encrypted = odf(extra={"META-INF/manifest.xml": b"<m><manifest:encryption-data/></m>"})
    with pytest.raises(MtkitError, match=r"^a\.odt: the document is encrypted"):
        translate_bytes(encrypted, "odt", Texts(identity), "a.odt")


def test_deeply_nested_spans_cost_no_recursion():
    depth = 200  # lxml's parser refuses deeper XML (libxml2's limit without huge_tree), defusedxml none
    body = "<text:p>" + '<text:span text:style-name="T1">' * depth + "A red dog" + "</text:span>" * depth + "</text:p>"
    out = translate_bytes(odf(body=body), "odt", Texts(toy), "a.odt")
    paragraph = tree(out).find(".//office:text/text:p", NS)
    assert text_of(paragraph) == "Ein Hund rot" and count(paragraph, ".//text:span") == depth


# ------------------------------------------------------------------ the real model


@pytest.fixture(scope="module")
def model():
    if not (MODEL / "checkpoints").exists():
        pytest.skip(f"the Multi30k model is not at {MODEL}")
    import mtkit

    return mtkit.load(MODEL, device="cpu")


@pytest.mark.slow
def test_the_real_model_translates_a_text_document(model):
    body = """<text:p text:style-name="Standard">A man in a <text:span text:style-name="T1">red</text:span> shirt is
     riding a bike.</text:p>
     <table:table table:name="T"><table:table-row><table:table-cell><text:p>A dog is running in the grass.</text:p>
     </table:table-cell><table:table-cell><text:p>Two women are sitting on a bench.</text:p></table:table-cell>
     </table:table-row></table:table>"""
    master = ("<style:master-page style:name='Standard'><style:header><text:p>A girl is jumping into the water."
              "</text:p></style:header></style:master-page>")
    source = odf(body=body, master=master)
    out = model.translate_document(source, "odt", name="a.odt")
    assert structure(out) == structure(source)
    content, styles = tree(out), tree(out, "styles.xml")
    paragraph = content.find(".//office:text/text:p", NS)
    german = text_of(paragraph)
    assert "Mann" in german and "shirt" not in german
    span = paragraph.find("text:span", NS)
    assert span.get(f"{{{NS['text']}}}style-name") == "T1" and "rot" in text_of(span).lower()
    cells = [text_of(c) for c in content.iterfind(".//table:table-cell", NS)]
    assert "Hund" in cells[0] and "Frauen" in cells[1], cells
    header = text_of(styles.find(".//style:header", NS))
    assert "Mädchen" in header and "girl" not in header, header
    assert etree.tostring(styles.find("office:styles", NS)) == etree.tostring(
        tree(source, "styles.xml").find("office:styles", NS))

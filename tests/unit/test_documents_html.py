"""HTML pages and EPUB books (mtkit.documents.html, mtkit.documents.epub): a whole document translated, its markup,
what it marks not to translate, its attributes and every other part kept; a stranger's file costs bounded work or
one error line."""

from __future__ import annotations

import io
import re
import time
import unicodedata
import zipfile

import pytest
from conftest import MODELS

from mtkit.documents import Limits, Texts, identity, translate_bytes
from mtkit.errors import MtkitError

MODEL = MODELS / "multi30k-en-de"

# a dictionary "translation" that reorders: an adjective goes after its noun ("a red car" -> "ein Auto rot")
WORDS = {"a": "ein", "the": "der", "red": "rot", "big": "groß", "car": "Auto", "dog": "Hund", "runs": "rennt",
         "is": "ist", "and": "und", "more": "mehr", "read": "lies", "this": "dies", "page": "Seite", "hello": "hallo",
         "world": "Welt", "run": "starte", "now": "jetzt", "see": "siehe", "link": "Verweis", "title": "Titel",
         "book": "Buch", "chapter": "Kapitel", "one": "eins", "two": "zwei", "first": "erste", "second": "zweite",
         "with": "mit", "long": "lang", "text": "Text", "here": "hier", "code": "Kode", "contents": "Inhalt"}
ADJECTIVES = {"red", "big", "long", "first", "second"}


def _core(word: str) -> tuple[str, str, str]:
    """(leading punctuation, the word, trailing punctuation)."""
    begin, end = 0, len(word)
    while begin < end and unicodedata.category(word[begin]).startswith("P"):
        begin += 1
    while end > begin and unicodedata.category(word[end - 1]).startswith("P"):
        end -= 1
    return word[:begin], word[begin:end], word[end:]


def dictionary(sentences: list[str]) -> list[tuple[str, list[tuple[int, int]]]]:
    """Each word through :data:`WORDS` (unknown ones upper-cased), its punctuation kept beside it, an adjective
    moved after the noun that follows it; the true alignment of that reordering."""
    out = []
    for sentence in sentences:
        words = sentence.split()
        order = list(range(len(words)))
        k = 0
        while k + 1 < len(words):
            if _core(words[k])[1].lower() in ADJECTIVES and not _core(words[k])[2]:
                order[k], order[k + 1] = order[k + 1], order[k]
                k += 2
            else:
                k += 1
        target = []
        for source in order:
            lead, core, tail = _core(words[source])
            found = WORDS.get(core.lower(), core.upper())
            target.append(lead + (found.capitalize() if core[:1].isupper() else found) + tail)
        # the sentence's closing punctuation stays at its end whatever moved
        if order and order[-1] != len(words) - 1:
            *_, tail = _core(words[-1])
            where = order.index(len(words) - 1)
            if tail:
                target[where] = target[where][: len(target[where]) - len(tail)]
                target[-1] += tail
        out.append((" ".join(target), [(source, t) for t, source in enumerate(order)]))
    return out


PAGE = """<!DOCTYPE html>
<!-- a comment: <b>not</b> text -->
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>The page</title>
  <style>p { color: red; } /* <b>style</b> */</style>
  <script>if (a < b) { document.write("<b>a red car</b>"); }</script>
</head>
<body>
  <h1 class="top">Hello <b>world</b>!</h1>
  <p>A <b>red</b> car runs
  and a <a href="/dog?a=1&amp;b=2" title="a dog">big dog</a> runs.</p>
  <p>Read <b>more</b>.<br>
  Run <code>ls -l</code> now.</p>
  <p>See <span class="x notranslate">the red car</span> and <kbd>Ctrl</kbd> here.
  <img src="car.png" alt="a red car"> <var>n</var>
  <ul><li>one<li>two</ul>
  <pre>a red car
     runs</pre>
  <div translate="no">the <b>red</b> car</div>
  <p>caf&eacute; &amp; more&nbsp;text</p>
</body>
</html>
"""


def translate_page(page: str | bytes, translator=dictionary, name: str = "page.html") -> str:
    data = page.encode("utf-8") if isinstance(page, str) else page
    return translate_bytes(data, "html", Texts(translator), name).decode("utf-8")


# ------------------------------------------------------------------ html


@pytest.mark.parametrize("variant", ["as is", "crlf", "bom", "latin-1"])
def test_an_identity_round_trip_gives_the_page_back_byte_for_byte(variant):
    page = PAGE.encode("utf-8")
    if variant == "crlf":
        page = PAGE.replace("\n", "\r\n").encode("utf-8")
    elif variant == "bom":
        page = b"\xef\xbb\xbf" + page
    elif variant == "latin-1":
        page = PAGE.replace('charset="utf-8"', 'charset="iso-8859-1"').replace("&eacute;", "é").encode("latin-1")
    assert translate_bytes(page, "html", Texts(identity), "page.html") == page


def test_a_multi_line_page_is_one_document_translated_with_its_structure_kept():
    out = translate_page(PAGE)
    lines = out.splitlines()
    # the doctype, the comment, the head's markup, script and style come back as written; the title is translated
    assert lines[:6] == PAGE.splitlines()[:5] + ["  <title>Der Seite</title>"]
    assert '<style>p { color: red; } /* <b>style</b> */</style>' in out
    assert '<script>if (a < b) { document.write("<b>a red car</b>"); }</script>' in out
    assert out.endswith("</body>\n</html>\n")
    # the text is translated and the tags follow their words: the adjective moved after its noun, <b> with it
    assert '<h1 class="top">Hallo <b>Welt</b>!</h1>' in out
    assert "<p>Ein Auto <b>rot</b> rennt und ein " in out
    assert '<a href="/dog?a=1&amp;b=2" title="a dog">Hund groß</a> rennt.</p>' in out
    # a tag around a word without its full stop leaves the full stop outside
    assert "<p>Lies <b>mehr</b>.<br>" in out
    assert re.findall(r"<[^<>]*>", out) == re.findall(r"<[^<>]*>", PAGE)  # the same tags in the same order


def test_what_the_page_marks_not_to_translate_is_kept_as_written():
    out = translate_page(PAGE)
    assert "Starte <code>ls -l</code> jetzt.</p>" in out  # inline: carried whole beside its words
    assert 'Siehe <span class="x notranslate">the red car</span> und <kbd>Ctrl</kbd> hier.' in out
    assert "<pre>a red car\n     runs</pre>" in out
    assert '<div translate="no">the <b>red</b> car</div>' in out
    assert "<var>n</var>" in out


def test_attributes_are_kept_and_entities_read_as_text():
    out = translate_page(PAGE)
    assert '<img src="car.png" alt="a red car">' in out
    assert '<html lang="en">' in out
    assert "<p>CAFÉ &amp; mehr Text</p>" in out  # decoded for translation, written back escaped


def test_a_page_that_is_not_html_of_a_known_encoding_is_one_error_line():
    with pytest.raises(MtkitError, match=r"^bad\.html: line 2: not valid utf-8"):
        translate_page(b"<p>fine</p>\n<p>\xff</p>", name="bad.html")
    with pytest.raises(MtkitError, match=r"^bad\.html: declares the encoding 'x-klingon'"):
        translate_page(b'<meta charset="x-klingon"><p>a</p>', name="bad.html")
    with pytest.raises(MtkitError, match=r"^bad\.html: <code> is never closed"):
        translate_page(b"<p>Run <code>ls now.</p>", name="bad.html")


def test_a_page_read_as_a_browser_reads_it_not_as_a_fragment():
    # unclosed <p> and <li>, an inline tag never closed and one closing nothing: kept in place, the text translated
    page = "<p>a red car\n<p>a <font>dog</b> runs\n<li>one"
    assert translate_page(page) == "<p>ein Auto rot\n<p>ein <font>Hund</b> rennt\n<li>eins"
    assert translate_bytes(page.encode(), "html", Texts(identity), "p.html") == page.encode()


def nested_seconds(tag: str, depth: int) -> float:
    page = f"<p>{f'<{tag}>' * depth}a red car{f'</{tag}>' * depth}</p>"
    started = time.monotonic()
    out = translate_page(page)
    assert out == page.replace("a red car", "ein Auto rot")
    return time.monotonic() - started


@pytest.mark.parametrize("tag", ["span", "div"])
def test_nested_tags_cost_linear_time_and_no_recursion(tag):
    small, large = nested_seconds(tag, 1_000), nested_seconds(tag, 10_000)
    assert large < 40 * small + 1, (small, large)  # ten times the tags: about ten times the work


@pytest.mark.slow  # seconds each
@pytest.mark.parametrize("tag", ["span", "div"])
def test_100000_nested_tags_are_translated_in_seconds_without_recursion(tag):
    assert nested_seconds(tag, 100_000) < 60  # quadratic work would take hours; recursion would overflow


# ------------------------------------------------------------------ epub

CONTAINER = """<?xml version="1.0" encoding="UTF-8"?>
<container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">
  <rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/></rootfiles>
</container>
"""
OPF = """<?xml version="1.0" encoding="UTF-8"?>
<package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="id">
  <metadata xmlns:dc="http://purl.org/dc/elements/1.1/">
    <dc:identifier id="id">urn:uuid:1</dc:identifier>
    <dc:title>The red book</dc:title>
    <dc:language>en</dc:language>
  </metadata>
  <manifest>
    <item id="nav" href="nav.xhtml" media-type="application/xhtml+xml" properties="nav"/>
    <item id="ncx" href="toc.ncx" media-type="application/x-dtbncx+xml"/>
    <item id="c1" href="text/chapter%20one.xhtml" media-type="application/xhtml+xml"/>
    <item id="css" href="style.css" media-type="text/css"/>
    <item id="img" href="car.png" media-type="image/png"/>
  </manifest>
  <spine toc="ncx"><itemref idref="c1"/></spine>
</package>
"""
NAV = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE html>
<html xmlns="http://www.w3.org/1999/xhtml" xmlns:epub="http://www.idpf.org/2007/ops">
<head><title>Contents</title></head>
<body><nav epub:type="toc"><ol><li><a href="text/chapter%20one.xhtml">First chapter</a></li></ol></nav></body>
</html>
"""
NCX = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE ncx PUBLIC "-//NISO//DTD ncx 2005-1//EN" "http://www.daisy.org/z3986/2005/ncx-2005-1.dtd">
<ncx xmlns="http://www.daisy.org/z3986/2005/ncx/" version="2005-1">
  <docTitle><text>The red book</text></docTitle>
  <navMap><navPoint id="p1" playOrder="1"><navLabel><text>First chapter</text></navLabel>
    <content src="text/chapter%20one.xhtml"/></navPoint></navMap>
</ncx>
"""
CHAPTER = """<?xml version="1.0" encoding="utf-8"?>
<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.1//EN" "http://www.w3.org/TR/xhtml11/DTD/xhtml11.dtd">
<html xmlns="http://www.w3.org/1999/xhtml">
<head><title>First chapter</title><link rel="stylesheet" href="../style.css"/></head>
<body>
  <h1>First chapter</h1>
  <p>A <b>red</b> car runs<br/>and a <i>big</i> dog runs.</p>
  <p>Run <code>ls -l</code> now. <img src="../car.png" alt="a red car"/></p>
  <p>A&nbsp;dog &amp; a&#160;car.</p>
  <pre>a red car</pre>
</body>
</html>
"""
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


def book(**replace: bytes | str | None) -> bytes:
    """A small EPUB 3 book (with an EPUB 2 NCX), written as a book's zip is: mimetype first and stored."""
    entries: dict[str, bytes | str | None] = {
        "mimetype": "application/epub+zip", "META-INF/container.xml": CONTAINER, "OEBPS/content.opf": OPF,
        "OEBPS/nav.xhtml": NAV, "OEBPS/toc.ncx": NCX, "OEBPS/text/chapter one.xhtml": CHAPTER,
        "OEBPS/style.css": "p { margin: 0 }\n", "OEBPS/car.png": PNG}
    entries.update(replace)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in entries.items():
            if data is not None:
                stored = name == "mimetype"
                zf.writestr(name, data, compress_type=zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED)
    return out.getvalue()


def entries(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {info.filename: zf.read(info) for info in zf.infolist()}


def test_an_identity_round_trip_gives_the_book_back_entry_for_entry():
    source = book()
    out = translate_bytes(source, "epub", Texts(identity), "book.epub")
    assert entries(out) == entries(source)  # the same entries, in order, with the same bytes


def test_a_book_is_translated_in_its_xhtml_and_labels_every_other_entry_the_same():
    source = book()
    out = translate_bytes(source, "epub", Texts(dictionary), "book.epub")
    got, before = entries(out), entries(source)
    assert list(got) == list(before)
    with zipfile.ZipFile(io.BytesIO(out)) as zf:
        first = zf.infolist()[0]
        assert first.filename == "mimetype" and first.compress_type == zipfile.ZIP_STORED
    for name in ("mimetype", "META-INF/container.xml", "OEBPS/style.css", "OEBPS/car.png"):
        assert got[name] == before[name], name
    chapter = got["OEBPS/text/chapter one.xhtml"].decode()
    assert chapter.startswith(CHAPTER[:CHAPTER.index("<head>")])  # declaration and doctype as written
    assert "<p>Ein Auto <b>rot</b> rennt<br/>und ein Hund <i>groß</i> rennt.</p>" in chapter
    assert '<p>Starte <code>ls -l</code> jetzt. <img src="../car.png" alt="a red car"/></p>' in chapter
    assert "<pre>a red car</pre>" in chapter and "<h1>Erste Kapitel</h1>" not in chapter
    assert "<h1>Kapitel Erste</h1>" in chapter  # the dictionary's adjective after its noun
    assert "<p>Ein Hund &amp; ein Auto.</p>" in chapter  # the XHTML DTD's &nbsp; read as a space
    assert '<a href="text/chapter%20one.xhtml">Kapitel Erste</a>' in got["OEBPS/nav.xhtml"].decode()
    ncx = got["OEBPS/toc.ncx"].decode()
    assert "<navLabel><text>Kapitel Erste</text></navLabel>" in ncx and "<docTitle><text>Der Buch rot</text>" in ncx
    assert ncx.startswith(NCX[:NCX.index("<ncx ")])
    assert "<dc:title>Der Buch rot</dc:title>" in got["OEBPS/content.opf"].decode()
    import xml.etree.ElementTree as ET

    for name in ("OEBPS/text/chapter one.xhtml", "OEBPS/nav.xhtml", "OEBPS/content.opf"):
        ET.fromstring(got[name])  # well-formed XML still


LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE html [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">
<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">]>
<html xmlns="http://www.w3.org/1999/xhtml"><body><p>&d;&d;&d;&d;</p></body></html>
"""


def zip_with(names: dict[str, str]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in names.items():
            zf.writestr(zipfile.ZipInfo(name), data)
    return out.getvalue()


@pytest.mark.parametrize("case, data, message", [
    ("truncated", book()[: len(book()) // 2], "not a readable zip archive"),
    ("billion laughs", book(**{"OEBPS/text/chapter one.xhtml": LAUGHS}), "refused XML"),
    ("an entry ../x", zip_with({"mimetype": "application/epub+zip", "../x": "x"}), "leaves the archive's folder"),
    ("a manifest item ../x", book(**{"OEBPS/content.opf": OPF.replace("nav.xhtml", "../../x.xhtml")}),
     "leaves the book"),
    ("no container", zip_with({"mimetype": "application/epub+zip"}), "not an EPUB book"),
    ("not well-formed", book(**{"OEBPS/nav.xhtml": NAV.replace("</ol>", "")}), "not well-formed XML"),
    ("a missing part", book(**{"OEBPS/toc.ncx": None}), "which is not in the book"),
])
def test_a_book_that_is_not_a_sound_epub_is_one_error_line(case, data, message):
    with pytest.raises(MtkitError) as e:
        translate_bytes(data, "epub", Texts(identity), "book.epub", Limits())
    assert str(e.value).startswith("book.epub: ") and message in str(e.value), (case, str(e.value))
    assert "\n" not in str(e.value)


def test_a_book_written_by_ebooklib_comes_back_the_same_and_translated():
    epub = pytest.importorskip("ebooklib.epub", reason="ebooklib writes the book (a real producer's output)")
    made = epub.EpubBook()
    made.set_identifier("id1")
    made.set_title("The red book")
    made.set_language("en")
    chapter = epub.EpubHtml(title="First chapter", file_name="chapter.xhtml", lang="en")
    chapter.content = "<h1>First chapter</h1><p>A <b>red</b> car runs.</p>"
    made.add_item(chapter)
    made.toc = [chapter]
    made.add_item(epub.EpubNcx())
    made.add_item(epub.EpubNav())
    made.spine = ["nav", chapter]
    path = io.BytesIO()
    epub.write_epub(path, made)
    source = path.getvalue()
    assert entries(translate_bytes(source, "epub", Texts(identity), "made.epub")) == entries(source)
    got = entries(translate_bytes(source, "epub", Texts(dictionary), "made.epub"))
    text = got["EPUB/chapter.xhtml"].decode()
    assert "<p>Ein Auto <b>rot</b> rennt.</p>" in text, text


# ------------------------------------------------------------------ the real model


@pytest.fixture(scope="module")
def model():
    if not MODEL.exists():
        pytest.skip(f"the trained model is not here ({MODEL})")
    import mtkit

    return mtkit.load(MODEL, device="cpu")


@pytest.mark.slow
def test_the_real_model_translates_a_page_and_a_book_with_bold_on_the_aligned_word(model):
    page = ("<!DOCTYPE html>\n<html>\n<head><title>A dog</title></head>\n<body>\n"
            "<p>A <b>dog</b> runs on the grass.</p>\n<p>Two men are playing <code>soccer</code> outside.</p>\n"
            "</body>\n</html>\n")
    out = model.translate_document(page.encode(), "html", name="page.html").decode()
    assert out.startswith("<!DOCTYPE html>\n<html>\n<head><title>") and out.endswith("</body>\n</html>\n")
    bold = re.search(r"<b>(.*?)</b>", out)
    assert bold is not None and "Hund" in bold.group(1), out
    assert "<code>soccer</code>" in out and "grass" not in out and "men" not in out, out
    source = book(**{"OEBPS/text/chapter one.xhtml": CHAPTER.replace(
        "<p>A <b>red</b> car runs<br/>and a <i>big</i> dog runs.</p>", "<p>A <b>dog</b> runs on the grass.</p>")})
    got = entries(model.translate_document(source, "epub", name="book.epub"))
    chapter = got["OEBPS/text/chapter one.xhtml"].decode()
    bold = re.search(r"<b>(.*?)</b>", chapter)
    assert bold is not None and "Hund" in bold.group(1), chapter
    assert "grass" not in chapter and got["OEBPS/car.png"] == PNG

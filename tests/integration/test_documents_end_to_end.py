"""Documents end to end on the Multi30k model: `mtkit translate FILE -o OUT` and `Model.translate_file` for the
formats whose own tests do not already run the real model (.vtt, .odp, .txt), and a .docx built by python-docx
through the command line, as a user would run it."""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile

import pytest
from conftest import MODELS, one_error

MODEL = MODELS / "multi30k-en-de"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model():
    if not (MODEL / "checkpoints").is_dir():
        pytest.skip(f"the Multi30k model is not at {MODEL} (set MTKIT_MODELS to the folder holding multi30k-en-de)")
    import mtkit

    return mtkit.load(MODEL, device="cpu")


VTT = """WEBVTT

NOTE made by hand

1
00:00:01.000 --> 00:00:03.000 align:start
A man in a <i>red</i> shirt
is riding a bike.

00:00:04.000 --> 00:00:05.500
<v Anna>Two dogs play in the snow.</v>
"""


def test_a_webvtt_file_keeps_its_timings_settings_and_line_counts(model, tmp_path):
    (tmp_path / "talk.vtt").write_text(VTT, encoding="utf-8")
    assert model.translate_file(tmp_path / "talk.vtt", tmp_path / "talk.de.vtt") == "vtt"
    out = (tmp_path / "talk.de.vtt").read_text(encoding="utf-8").split("\n")
    source = VTT.split("\n")
    assert len(out) == len(source)
    for line, before in zip(out, source, strict=True):
        if "-->" in before or before in ("WEBVTT", "NOTE made by hand", "1", ""):
            assert line == before
    assert "Mann" in out[6] + out[7] and "rot" in out[6] + out[7] and "<i>" in out[6] + out[7]
    italic = (out[6] + " " + out[7]).split("<i>")[1].split("</i>")[0]
    assert "rot" in italic and len(italic.split()) == 1, italic
    assert out[10].startswith("<v Anna>") and out[10].endswith("</v>") and "Hunde" in out[10]


def odp() -> bytes:
    """A two-slide presentation written by odfpy (the library), a title and a text box each, notes on one."""
    from odf.draw import Frame, Page, TextBox
    from odf.opendocument import OpenDocumentPresentation
    from odf.presentation import Notes
    from odf.style import MasterPage, PageLayout
    from odf.text import P

    doc = OpenDocumentPresentation()
    layout = PageLayout(name="L")
    doc.automaticstyles.addElement(layout)
    master = MasterPage(name="M", pagelayoutname=layout)
    doc.masterstyles.addElement(master)
    for title, body in (("A dog is running.", "Two women are sitting on a bench."),
                        ("A girl is jumping into the water.", "A man is riding a bike.")):
        page = Page(masterpagename=master)
        for text in (title, body):
            frame = Frame(width="20cm", height="3cm", x="1cm", y="1cm")
            box = TextBox()
            box.addElement(P(text=text))
            frame.addElement(box)
            page.addElement(frame)
        notes = Notes()
        frame = Frame(width="20cm", height="3cm", x="1cm", y="1cm")
        box = TextBox()
        box.addElement(P(text="A child is smiling."))
        frame.addElement(box)
        notes.addElement(frame)
        page.addElement(notes)
        doc.presentation.addElement(page)
    out = io.BytesIO()
    doc.save(out)
    return out.getvalue()


def test_an_odp_presentation_comes_back_german_slide_by_slide(model, tmp_path):
    pytest.importorskip("odf")
    from odf import teletype
    from odf.opendocument import load
    from odf.text import P

    (tmp_path / "deck.odp").write_bytes(odp())
    model.translate_file(tmp_path / "deck.odp", tmp_path / "deck.de.odp")
    before = [teletype.extractText(p) for p in load(str(tmp_path / "deck.odp")).getElementsByType(P)]
    after = [teletype.extractText(p) for p in load(str(tmp_path / "deck.de.odp")).getElementsByType(P)]
    assert len(after) == len(before) == 6
    assert "Hund" in after[0] and "Frauen" in after[1] and "Mädchen" in after[3] and "Kind" in after[2] + after[5]
    assert not any(word in " ".join(after) for word in ("dog", "women", "girl", "child"))
    names = [i.filename for i in zipfile.ZipFile(tmp_path / "deck.de.odp").infolist()]
    assert names[0] == "mimetype" and names == [i.filename for i in zipfile.ZipFile(tmp_path / "deck.odp").infolist()]


def test_a_docx_through_the_command_line(tmp_path):
    if not (MODEL / "checkpoints").is_dir():
        pytest.skip(f"the Multi30k model is not at {MODEL}")
    docx = pytest.importorskip("docx")
    doc = docx.Document()
    doc.add_heading("A dog in the park.", level=1)
    p = doc.add_paragraph("A man in a ")
    p.add_run("red").bold = True
    p.add_run(" shirt is riding a bike.")
    table = doc.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text = "Two women are sitting on a bench."
    table.rows[0].cells[1].text = "A girl is jumping into the water."
    doc.save(tmp_path / "report.docx")
    done = subprocess.run([sys.executable, "-m", "mtkit", "translate", "-m", str(MODEL), str(tmp_path / "report.docx"),
                           "-o", str(tmp_path / "report.de.docx")], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    out = docx.Document(tmp_path / "report.de.docx")
    assert [p.style.name for p in out.paragraphs] == [p.style.name for p in docx.Document(tmp_path / "report.docx")
                                                       .paragraphs]
    bold = "".join(r.text for r in out.paragraphs[1].runs if r.bold)
    assert "rot" in bold and len(bold.split()) == 1, [(r.text, r.bold) for r in out.paragraphs[1].runs]
    assert "Hemd" in out.paragraphs[1].text and "Frauen" in out.tables[0].rows[0].cells[0].text

    (tmp_path / "broken.docx").write_bytes((tmp_path / "report.docx").read_bytes()[:2000])
    broken = subprocess.run([sys.executable, "-m", "mtkit", "translate", "-m", str(MODEL),
                             str(tmp_path / "broken.docx"), "-o", str(tmp_path / "broken.de.docx")],
                            capture_output=True, text=True, timeout=300, check=False)
    assert f"{tmp_path / 'broken.docx'}: not a readable zip archive" in one_error(broken)
    assert not (tmp_path / "broken.de.docx").exists()


def test_plain_text_and_a_page_through_the_api(model, tmp_path):
    (tmp_path / "a.txt").write_text("A man is riding a bike. Two dogs play in the snow.\n\nA girl is smiling.\n")
    model.translate_file(tmp_path / "a.txt", tmp_path / "b.txt")
    lines = (tmp_path / "b.txt").read_text().split("\n")
    assert len(lines) == 4 and lines[1] == "" and "Hunde" in lines[0] and "Mädchen" in lines[2]
    page = ('<!DOCTYPE html>\n<html><head><title>A dog</title></head>\n<body>\n<p>A man in a <b>red</b> shirt is '
            'riding a bike.</p>\n<p translate="no">A dog is running.</p>\n<pre>two dogs</pre>\n</body></html>\n')
    out = model.translate_document(page.encode(), "html").decode()
    assert out.startswith("<!DOCTYPE html>\n<html><head><title>") and "Hund" in out.split("</title>")[0]
    assert '<p translate="no">A dog is running.</p>\n<pre>two dogs</pre>' in out
    assert "<b>roten</b>" in out or "<b>rot</b>" in out or "<b>rote</b>" in out, out

"""The documents core (mtkit.documents): formats by name, paragraphs of runs as inline markup and back, archives
and XML from strangers refused at a cost bounded by their size, plain text, and the CLI's document mode."""

from __future__ import annotations

import io
import re
import struct
import tracemalloc
import zipfile

import pytest
from conftest import write_tiny_checkpoint

from mtkit.cli import main
from mtkit.documents import Limits, Texts, format_of, identity, translate_bytes, translate_file
from mtkit.documents.archive import Archive, parse_xml, vet_xml
from mtkit.documents.runs import Piece, from_fragment, to_fragment
from mtkit.errors import MtkitError
from mtkit.text.markup import translate_markup


def reversed_words(sentences: list[str]) -> list[tuple[str, list[tuple[int, int]]]]:
    """Each sentence's words in reverse order, each aligned to where it came from: a translation that moves every
    word, so that whatever follows the alignment shows it."""
    out = []
    for s in sentences:
        words = s.split()
        out.append((" ".join(reversed(words)), [(i, len(words) - 1 - i) for i in range(len(words))]))
    return out


# ------------------------------------------------------------------ formats


def test_the_format_comes_from_the_extension_or_the_flag():
    assert format_of("talk.SRT") == "srt" and format_of("a/b.docx") == "docx" and format_of("x.htm") == "html"
    assert format_of("notes", "md") == "md"
    with pytest.raises(MtkitError, match="no document format for .xyz"):
        format_of("a.xyz")
    with pytest.raises(MtkitError, match="--format pdf: not a document format"):
        format_of("a.docx", "pdf")


# ------------------------------------------------------------------ runs


PARAGRAPH = [Piece("The ", "plain"), Piece("big", "bold"), Piece(" cat ", "plain"), Piece("", "plain", atom="TAB"),
             Piece("sat on", "plain", ("link",)), Piece(" the ", "italic", ("link",)), Piece("mat.", "plain")]


def test_runs_become_tags_but_the_commonest_formatting_and_come_back_as_they_were():
    frag = to_fragment(PARAGRAPH)
    assert frag.base == "plain"
    assert frag.markup == ('The <g id="0">big</g> cat <x id="0"/><g id="1">sat on<g id="2"> the </g></g>mat.')
    assert frag.text == "The big cat sat on the mat."
    back = from_fragment(frag, translate_markup([frag.markup], "xml", identity)[0])
    assert "".join(p.text for p in back) == "The big cat sat on the mat."
    assert [(p.text.strip(), p.run, p.wrappers, p.atom) for p in back if p.text.strip() or p.atom] == [
        ("The", "plain", (), None), ("big", "bold", (), None), ("cat", "plain", (), None), ("", "plain", (), "TAB"),
        ("sat on", "plain", ("link",), None), ("the", "italic", ("link",), None), ("mat.", "plain", (), None)]


def test_a_run_follows_its_words_where_the_translation_moves_them():
    frag = to_fragment([Piece("one two ", "plain"), Piece("three", "bold"), Piece(" four", "plain")])
    back = from_fragment(frag, translate_markup([frag.markup], "xml", reversed_words)[0])
    assert [(p.text.strip(), p.run) for p in back if p.text.strip()] == [("four", "plain"), ("three", "bold"),
                                                                          ("two one", "plain")]


def test_markup_characters_in_runs_are_text():
    frag = to_fragment([Piece("a < b & c ", "plain"), Piece("<d>", "bold")])
    assert frag.text == "a < b & c <d>"
    back = from_fragment(frag, translate_markup([frag.markup], "xml", identity)[0])
    assert [p.text for p in back] == ["a < b & c ", "<d>"]


# ------------------------------------------------------------------ archives


def zipped(entries: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", method) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return out.getvalue()


def bomb(megabytes: int) -> bytes:
    """A zip of one entry that inflates to ``megabytes`` MiB of zeros (about 1000 times its size), streamed."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf, zf.open("word/document.xml", "w") as f:
        chunk = bytes(1 << 20)
        for _ in range(megabytes):
            f.write(chunk)
    return out.getvalue()


def test_an_archive_keeps_its_entries_order_and_bytes():
    data = zipped({"mimetype": b"application/epub+zip", "a.xml": b"<a>x</a>", "b.bin": bytes(range(256))})
    archive = Archive(data, "book.epub", Limits())
    assert archive.names() == ["mimetype", "a.xml", "b.bin"]
    archive.replace("a.xml", b"<a>y</a>")
    again = zipfile.ZipFile(io.BytesIO(archive.write()))
    assert [i.filename for i in again.infolist()] == ["mimetype", "a.xml", "b.bin"]
    assert again.read("a.xml") == b"<a>y</a>" and again.read("b.bin") == bytes(range(256))


def test_a_zip_bomb_is_refused_before_it_is_inflated():
    data = bomb(64)
    tracemalloc.start()
    with pytest.raises(MtkitError, match=r"report.docx: archive entry 'word/document.xml' inflates [0-9,]+ times "
                                         r"\(a zip bomb\?\)"):
        Archive(data, "report.docx", Limits())
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 << 20  # nothing inflated


def test_an_entry_that_inflates_past_what_it_claims_stops_there():
    data = bytearray(bomb(8))
    # Claim 1,000 bytes in the local header and the central directory (offsets 22 and 24 of the fixed part).
    local = data.index(b"PK\x03\x04")
    central = data.index(b"PK\x01\x02")
    struct.pack_into("<I", data, local + 22, 1000)
    struct.pack_into("<I", data, central + 24, 1000)
    tracemalloc.start()
    # zipfile itself stops at the size claimed (then the CRC fails); the reader checks it again
    with pytest.raises(MtkitError, match="^report.docx: archive entry 'word/document.xml' (inflates past the 1,000 "
                                         "bytes it claims|cannot be read)"):
        Archive(bytes(data), "report.docx", Limits())
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 << 20


@pytest.mark.parametrize("name", ["../evil.xml", "/etc/passwd", "word/../../x", "C:evil", "a\\..\\b"])
def test_names_that_leave_the_folder_are_refused(name):
    with pytest.raises(MtkitError, match="leaves the archive's folder"):
        Archive(zipped({"ok.xml": b"<a/>", name: b"x"}), "deck.pptx", Limits())


def test_entry_count_total_size_truncation_and_garbage_are_one_line_each():
    with pytest.raises(MtkitError, match="6 archive entries, more than the 5 allowed"):
        Archive(zipped({f"{i}.xml": b"<a/>" for i in range(6)}), "a.odt", Limits(max_entries=5))
    with pytest.raises(MtkitError, match="inflates to more than the 1,000 bytes allowed"):
        Archive(zipped({"a": bytes(600), "b": bytes(600)}, zipfile.ZIP_STORED), "a.odt", Limits(max_inflated=1000))
    whole = zipped({"content.xml": b"<a>" + b"word " * 5000 + b"</a>"})
    with pytest.raises(MtkitError, match=r"^a.odt: (not a readable zip archive|archive entry 'content.xml' cannot)"):
        Archive(whole[: len(whole) // 2], "a.odt", Limits())
    with pytest.raises(MtkitError, match="^a.odt: not a readable zip archive"):
        Archive(b"this is no zip", "a.odt", Limits())
    with pytest.raises(MtkitError, match="is there twice"):
        data = io.BytesIO()
        with zipfile.ZipFile(data, "w") as zf:
            zf.writestr("a.xml", b"<a/>")
            with pytest.warns(UserWarning):
                zf.writestr("a.xml", b"<b/>")
        Archive(data.getvalue(), "a.odt", Limits())


# ------------------------------------------------------------------ XML

LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
<!ENTITY lol9 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">]>
<w:document xmlns:w="urn:w"><w:t>&lol9;</w:t></w:document>"""
XXE = b"""<?xml version="1.0"?><!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]><d>&x;</d>"""


@pytest.mark.parametrize("data", [LAUGHS, XXE, b'<!DOCTYPE html SYSTEM "http://example.com/x.dtd"><html/>'],
                         ids=["billion-laughs", "xxe", "external-dtd"])
def test_xml_with_a_dtd_or_entities_is_refused(data):
    with pytest.raises(MtkitError, match=r"^a.docx: word/document.xml: refused XML \(\w+: a DTD or an entity"):
        vet_xml(data, "a.docx: word/document.xml")
    archive = Archive(zipped({"word/document.xml": data}), "a.docx", Limits())
    with pytest.raises(MtkitError, match="refused XML"):
        archive.xml("word/document.xml")


def test_xml_that_is_not_well_formed_is_one_line_and_good_xml_parses_with_its_prefixes():
    with pytest.raises(MtkitError, match=r"^a.odt: content.xml: not well-formed XML \("):
        vet_xml(b"<a><b></a>", "a.odt: content.xml")
    root = parse_xml(b'<w:document xmlns:w="urn:w"><w:t>x</w:t></w:document>', "a.docx")
    assert root.prefix == "w" and root[0].text == "x"


# ------------------------------------------------------------------ plain text and files


def test_plain_text_keeps_its_lines_endings_and_mark():
    data = "\ufeffOne line.\r\n\r\n  \nTwo a < b.\nlast".encode()
    assert translate_bytes(data, "txt", Texts(identity), "a.txt") == data
    done = translate_bytes(data, "txt", Texts(reversed_words), "a.txt").decode()
    assert done == "\ufeffline. One\r\n\r\n  \nb. < a Two\nlast"
    with pytest.raises(MtkitError, match=r"^a.txt: line 2: not valid UTF-8"):
        translate_bytes(b"fine\n\xff\xfe bad\n", "txt", Texts(identity), "a.txt")


def test_a_file_is_written_whole_or_not_at_all(tmp_path):
    (tmp_path / "a.txt").write_text("one two\n")
    assert translate_file(tmp_path / "a.txt", tmp_path / "b.txt", Texts(reversed_words)) == "txt"
    assert (tmp_path / "b.txt").read_text() == "two one\n"
    (tmp_path / "bad.txt").write_bytes(b"\xff")
    with pytest.raises(MtkitError):
        translate_file(tmp_path / "bad.txt", tmp_path / "b.txt", Texts(reversed_words))
    assert (tmp_path / "b.txt").read_text() == "two one\n"  # what was there before is kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt", "bad.txt"]  # no temporary left
    with pytest.raises(MtkitError, match="more than the 4 a document may have"):
        translate_file(tmp_path / "a.txt", tmp_path / "c.txt", Texts(identity), limits=Limits(max_bytes=4))


# ------------------------------------------------------------------ the CLI


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model.pt", decode={"beam": 1, "max_len_b": 4})


def run(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.argv", ["mtkit", *map(str, args)])
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def error_line(code: int, err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 1 and "Traceback" not in err and len(errors) == 1, (code, err)
    return errors[0]


def test_the_cli_translates_a_document_into_its_format(monkeypatch, capsys, tiny, tmp_path):
    (tmp_path / "notes").write_text("two hundred five\n\nnine\n")
    code, out, err = run(monkeypatch, capsys, "translate", "-m", tiny, "--format", "txt", tmp_path / "notes",
                         "-o", tmp_path / "out")
    assert code == 0, err
    lines = (tmp_path / "out").read_text().split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[0] and lines[2]


def test_a_document_past_its_limit_is_refused_before_the_model_loads(monkeypatch, capsys, tiny, tmp_path):
    big = tmp_path / "talk.srt"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # a sparse 1 GiB .srt: no disk used
    code, _, err = run(monkeypatch, capsys, "translate", "-m", tiny, big, "-o", tmp_path / "talk.de.srt")
    assert "bytes, more than the 268,435,456 a document may have" in error_line(code, err)
    assert "loaded" not in err and not (tmp_path / "talk.de.srt").exists()


@pytest.mark.parametrize("flags, refused", [(["--nbest", "2", "--beam", "2"], "--nbest"), (["--qe"], "--qe"),
                                            (["--alignments"], "--alignments"), (["--protect", "x"], "--protect")])
def test_what_a_document_has_no_room_for_is_refused(monkeypatch, capsys, tiny, tmp_path, flags, refused):
    (tmp_path / "a.md").write_text("# Title\n")
    code, _, err = run(monkeypatch, capsys, "translate", "-m", tiny, *flags, tmp_path / "a.md", "-o", tmp_path / "b")
    assert error_line(code, err).endswith(f"translated whole into its own format: drop {refused} (--glossary "
                                          "applies to documents)")


def test_one_document_at_a_time(monkeypatch, capsys, tiny, tmp_path):
    (tmp_path / "a.srt").write_text("")
    (tmp_path / "b.txt").write_text("x\n")
    code, _, err = run(monkeypatch, capsys, "translate", "-m", tiny, tmp_path / "a.srt", tmp_path / "b.txt")
    assert "a document is translated on its own: give one input with -o OUT" in error_line(code, err)


def hostile(kind: str) -> bytes:
    if kind == "bomb":
        return bomb(64)
    if kind == "xxe":
        return zipped({"mimetype": b"application/vnd.oasis.opendocument.text", "content.xml": XXE})
    if kind == "laughs":
        return zipped({"[Content_Types].xml": b"<Types/>", "word/document.xml": LAUGHS})
    if kind == "traversal":
        return zipped({"mimetype": b"application/epub+zip", "../../evil.xhtml": b"<html/>"})
    whole = zipped({"ppt/slides/slide1.xml": b"<p>" + b"word " * 4000 + b"</p>"})
    return whole[: len(whole) // 2]


@pytest.mark.parametrize("kind, name, said", [
    ("bomb", "report.docx", "inflates 1,0[0-9][0-9] times (a zip bomb?)"),
    ("xxe", "letter.odt", "content.xml: refused XML"),
    ("laughs", "report.docx", "word/document.xml: refused XML"),
    ("traversal", "book.epub", "'../../evil.xhtml' leaves the archive's folder"),
    ("truncated", "deck.pptx", "not a readable zip archive")])
def test_hostile_archives_are_one_line_before_the_model_loads_and_leave_nothing(monkeypatch, capsys, tiny, tmp_path,
                                                                               kind, name, said):
    (tmp_path / name).write_bytes(hostile(kind))
    (tmp_path / "out").mkdir()
    tracemalloc.start()
    code, _, err = run(monkeypatch, capsys, "translate", "-m", tiny, tmp_path / name, "-o", tmp_path / "out" / name)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    line = error_line(code, err)
    assert line.startswith(f"error: {tmp_path / name}: ") and re.search(re.escape(said).replace(
        re.escape("[0-9][0-9]"), "[0-9][0-9]"), line), line
    assert "loaded" not in err and list((tmp_path / "out").iterdir()) == []
    assert peak < 32 << 20  # the file itself and the directory, never what it inflates to


def test_the_api_translates_a_file_and_bytes_with_the_models_alignments(tiny, tmp_path):
    import mtkit

    model = mtkit.load(tiny)
    (tmp_path / "talk.srt").write_text("1\n00:00:01,000 --> 00:00:02,500\ntwo hundred\nfive\n\n"
                                       "2\n00:00:03,000 --> 00:00:04,000\nnine\n")
    assert model.translate_file(tmp_path / "talk.srt", tmp_path / "out.srt", beam=2) == "srt"
    out = (tmp_path / "out.srt").read_text().split("\n\n")  # (an untrained model: a cue may get fewer lines)
    assert [cue.split("\n")[:2] for cue in out] == [["1", "00:00:01,000 --> 00:00:02,500"],
                                                    ["2", "00:00:03,000 --> 00:00:04,000"]]
    texts = model.document_texts()
    assert texts.aligned  # the torch engine gives alignments: formatting is placed by them
    with pytest.raises(MtkitError, match="format 'pdf': expected one of docx, pptx"):
        model.translate_document(b"x", "pdf")
    with pytest.raises(MtkitError, match="unknown option 'beams'"):
        model.translate_file(tmp_path / "talk.srt", tmp_path / "out2.srt", beams=2)
    assert not (tmp_path / "out2.srt").exists()

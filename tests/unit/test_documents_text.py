"""Subtitles (.srt, .vtt) and Markdown (.md) through mtkit.documents: an identity round trip gives the file back
byte for byte; a word-for-word translator with true alignments (reordering, longer words) shows what stays as
written (timings, cue settings, code, URLs, HTML, front matter), that each cue keeps its number of lines and each
block its structure, and that formatting lands on the aligned words; malformed files are one line naming the
file and line; deep nesting costs linear time. One slow test on the Multi30k model."""

from __future__ import annotations

import re
import tracemalloc

import pytest
from conftest import MODELS
from markdown_it import MarkdownIt

from mtkit.documents import Limits, Texts, identity, translate_bytes, translate_file
from mtkit.errors import MtkitError

# ------------------------------------------------------------------ a deterministic word translator

WORDS = {
    "a": "ein", "an": "ein", "the": "der", "dog": "Hund", "dogs": "Hunde", "cat": "Katze", "cats": "Katzen",
    "runs": "rennt", "sleeps": "schläft", "jumps": "springt", "red": "rote", "green": "grünen", "park": "Parkanlage",
    "ball": "Ball", "with": "mit", "and": "und", "in": "im", "on": "auf", "is": "ist", "happy": "glücklicher",
    "hello": "hallo", "there": "dort", "my": "mein", "good": "guter", "old": "alter", "friend": "Freund",
    "yes": "ja", "no": "nein", "see": "siehe", "here": "hier", "now": "jetzt", "title": "Titel", "it": "es",
    "big": "großer", "small": "kleiner", "house": "Haus", "one": "eins", "two": "zwei", "lines": "Zeilen",
    "over": "über", "quote": "Zitat", "name": "Name", "description": "Beschreibung", "animal": "Tier",
    "pet": "Haustier", "first": "erste", "second": "zweite", "nested": "verschachtelt", "text": "Text",
    "break": "Umbruch", "next": "nächste", "line": "Zeile", "last": "letzte", "link": "Verweis", "more": "mehr",
    "you": "du", "all": "alle", "words": "Wörter", "of": "von", "to": "zu", "man": "Mann", "street": "Straße",
    "at": "an", "night": "Nacht", "emphasis": "Betonung", "list": "Liste", "item": "Eintrag", "table": "Tabelle",
}
VERBS = {"runs", "sleeps", "jumps", "is"}  # go to the end of their sentence, as a German subordinate clause's
_PUNCT = re.compile(r"^(\W*)(.*?)(\W*)$")


def word(w: str) -> str:
    lead, core, trail = _PUNCT.match(w).groups()
    found = WORDS.get(core.lower())
    if found is None:
        return w
    return lead + (found[:1].upper() + found[1:] if core[:1].isupper() else found) + trail


def words(sentences: list[str]) -> list[tuple[str, list[tuple[int, int]]]]:
    """Each word through WORDS (unknown words as they are), in each sentence (up to a word ending in . ! or ?)
    its verbs moved to the end before the full stop; the alignment says where each source word went."""
    out = []
    for s in sentences:
        src, order, clause = s.split(), [], []
        ends: dict[int, str] = {}  # a sentence's full stop stays last
        for i, w in enumerate(src):
            clause.append(i)
            if (m := re.search(r"(?<=\w)[.!?]+$", w)) or i == len(src) - 1:
                order += [c for c in clause if not _verb(src[c])] + [c for c in clause if _verb(src[c])]
                if m:
                    src[i], ends[len(order) - 1] = w[: m.start()], m.group(0)
                clause = []
        target = [word(src[i]) + ends.get(j, "") for j, i in enumerate(order)]
        out.append((" ".join(target), [(i, j) for j, i in enumerate(order)]))
    return out


def _verb(w: str) -> bool:
    return _PUNCT.match(w).group(2).lower() in VERBS


def run(data: str | bytes, fmt: str, translate=identity) -> bytes:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return translate_bytes(raw, fmt, Texts(translate), f"talk.{fmt}", Limits())


def one_line_error(data: bytes, fmt: str) -> str:
    with pytest.raises(MtkitError) as e:
        run(data, fmt)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"talk.{fmt}: ")
    return message


# ------------------------------------------------------------------ subtitles

SRT = (
    "\ufeff1\r\n00:00:01,000 --> 00:00:02,500\r\nThe <i>dog</i> runs\r\nin the green park.\r\n\r\n"
    "2\r\n00:00:03,5 --> 00:00:04,000\r\n{\\an8}A <b>small</b> cat sleeps.\r\n\r\n\r\n"
    "3\r\n00:00:05,000 --> 00:00:07,250 X1:100 X2:200 Y1:10 Y2:20\r\n"
    "- Hello my <font color=\"#ff0000\">friend</font>.\r\n"
    "- Yes, <u>hello</u>!\r\n\r\n"
    "4\r\n00:00:08,000 --> 00:00:09,000\r\n<i>A big dog\r\nand a small cat\r\nin the house.</i>\r\n\r\n"
    "5\r\n00:00:10,000 --> 00:00:11,000\r\nTom & Jerry <3 the <i>ball"
)

VTT = (
    "WEBVTT - a talk\nKind: captions\n\n"
    "NOTE the dog\nis a good dog\n\n"
    "STYLE\n::cue(.red) { color: red }\n\n"
    "REGION\nid:fred width:40%\n\n"
    "intro\n00:01.000 --> 00:02.000 align:start position:10% line:0\n"
    "<v Bob>The dog runs</v> &amp; the cat <c.red>sleeps</c>.\n"
    "<00:01.500>Hello <i>my good friend</i> &lt;3&nbsp;now\n\n"
    "00:00:03.000 --> 00:00:05.000\n<lang en>A <ruby>house<rt>Haus</rt></ruby> in the park</lang>.\n"
)


def cue_lines(text: str) -> list[list[str]]:
    """The text lines of each cue (the lines after a timing, up to a blank line)."""
    cues, lines = [], text.splitlines()
    for k, line in enumerate(lines):
        if "-->" in line:
            body = []
            for after in lines[k + 1 :]:
                if not after.strip():
                    break
                body.append(after)
            cues.append(body)
    return cues


def skeleton(text: str) -> list[str]:
    """Every line that is not cue text (numbers, timings, header, NOTE/STYLE/REGION blocks, blank lines)."""
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if "-->" in line:
            inside = True
            out.append(line)
        elif not line.strip():
            inside = False
            out.append(line)
        elif not inside:
            out.append(line)
    return out


@pytest.mark.parametrize(("fmt", "text"), [("srt", SRT), ("vtt", VTT), ("vtt", VTT.replace("\n", "\r\n"))])
def test_subtitles_identity_gives_the_file_back(fmt, text):
    assert run(text, fmt) == text.encode("utf-8")


def test_srt_translated_keeps_timings_lines_and_tags_on_the_aligned_words():
    out = run(SRT, "srt", words).decode("utf-8")
    assert out.startswith("\ufeff1\r\n") and out.count("\r\n") == SRT.count("\r\n")
    assert skeleton(out) == skeleton(SRT)  # numbers, timings (00:00:03,5 too), coordinates, blank lines
    assert [len(c) for c in cue_lines(out)] == [len(c) for c in cue_lines(SRT)]
    first, second, dialogue, long, last = cue_lines(out)
    assert " ".join(first) == "Der <i>Hund</i> im der grünen Parkanlage rennt."
    assert second == ["{\\an8}Ein <b>kleiner</b> Katze schläft."]
    # (whether a tag takes the punctuation beside its word is mtkit.text.markup's business: either is fine here)
    assert re.fullmatch(r'- Hallo mein <font color="#ff0000">Freund\.?</font>\.?', dialogue[0])
    assert re.fullmatch(r"- Ja, <u>hallo!?</u>!?", dialogue[1])  # each line of a dialogue alone
    assert long[0].startswith("<i>") and re.search(r"Haus\.?</i>\.?$", long[-1])
    assert "Tom & Jerry <3" in last[0] and "<i>Ball" in last[0]  # literal text, an unclosed tag kept in place


def test_vtt_translated_keeps_header_blocks_settings_and_entities():
    out = run(VTT, "vtt", words).decode("utf-8")
    assert skeleton(out) == skeleton(VTT)  # header, NOTE, STYLE, REGION, identifier, timings with settings
    assert [len(c) for c in cue_lines(out)] == [len(c) for c in cue_lines(VTT)]
    text = " ".join(" ".join(c) for c in cue_lines(out))
    assert "<v Bob>Der Hund" in text and "</v>" in text and "&amp;" in text
    assert re.search(r"<c.red>schläft\.?</c>", text) and "<00:01.500>" in text
    assert "<i>mein guter Freund</i>" in text and "&lt;3" in text and "jetzt" in text
    assert "<lang en>" in text and "<ruby>Haus<rt>Haus</rt></ruby>" in text and "Parkanlage" in text


def test_a_cue_breaks_at_spaces_outside_tags_balanced_by_length():
    from mtkit.documents.subtitles import break_lines

    pieces = [("one two ", False), ('<font color="a b">', True), ("three four five", False), ("</font>", True)]
    assert break_lines(pieces, 2) == ['one two <font color="a b">three', "four five</font>"]
    assert break_lines([("single", False)], 3) == ["single"]  # fewer places than lines: fewer lines


@pytest.mark.parametrize(("fmt", "data", "expected"), [
    ("srt", b"1\n00:00:01,000 --> 00:00:02,000\nok\n\n2\n00:00:03,000 -> 00:00:04,000\nno\n",
     "line 6: expected a timing"),
    ("srt", b"1\n00:00:01,000 --> 00:00:02,000\nok\n\nstray text\n", "line 5: expected a cue number or a timing"),
    ("srt", b"1\n00:00:01,000 --> 00:00:02,000\n\xff\xfe text\n", "line 3: not valid UTF-8"),
    ("srt", b"1\n", "line 2: expected a timing (after the cue's line 1), found the end of the file"),
    ("vtt", b"1\n00:01.000 --> 00:02.000\nhi\n", "line 1: not a WebVTT file"),
    ("vtt", b"WEBVTT\n\nid\n00:01,000 --> 00:02.000\nhi\n", "line 4: expected a timing (after the cue's line 3)"),
    ("vtt", b"WEBVTT\n\n00:01.000 --> 00:02\nhi\n", "line 3: expected a timing, found '00:01.000 --> 00:02'"),
    ("vtt", b"WEBVTT\n\n00:01.000 --> 00:02.000\n\xc3 hi\n", "line 4: not valid UTF-8"),
])
def test_malformed_subtitles_are_one_line_naming_the_line(fmt, data, expected):
    assert expected in one_line_error(data, fmt)


def test_a_huge_subtitle_file_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "talk.srt"
    with big.open("wb") as f:
        f.truncate(1 << 30)  # a sparse 1 GB file: nothing to read if the size is checked first
    tracemalloc.start()
    with pytest.raises(MtkitError, match="talk.srt: 1,073,741,824 bytes, more than"):
        translate_file(big, tmp_path / "out.srt", Texts(words))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20 and not (tmp_path / "out.srt").exists()  # refused by its size: not a byte read


def test_many_cues_come_back_in_one_pass():
    """Two thousand cues: every one back as written (the reader is one pass over the lines; its cost is timed in
    no test, see benchmarks/documents.py)."""
    cues = "".join(f"{k}\n00:00:{k % 60:02d},000 --> 00:00:{k % 60:02d},500\nThe <i>dog</i> runs {k}.\n\n"
                   for k in range(1, 2001))
    assert run(cues, "srt") == cues.encode()


# ------------------------------------------------------------------ markdown

README = """---
title: The dog
tags: [a, b]
---

# The *red* dog ##

A dog runs in the **green** park with a `ball` and [a link](https://example.com/x "Title") here.
It is a happy dog, see ![the logo](img/logo.png) and <https://auto.link> now.

Setext title
============

- one dog
  over two lines
- two *cats*
  1. nested first
  2. nested second
     > quoted text in a list

> A quote with _emphasis_ and `code`
> over two lines.

```python
print("the dog runs")  # code: as written
```

    indented code: the dog runs

| Name | Description |
|------|-------------|
| dog  | a *good* animal \\| pet |
| cat  | `x` and a [link](https://example.com/cat) |

<div align="center">
  <b>the dog runs</b>
</div>

Hard break here@@
and next line\\
and the last one.

See [the dog][ref], <span>a red dog</span> &amp; the cat.

[ref]: https://example.com/ref "The dog"

***
""".replace("@@", "  ")  # a hard line break (two spaces)

PARSER = MarkdownIt("commonmark").enable(["table", "strikethrough"])


def structure(text: str) -> dict[str, object]:
    """What must not change: counts of each block and inline token type, the code, URLs, images and HTML."""
    body = text.split("---\n", 2)[2] if text.startswith("---\n") else text
    tokens = PARSER.parse(body)
    inline = [c for t in tokens if t.type == "inline" for c in t.children or []]
    counts: dict[str, object] = {}
    for t in tokens + inline:
        if t.type not in ("text", "softbreak"):  # (how many text tokens a translation makes is its own)
            counts[t.type] = counts.get(t.type, 0) + 1  # type: ignore[operator]
    counts["code"] = [t.content for t in tokens + inline if t.type in ("fence", "code_block", "code_inline")]
    counts["urls"] = [(t.attrs.get("href"), t.attrs.get("title")) for t in inline if t.type == "link_open"]
    counts["images"] = [(t.attrs.get("src"), t.content) for t in inline if t.type == "image"]
    counts["html"] = [t.content for t in tokens + inline if t.type in ("html_block", "html_inline")]
    counts["headings"] = [t.tag for t in tokens if t.type == "heading_open"]
    counts["rows"] = [sum(1 for _ in re.finditer(r"<t[dh]", r)) for r in re.findall(r"<tr>.*?</tr>",
                                                                                   PARSER.render(body), re.S)]
    return counts


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_markdown_identity_gives_the_file_back(newline):
    text = README.replace("\n", newline)
    assert run("\ufeff" + text, "md") == ("\ufeff" + text).encode("utf-8")


def test_markdown_translated_keeps_structure_code_urls_and_html():
    out = run(README, "md", words).decode("utf-8")
    assert structure(out) == structure(README)
    assert out.startswith("---\ntitle: The dog\ntags: [a, b]\n---\n")  # front matter as written
    assert out.count("\n") == README.count("\n")  # every paragraph re-broken into its own number of lines
    assert "# Der *rote* Hund ##\n" in out
    assert "**grünen**" in out and "[ein Verweis](https://example.com/x \"Title\")" in out
    assert "<span>ein rote Hund</span>" in out and "&amp;" in out
    assert "| Hund  | ein *guter* Tier \\| Haustier |" in out  # each cell, its own pipe escaped again
    assert "Hard Umbruch hier  \nund nächste Zeile\\\nund der letzte eins." in out  # hard breaks kept
    assert re.search(r"\[der Hund,?\]\[ref\]", out) and "\n[ref]: https://example.com/ref \"The dog\"\n" in out
    assert "\n> Ein Zitat mit _Betonung_" in out and "`code` über zwei Zeilen.\n" in out  # "> " on both lines


def test_markdown_escapes_what_the_translation_adds():
    def odd(sentences):
        return [("1. # *not* _emphasis_ [no link] `tick` <b> x|y", []) for _ in sentences]

    source = "A dog.\n\n| a | b |\n|---|---|\n| dog | cat |\n\n- item\n"
    out = run(source, "md", odd).decode("utf-8")
    assert structure(out) == structure(source)
    tokens = PARSER.parse(out)
    assert [c.type for t in tokens if t.type == "inline" for c in t.children] == ["text"] * 6
    assert all("".join(c.content for c in t.children) == "1. # *not* _emphasis_ [no link] `tick` <b> x|y"
               for t in tokens if t.type == "inline")


def test_emphasis_that_covers_no_translated_word_is_left_out():
    def drop(sentences):
        return [("Hund rennt", [(1, 0), (2, 1)]) for _ in sentences]  # the first word ("*The*") is not aligned

    out = run("*The* dog runs\n", "md", drop).decode("utf-8")
    assert out == "Hund rennt\n"


def test_markdown_paragraph_lines_break_only_where_no_block_begins():
    def numbers(sentences):
        return [("Ein 1. Hund # rennt - im > Park", [(0, 0)]) for _ in sentences]

    out = run("A\nb\nc\nd\n", "md", numbers).decode("utf-8")
    assert structure(out) == structure("A\nb\nc\nd\n") and out.count("\n") == 4
    assert all(not re.match(r"[-#>]|[0-9]+\.", line) for line in out.splitlines())


@pytest.mark.parametrize("deep", ["> " * 10_000 + "the dog\n", "- " * 10_000 + "the dog\n",
                                  "".join("  " * k + "- the dog\n" for k in range(300)),
                                  "*" * 5_000 + "the dog" + "*" * 5_000 + "\n",
                                  "[" * 5_000 + "the dog" + "]" * 5_000 + "\n"])
def test_deep_markdown_costs_no_recursion(deep):
    assert run(deep, "md") == deep.encode()
    assert run(deep, "md", words)


def test_malformed_markdown_is_one_line():
    assert "line 3: not valid UTF-8" in one_line_error(b"# Title\n\n\xff text\n", "md")


# ------------------------------------------------------------------ the real model

MODEL = MODELS / "multi30k-en-de"


@pytest.fixture(scope="module")
def model():
    if not (MODEL / "checkpoints").is_dir():
        pytest.skip(f"the Multi30k model is not at {MODEL} (set MTKIT_MODELS to the folder holding multi30k-en-de)")
    import mtkit

    return mtkit.load(MODEL, device="cpu")


@pytest.mark.slow
def test_the_multi30k_model_translates_subtitles_and_markdown(model):
    srt = ("1\n00:00:01,000 --> 00:00:02,500\nA <i>dog</i> runs\nin the park.\n\n"
           "2\n00:00:03,000 --> 00:00:04,000\nTwo men are playing soccer.\n")
    out = model.translate_document(srt.encode(), "srt").decode("utf-8")
    assert skeleton(out) == skeleton(srt) and [len(c) for c in cue_lines(out)] == [2, 1]
    assert re.search(r"<i>[^<]*Hund[^<]*</i>", out) and "Männer" in out
    assert not {"dog", "runs", "the", "men", "playing"} & set(re.findall(r"\w+", out.lower()))
    md = ("# A dog runs\n\nA **dog** runs in the [park](https://example.com/park).\n"
          "Two men are playing `soccer` on a field.\n\n```\nA dog runs.\n```\n")
    out = model.translate_document(md.encode(), "md").decode("utf-8")
    assert structure(out) == structure(md)
    assert re.search(r"\*\*[^*]*Hund[^*]*\*\*", out) and "](https://example.com/park)" in out
    assert "`soccer`" in out and "```\nA dog runs.\n```\n" in out and "Männer" in out

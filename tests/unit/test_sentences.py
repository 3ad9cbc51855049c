"""Sentence splitting inside a line (mtkit.text.sentences): the spans cover the line and give it back with
its own whitespace, paragraphs come apart where a reader would split them (joined Multi30k captions,
abbreviations, numbers, ellipses, quotes, German and French), and hostile lines finish with a valid cover."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys

import pytest
from conftest import MULTI30K
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mtkit.text.sentences
from mtkit.text.sentences import MARGIN, WIDE_SPACES, WINDOW, sentence_spans


def assert_cover(line: str, spans: list[tuple[int, int]]) -> None:
    """In order, no overlap, no whitespace at a sentence's ends, only whitespace between and around them,
    and the sentences with the gaps between them give the line back."""
    at, parts = 0, []
    for start, end in spans:
        assert at <= start < end <= len(line), (spans, len(line))
        assert line[at:start].strip() == "", (line[at:start], spans)
        assert line[start:end] == line[start:end].strip(), line[start:end]
        parts += [line[at:start], line[start:end]]
        at = end
    assert line[at:].strip() == ""
    assert "".join(parts) + line[at:] == line
    assert bool(spans) == bool(line.strip())


def sentences(line: str, lang: str | None = "en") -> list[str]:
    spans = sentence_spans(line, lang)
    assert_cover(line, spans)
    return [line[a:b] for a, b in spans]


CASES = [  # (lang, expected sentences); the line is them joined with one space
    ("en", ["The sun is shining.", "Birds are singing.", "It is a lovely day."]),
    ("en", ["Is it raining?", "No, it is not!"]),
    ("en", ["Dr. Smith arrived at noon.", "He sat down by the window."]),
    ("en", ["Mr. and Mrs. Brown live next door.", "They have two cats."]),
    ("en", ["Bring fruit, e.g. apples or pears.", "Do not bring nuts."]),
    ("en", ["Use the short form, i.e. the one on page two."]),
    ("en", ["She moved to the U.S. in 2010 and never left."]),
    ("en", ["We bought apples, pears, bananas, etc. and went home."]),
    ("en", ["The price rose by 3.5 percent.", "Analysts were surprised."]),
    ("en", ["The total was $1,250.00 in cash."]),
    ("en", ["Install version 1.2.3 of the tool.", "Then restart it."]),
    ("en", ["Upgrade to v1.2.3 before Friday."]),
    ("en", ["Compare vol. 2 with no. 5 of the series."]),
    ("en", ["I waited...", "Nobody came."]),
    ("en", ["Well... I am not sure about that."]),
    ("en", ["He said he would come…", "He never did."]),
    ("en", ['He said, "I am tired."', "Then he went to bed."]),
    ("en", ['"Are you coming?" she asked.']),
    ("en", ["He shouted “Run!”", "Everyone ran."]),
    ("en", ["He left early.", "(He was tired.)", "We stayed."]),
    ("en", ["Visit www.example.com for more.", "It is free."]),
    ("en", ["Write to john.smith@example.co.uk today.", "He answers quickly."]),
    ("en", ["The talk by J. R. R. Tolkien was recorded."]),
    ("en", ["Neither do I.", "He left."]),
    ("en", ['"We are pleased," said Amb. Linda Thomas-Greenfield.', "The next vote is in Feb."]),
    ("en", ["1. Open the lid.", "2. Pour the water.", "3. Close it."]),
    ("en", ["He came home at 5.", "Then he ate."]),
    ("de", ["Das gilt z.B. für Äpfel.", "Birnen sind anders."]),
    ("de", ["Wir brauchen Brot, Milch usw. für das Frühstück."]),
    ("de", ["Herr Dr. Müller kommt morgen.", "Er bringt die Unterlagen mit."]),
    ("de", ["Die Sitzung ist am 3. Oktober in Berlin."]),
    ("de", ["Sie wohnt in der Hauptstr. 5 in Köln."]),
    ("de", ["Der Preis beträgt 3,50 Euro.", "Das ist günstig."]),
    ("de", ["Er sagte: „Ich komme morgen.“", "Sie glaubte ihm nicht."]),
    ("de", ["Wie spät ist es?", "Es ist schon acht Uhr!"]),
    ("de", ["Ein Kind sitzt lächelnd auf dem Motorrad.", "6 Personen versammeln sich zu einem Abendessen."]),
    ("de", ["Er kam ca. 20 Minuten zu spät.", "Niemand hat es bemerkt."]),
    ("fr", ["M. Dupont est arrivé hier soir.", "Il est fatigué."]),
    ("fr", ["Le Dr. Leroy consulte le lundi.", "Il faut prendre rendez-vous."]),
    ("fr", ["Il a dit : « Je suis fatigué. »", "Puis il est parti."]),
    ("fr", ["Quelle heure est-il ?", "Il est déjà huit heures !"]),
    ("fr", ["Il attendait…", "Personne ne venait."]),
    ("fr", ["Ils reviendront le 3 févr. au soir.", "C'est prévu."]),
    ("cs", ["Kolik je hodin?", "Už je osm!"]),
    ("es", ["¿Dónde está la estación?", "Está cerca de aquí."]),
    ("ru", ["Он сказал: «Я устал».", "Потом он ушёл."]),
    ("ja", ["今日は晴れです。", "明日は雨です。"]),
]


@pytest.mark.parametrize(("lang", "expected"), CASES, ids=[f"{lang}-{i}" for i, (lang, _) in enumerate(CASES)])
def test_a_paragraph_comes_apart_where_a_reader_splits_it(lang, expected):
    line = ("" if lang == "ja" else " ").join(expected)
    assert sentences(line, lang) == expected


def test_the_lines_own_whitespace_is_kept_between_sentences():
    line = "  First one.\u00a0 Second one!\tThird one?   "
    spans = sentence_spans(line, "en")
    assert [line[a:b] for a, b in spans] == ["First one.", "Second one!", "Third one?"]
    assert [line[e:s] for (_, e), (s, _) in zip(spans, spans[1:])] == ["\u00a0 ", "\t"]
    assert_cover(line, spans)


@pytest.mark.parametrize("line", ["", " ", "\t \u00a0\u3000 ", "\u2028"])
def test_a_blank_line_has_no_sentence(line):
    assert sentence_spans(line) == []


@pytest.mark.parametrize("line", ["Hello world", "  One sentence.  ", "A man in a blue shirt", "...", "!!! ???",
                                  "3.14159", "www.example.com", "e.g.", "Dr. Who"])
def test_one_sentence_is_one_span(line):
    assert sentences(line) == [line.strip()]


def test_pieces_without_a_word_stay_with_a_sentence():
    assert sentences("Hello. ... Bye.") == ["Hello. ...", "Bye."]
    assert sentences("... Hello. Bye.") == ["... Hello.", "Bye."]


@pytest.mark.parametrize("lang", [None, "", "EN", "pt-BR", "de_AT", "xx", "zz-Latn", "!!", "ü", "en\x00"])
def test_any_language_code_is_read(lang):
    assert sentences("Dr. Smith came. He left.", lang) == ["Dr. Smith came.", "He left."]


def test_a_line_that_is_not_valid_unicode_is_one_sentence():
    line = " First \ud800 one. Second one. "
    assert sentence_spans(line, "en") == [(1, len(line) - 1)]


def test_a_boundary_needs_whitespace_but_in_scripts_without_spaces():
    assert sentences("Muž jde okolo nápisu E.S.E. Electronics. Pak odešel.", "cs") == [
        "Muž jde okolo nápisu E.S.E. Electronics.", "Pak odešel."]
    assert sentences("He left.Then she came.") == ["He left.Then she came."]
    assert sentences("你好。我很好！", "zh") == ["你好。", "我很好！"]


@pytest.mark.skipif(not MULTI30K.is_dir(), reason="Multi30k not found (set MTKIT_MULTI30K to the multi30k folder)")
@pytest.mark.parametrize("lang", ["en", "de", "fr", "cs"])
def test_joined_multi30k_captions_come_apart(lang):
    """Captions that end with a full stop, three to a line: each is one sentence again (but for a rare caption
    that begins with a digit after a short word: ``... bemalt ist. 3 Jungen ...``)."""
    captions = [c.strip() for c in (MULTI30K / f"test_2016_flickr.{lang}").read_text(encoding="utf-8").splitlines()]
    groups = [captions[i:i + 3] for i in range(0, 600, 3)]
    groups = [g for g in groups if all(c.endswith(".") for c in g)]
    assert len(groups) > 150
    wrong = [g for g in groups if sentences(" ".join(g), lang) != g]
    assert len(wrong) <= len(groups) // 50, wrong[:3]


def test_a_line_longer_than_a_window_splits_as_its_parts_do():
    """Read window after window, a long paragraph gives the sentences its parts give alone."""
    parts = ["Dr. Smith arrived at 3.5 p.m. on Monday.", "He said: “I waited… nobody came.”",
             "Visit www.example.com, e.g. page 2.", "The U.S. team won.", "Mme Martin et M. Durand sont là."]
    expected = [s for _ in range(3 * WINDOW // 150) for s in parts]
    line = " ".join(expected)
    assert len(line) > 3 * WINDOW
    assert sentences(line) == expected
    long_one = "Word " + "word " * (2 * WINDOW // 5) + "end."  # no boundary in a whole window: they overlap
    assert sentences(f"{long_one} Next one. {long_one}") == [long_one, "Next one.", long_one]
    assert MARGIN < WINDOW // 4


def test_whitespace_beyond_ascii_reads_as_a_space():
    """sentencex 1.0.32 panics on a capital, a space beyond ASCII and a full stop (``C\u00a0.``): every such
    space reaches it as " ", one character for one, and the line keeps its own."""
    assert {c for c in range(sys.maxunicode + 1) if chr(c).isspace() and c > 127} == set(WIDE_SPACES)
    for space in map(chr, WIDE_SPACES):
        line = f"Tu viens{space}?{space}Il est{space}là. Vitamine C{space}. Fin."
        assert sentences(line, "fr")[:2] == [f"Tu viens{space}?", f"Il est{space}là."]


def test_a_panic_in_sentencex_keeps_the_window_whole_and_an_interrupt_goes_through(monkeypatch):
    """sentencex's real panic (pyo3's PanicException, a BaseException), the wide spaces let through."""
    monkeypatch.setattr(mtkit.text.sentences, "_WIDE_SPACE", re.compile("(?!)"))  # matches nothing
    line = "Tu viens ? Vitamine C\u00a0. Fin. (Il est là.) Puis il part."
    with pytest.raises(BaseException, match="char boundary"):
        mtkit.text.sentences.sentencex.segment("fr", line)
    assert sentences(line, "fr") == ["Tu viens ? Vitamine C\u00a0. Fin. (Il est là.)", "Puis il part."]

    def interrupt(lang, text):
        raise KeyboardInterrupt

    monkeypatch.setattr(mtkit.text.sentences.sentencex, "segment", interrupt)
    with pytest.raises(KeyboardInterrupt):
        sentence_spans("First one. Second one.")


def test_quotation_marks_paired_far_apart_stop_no_splitting():
    """sentencex pairs an opening „ with the next “, however far: the Polish „…” here with the German „…“ two
    thousand characters later, which alone it reads as one quotation, one sentence. Windows bound that."""
    body = [f"Sentence number {i} is here." for i in range(70)]
    expected = ["Powiedział: „Jestem zmęczony.”", *body, "„Warum?“, fragte er."]
    assert len(" ".join(expected)) > WINDOW
    assert sentences(" ".join(expected)) == expected


ATOMS = [*"aZ1 .!?…\"'()«»„“”。\t\u00a0\u3000\n", "Dr.", "M.", "vol. 2", "e.g.", "\ud800", "...", "C\u00a0."]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(ATOMS), max_size=40).map("".join),
       st.sampled_from([None, "en", "de", "fr", "ja", "xx"]))
def test_any_text_gives_a_valid_cover(line, lang):
    assert_cover(line, sentence_spans(line, lang))


# name -> (the line as a Python expression, built in the process that splits it; its language)
HOSTILE = {
    "1 MB without a full stop": ('"word " * 200_000', "en"),
    "1 MB of spaces": ('"Hi.) " + " " * 1_000_000 + "Bye."', "en"),
    "100,000 brackets": ('"( [ {" * 100_000', "en"),
    "100,000 item numbers": ('"1. " * 100_000 + "Go."', "en"),
    "100,000 full stops": ('"." * 100_000', "en"),
    "100,000 Dr.": ('"Dr. " * 100_000', "en"),
    "100,000 ellipses": ('"..." * 100_000', "en"),
    "100,000 quotes": ("'\"' * 100_000", "en"),
    "10,000 placeholders": ('" ".join(f"{{p{i}}} <x id=\'{i}\'/>" for i in range(10_000))', "de"),
}
# Lines of many short sentences, each cut judged: linear too, but seconds on a busy machine.
MANY_SENTENCES = {
    "250,000 sentences": ('"Hi. " * 250_000', "en"), "200,000 ellipsis characters": ('"\u2026 " * 200_000', "en"),
    "brackets": ('".) " * 100_000 + "(A.) B" * 10_000', "en"), "one word of 1 MB": ('"a." * 500_000', "en"),
    "a script without spaces": ('"\u3002" * 100_000 + "\u4f60\u597d\u3002" * 50_000', "zh"),
    "quotes and full stops": ('"\u300d\u3002" * 200_000', "zh"),
}
RUN = """
from mtkit.text.sentences import sentence_spans
for name, (expression, lang) in LINES.items():
    line = eval(expression)
    spans = sentence_spans(line, lang)
    assert_cover(line, spans)
    print(name, len(spans), sep="\t", flush=True)
"""


def run_hostile(lines: dict[str, tuple[str, str]]) -> dict[str, int]:
    """Each line split in a process of its own (stopped if it hangs), its cover checked there; the count of
    sentences per line."""
    code = f"{inspect.getsource(assert_cover)}\nLINES = {lines!r}\n{RUN}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return {name: int(count) for name, count in (row.split("\t") for row in done.stdout.splitlines())}


def test_hostile_lines_finish_with_a_valid_cover():
    """Huge lines, runs of the characters that end sentences, thousands of placeholders: each finishes and
    gives a valid cover."""
    counts = run_hostile(HOSTILE)
    assert counts.keys() == HOSTILE.keys()
    assert counts["1 MB without a full stop"] == 1 and counts["100,000 full stops"] == 1
    assert counts["1 MB of spaces"] == 2


@pytest.mark.slow
def test_lines_of_many_sentences_finish_with_a_valid_cover():
    counts = run_hostile(MANY_SENTENCES)
    assert counts["250,000 sentences"] == 250_000 and counts["a script without spaces"] == 50_000
    assert counts["200,000 ellipsis characters"] == 1  # pieces without a word stay together

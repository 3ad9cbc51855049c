"""Markup carried through translation by word alignment (mtkit.text.markup): parsing, placing tags back,
and well-formed output whatever the alignment."""

from __future__ import annotations

import html
import random
import re

import pytest
import regex

from mtkit.text.markup import MarkupError, Sentence, _tokens, parse, place, translate_markup


def sentences(fragment: str, kind: str = "html") -> list[Sentence]:
    return [p for p in parse(fragment, kind) if isinstance(p, Sentence)]


def identity(lines):
    """A 'translation' that copies each sentence, aligned word for word."""
    return [(line, [(k, k) for k in range(len(line.split()))]) for line in lines]


@pytest.mark.parametrize("fragment", [
    "A <b>red</b> car.",
    '<p class="x">Hello <i>big <b>bold</b></i> world!</p>\n<p>Two &amp; three &lt;4&gt;</p>',
    'x <img src="a.png" alt="a &quot;b&quot;"> y<br>z',
    '<ul><li>one <a href="/a?b=1&amp;c=2">link</a></li><li>two</li></ul>',
    "<script>if (a < b) { x = '<b>'; }</script> text <!-- a <b> comment --> <style>p{}</style>more",
    '  <b>lead</b> and trail  ',
    'Hello <x id="1"/> {name}, <g id="2">you</g>',
])
def test_copying_each_sentence_gives_the_fragment_back(fragment):
    kind = "xml" if "<x " in fragment else "html"
    assert translate_markup([fragment], kind, identity) == [fragment]


def test_block_tags_comments_and_line_breaks_cut_sentences_and_raw_text_is_not_translated():
    found = [s.text for s in sentences("<h1>Title</h1><p>First <b>one</b>.<br>Second.</p>\nThird <script>no</script>"
                                       "<!-- not this --> <style>nor this</style>")]
    assert found == ["Title", "First one.", "Second.", "Third"]
    # an inline pair around a block is markup kept in place, not a sentence's tag
    assert [s.text for s in sentences("<a href=x><div>inside</div></a> after")] == ["inside", "after"]
    # xml: every tag is inline
    assert [s.text for s in sentences("<p>one</p> <p>two</p>", "xml")] == ["one two"]


def test_entities_are_decoded_for_translation_and_escaped_again():
    (s,) = sentences("Tom &amp; Jerry &lt;3 &eacute;t&eacute;")
    assert s.text == "Tom & Jerry <3 été"
    assert translate_markup(["Tom &amp; <b>Jerry</b>"], "html",
                            lambda lines: [("A & <b> B", [(0, 0), (2, 3)])]) == ["A &amp; &lt;b&gt; <b>B</b>"]


@pytest.mark.parametrize("fragment, message", [
    ("a </b> b", "</b> closes no open tag"),
    ("<b>a <i>b</b></i>", "</b> closes no open tag; <i> is open"),
    ("<p>never closed", "<p> is never closed"),
    ("<B>case</b>", "</b> closes no open tag; <B> is open"),  # xml: names are case-sensitive
])
def test_markup_that_is_not_well_formed_is_a_clear_error(fragment, message):
    kind = "xml" if "<B>" in fragment else "html"
    with pytest.raises(MarkupError, match=re.escape(message)):
        parse(fragment, kind)


def test_tags_follow_the_words_they_wrapped():
    (s,) = sentences('A <b>red</b> <a href="/car">car</a>.')
    # two sibling tags on one target word: the first keeps it, the second follows it, empty; the full stop the
    # source left outside the tags stays outside them
    assert place(s, "Ein Auto.", [(0, 0), (1, 1), (2, 1)]) == 'Ein <b>Auto</b>.<a href="/car"></a>'
    assert place(s, "Das Auto ist rot.", [(0, 0), (1, 3), (2, 1)]) == 'Das <a href="/car">Auto</a> ist <b>rot</b>.'
    # a tag whose words found no target word comes back empty, beside the nearest aligned word
    assert place(s, "Ein Auto.", [(0, 0), (2, 1)]) == 'Ein <b></b><a href="/car">Auto</a>.'


def parsed_tags(markup: str) -> list[str]:
    """The tags of well-formed markup, in order (parse raises on any that is not)."""
    return [t.text for t in _tokens(markup, "xml") if t.kind != "text"]


def random_fragment(rng: random.Random, words: int) -> str:
    out, depth = [], []
    for k in range(words):
        if rng.random() < 0.3:
            name = rng.choice("bius")
            out.append(f'<{name} n="{k}">')
            depth.append(name)
        if rng.random() < 0.1:
            out.append(f'<x id="{k}"/>')
        out.append(f"w{k} ")
        while depth and rng.random() < 0.4:
            out.append(f"</{depth.pop()}>")
    out.extend(f"</{name}>" for name in reversed(depth))
    return "".join(out)


@pytest.mark.parametrize("seed", range(200))
def test_any_alignment_gives_well_formed_markup_with_every_tag_and_word(seed):
    rng = random.Random(seed)
    fragment = random_fragment(rng, rng.randint(1, 9))
    n_out = rng.randint(0, 10)
    out_words = [f"t{k}" for k in range(n_out)]

    def translate(lines):
        found = []
        for line in lines:
            n_src = len(line.split())
            pairs = [(rng.randrange(n_src), rng.randrange(n_out)) for _ in range(rng.randint(0, 12))] if n_out else []
            found.append((" ".join(out_words), pairs))
        return found

    (result,) = translate_markup([fragment], "xml", translate)
    assert sorted(parsed_tags(result)) == sorted(parsed_tags(fragment)), (fragment, result)
    assert html.unescape(re.sub(r"<[^>]*>", "", result)).split() == out_words, (fragment, result)
    assert ancestors(result) == ancestors(fragment), (fragment, result)  # the nesting kept


def ancestors(markup: str) -> dict[str, tuple[str, ...]]:
    """Each tag's enclosing tags."""
    found, stack = {}, []
    for token in _tokens(markup, "xml"):
        if token.kind in ("open", "void"):
            found[token.text] = tuple(stack)
        if token.kind == "open":
            stack.append(token.text)
        elif token.kind == "close":
            stack.pop()
    return found


def test_placeholders_in_plain_text_are_carried_untranslated_and_unescaped():
    from mtkit.text.markup import protect_lines

    pattern = regex.compile(r"\{\w+\}|%s|<x[^>]*/>")
    lines = ['Hello {name}, you have %s new <x id="1"/> messages & more.', "no placeholders", "{only} %s", ""]

    def upper(sentences):
        return [(s.upper(), [(k, k) for k in range(len(s.split()))]) for s in sentences]

    assert protect_lines(lines, pattern, upper) == [
        'HELLO {name}, YOU HAVE %s NEW <x id="1"/> MESSAGES & MORE.', "NO PLACEHOLDERS", "{only} %s", ""]
    # reordered: each placeholder goes with the word after it
    assert protect_lines(["a %s b"], pattern, lambda s: [("B A", [(0, 1), (1, 0)])]) == ["%s B A"]


# ------------------------------------------------------------------ strangers' markup: depth, size, attributes


def balanced(markup: str) -> list[str]:
    """The tags of ``markup`` (well-formed: :func:`parsed_tags` raises on any that is not)."""
    return parsed_tags(markup)


@pytest.mark.parametrize("kind", ["html", "xml"])
def test_tags_nested_5000_deep_are_carried_without_recursion(kind):
    fragment = "A <b>" * 5000 + "man" + "</b>" * 5000 + " walks."
    (result,) = translate_markup([fragment], kind, identity)
    assert result == fragment  # every tag back, nested as it was
    (s,) = sentences(fragment, kind)
    assert s.text == "A " * 5000 + "man walks."


HEAVY = r"""
import json, sys, time
from mtkit.text.markup import translate_markup

def identity(lines):
    return [(line, [(k, k) for k in range(len(line.split()))]) for line in lines]

fragment, kind = json.loads(sys.stdin.read())
started = time.monotonic()
(result,) = translate_markup([fragment], kind, identity)
print(json.dumps([result, time.monotonic() - started]))
"""


@pytest.mark.slow  # seconds each, in a subprocess that is killed when it takes too long
@pytest.mark.parametrize("name, fragment, kind", [
    ("100,000 nested tags", "<b>" * 100_000 + "man" + "</b>" * 100_000, "html"),
    ("100,000 nested tags", "<g>" * 100_000 + "man" + "</g>" * 100_000, "xml"),
    ("200 KB of <b>man</b>", "<b>man</b> " * 20_000, "html"),
    ("200 KB of <b>man</b>, one word", "<b>man</b>" * 20_000, "xml"),
    ("30,000 tags each holding the rest", "".join(f"<i>w{k} " for k in range(30_000)) + "</i>" * 30_000, "html"),
    ("100,000 comments never closed", "<!--" * 100_000 + " text", "html"),
    ("100,000 quoted values never closed", '<a x="' * 100_000, "html"),
    ("100,000 tags never ended", "<a b " * 100_000, "xml"),
])
def test_huge_markup_is_translated_in_seconds_and_well_formed(name, fragment, kind):
    """Work linear in the fragment (it was quadratic in its tags, and recursive in their depth): each finishes
    far within the bound (a generous one, not a timing: quadratic work took more than 240 s)."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", HEAVY], input=json.dumps([fragment, kind]), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result, seconds = json.loads(done.stdout)
    assert seconds < 60, (name, seconds)
    assert sorted(balanced(result)) == sorted(balanced(fragment)), name  # the same tags, balanced
    assert words_of(result, kind) == words_of(fragment, kind), name


def words_of(markup: str, kind: str) -> list[str]:
    """The words of ``markup``'s text (read by the tokenizer: a regular expression would take quadratic time
    on the cases above)."""
    return html.unescape("".join(t.text for t in _tokens(markup, kind) if t.kind == "text")).split()


def test_attribute_values_holding_markup_characters_come_back_well_formed():
    import xml.etree.ElementTree as ET

    fragment = ("A <a title=\"x > y\" href='/q?a=1&b=<2>' data-say='\"hi\"' data-ok=\"&amp; &#62;\">red</a> car "
                '<img alt="1 > 0 & 2 < 3"/> here.')
    for kind in ("html", "xml"):
        (result,) = translate_markup([fragment], kind, lambda lines: [
            ("Ein rotes Auto hier.", [(0, 0), (1, 1), (2, 2), (3, 3)])])
        tree = ET.fromstring(f"<r>{result}</r>")  # well-formed XML
        a = tree.find("a")
        assert a is not None and a.text == "rotes", result
        assert a.get("title") == "x > y" and a.get("href") == "/q?a=1&b=<2>" and a.get("data-say") == '"hi"'
        assert a.get("data-ok") == "& >"  # entities already written stay as they are
        assert tree.find("img").get("alt") == "1 > 0 & 2 < 3"
        assert [t.kind for t in _tokens(result, kind)] == ["text", "open", "text", "close", "text", "void", "text"]


def test_an_error_names_a_huge_tag_in_a_short_line():
    huge = "<b " + "x" * 100_000 + ">"
    with pytest.raises(MarkupError) as e:
        parse(f"{huge}never closed")
    assert "is never closed" in str(e.value) and len(str(e.value)) < 200
    with pytest.raises(MarkupError) as e:
        parse("a </" + "b" * 100_000 + ">")
    assert "closes no open tag" in str(e.value) and len(str(e.value)) < 200


def test_a_void_tag_at_a_sentence_start_keeps_its_space():
    assert translate_markup(['<img src="a.png"> a dog'], "html", identity) == ['<img src="a.png"> a dog']
    assert translate_markup(['<x id="1"/> a dog'], "xml", identity) == ['<x id="1"/> a dog']


# ------------------------------------------------------------------ placeholders: spacing, time limit


PLACEHOLDER = regex.compile(r"\{\w+\}|%s")


def one(line: str, translation: str, alignment) -> str:
    from mtkit.text.markup import protect_lines

    return protect_lines([line], PLACEHOLDER, lambda sentences: [(translation, alignment)])[0]


def test_placeholders_are_spaced_as_in_the_source():
    # at the start and the end: a space on the side that had one, none at the line's ends
    assert one("{count} men stand .", "Männer stehen da.", [(0, 0), (1, 1), (2, 2)]) == "{count} Männer stehen da."
    assert one("men stand {x}", "Männer stehen", [(0, 0), (1, 1)]) == "Männer stehen {x}"
    assert one("  {a} {b} dogs run .  ", "Hunde rennen .", [(0, 0), (1, 1), (2, 2)]) == "{a} {b} Hunde rennen ."
    # in the middle, whatever word the alignment puts it before
    assert one("A man named {name} walks .", "Ein Mann namens, der geht.", [(0, 0), (1, 1), (2, 2), (3, 4), (4, 4)]) \
        == "Ein Mann namens, der {name} geht."
    # glued to a word: glued to its translation, spaced from any other word
    assert one("{count}men stand .", "Männer stehen .", [(0, 0), (1, 1), (2, 2)]) == "{count}Männer stehen ."
    assert one("Hello {name}, you .", "Hallo , du .", [(0, 0), (1, 1), (2, 2), (3, 3)]) == "Hallo {name}, du ."
    assert one("Hello {name}, a dog .", "Hallo, ein Hund .", [(0, 0), (2, 1), (3, 2), (4, 3)]) \
        == "Hallo, {name} ein Hund ."  # its comma found no word: the placeholder is spaced from "ein"
    assert one("costs 5%s now", "kostet jetzt 5", [(0, 0), (1, 2), (2, 1)]) == "kostet jetzt 5%s"


@pytest.mark.parametrize("seed", range(300))
def test_any_alignment_puts_each_placeholder_back_once_spaced_as_in_the_source(seed):
    rng = random.Random(seed)
    parts, names = [], iter(f"{{p{k}}}" for k in range(100))
    for _ in range(rng.randint(1, 8)):
        parts.append(rng.choice([next(names), f"w{rng.randrange(9)}", "."]))
        parts.append(rng.choice([" ", " ", "", "  "]))
    line = rng.choice(["", " "]) + "".join(parts)
    words = PLACEHOLDER.sub(" ", line).split()
    out_words = [f"t{k}" for k in range(rng.randint(0, 8))]
    pairs = [(rng.randrange(len(words) + 1), rng.randrange(len(out_words))) for _ in range(rng.randint(0, 10))] \
        if out_words and words else []
    result = one(line, " ".join(out_words), pairs)
    if not words:  # placeholders alone: the line as it is
        assert result == line
        return
    assert result == result.strip(), (line, result)
    holders = PLACEHOLDER.findall(line)
    assert sorted(PLACEHOLDER.findall(result)) == sorted(holders), (line, result)  # each once
    assert PLACEHOLDER.sub(" ", result).split() == out_words, (line, result)
    for m in PLACEHOLDER.finditer(line):  # a side with whitespace in the source has whitespace (or the line's end)
        begin = result.index(m.group(0))
        end = begin + len(m.group(0))
        if m.start() > 0 and line[m.start() - 1].isspace():
            assert begin == 0 or result[begin - 1].isspace(), (line, result)
        if m.end() < len(line) and line[m.end()].isspace():
            assert end == len(result) or result[end].isspace(), (line, result)


def test_a_pattern_that_backtracks_without_end_stops_at_its_time_limit():
    import time

    from mtkit.text.markup import split_protected

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        split_protected("a" * 40 + "! and more", regex.compile(r"(a|aa)+$"), timeout=0.2)
    assert time.monotonic() - started < 30  # the limit, not the pattern's 2^40 steps
    found, _ = split_protected("aaaa {x} b", regex.compile(r"(a+)+$|\{\w+\}"), timeout=0.2)
    assert found == ["aaaa b"]


# ------------------------------------------------------------------ what the web marks not to translate; punctuation


def reordering(lines):
    """Each word upper-cased, the sentence's words in reverse order but its closing punctuation at its end, with
    the true alignment."""
    out = []
    for line in lines:
        words = line.split()
        tail = words[-1][len(words[-1].rstrip(".!?")):] if words else ""
        if tail:
            words[-1] = words[-1][: len(words[-1]) - len(tail)]
        target = [w.upper() for w in reversed(words)]
        if target:
            target[-1] += tail
        out.append((" ".join(target), [(len(words) - 1 - t, t) for t in range(len(words))]))
    return out


@pytest.mark.parametrize("fragment, kept", [
    ("Run <code>ls -l</code> now.", "<code>ls -l</code>"),
    ('See <span class="a notranslate b">the <b>Red</b> Car</span> here.', '<span class="a notranslate b">the '
                                                                          '<b>Red</b> Car</span>'),
    ("Press <kbd>Ctrl</kbd> and go.", "<kbd>Ctrl</kbd>"),
    ("Set <var>n</var> to two.", "<var>n</var>"),
    ("Say <q translate=no>hello there</q> twice.", "<q translate=no>hello there</q>"),
])
def test_what_the_web_marks_not_to_translate_is_carried_whole_beside_its_words(fragment, kept):
    assert translate_markup([fragment], "html", identity) == [fragment]
    (result,) = translate_markup([fragment], "html", reordering)
    assert kept in result, result
    assert html.unescape(re.sub(r"<[^>]*>", "", result.replace(kept, ""))).split() == \
        reordering([sentences(fragment)[0].text])[0][0].split()  # the rest translated, the kept text not
    (s,) = sentences(fragment)
    assert "ls" not in s.text and "Red" not in s.text and "Ctrl" not in s.text and "hello" not in s.text


def test_kept_elements_in_a_block_place_are_literal_and_their_markup_must_be_well_formed():
    fragment = '<p>Text.</p><pre>a <b>b</b>\n  c</pre><div translate="no"><p>no</p></div><p>More <code>x</code></p>'
    assert [s.text for s in sentences(fragment)] == ["Text.", "More"]
    assert translate_markup([fragment], "html", reordering) == [
        '<p>TEXT.</p><pre>a <b>b</b>\n  c</pre><div translate="no"><p>no</p></div><p>MORE <code>x</code></p>']
    with pytest.raises(MarkupError, match="</b> closes no open tag"):
        parse("a <code>x </b></code> b")
    # xml: no element is kept (a format's own <g>/<x> tags)
    assert [s.text for s in sentences("a <code>x</code> b", "xml")] == ["a x b"]


@pytest.mark.parametrize("fragment, translation, alignment, expected", [
    # a tag around a word without its punctuation leaves the target word's punctuation outside too
    ("Read <b>more</b>.", "Lies mehr.", [(0, 0), (1, 1)], "Lies <b>mehr</b>."),
    ('"<i>Stop</i>," he said.', "„Halt“, sagte er.", [(0, 0), (1, 1), (2, 2)], "„<i>Halt</i>“, sagte er."),
    ("(<b>see</b> above)", "(siehe oben)", [(0, 0), (1, 1)], "(<b>siehe</b> oben)"),
    ("<b>A dog.</b>", "Ein Hund.", [(0, 0), (1, 1)], "<b>Ein Hund.</b>"),  # its own full stop stays inside
    ("<b>more</b>.", "...", [(0, 0)], "<b>...</b>"),  # punctuation alone: never emptied
    # not grown to the article a hard alignment gave to the noun, nor to a word aligned elsewhere too
    ("A <b>dog</b> runs.", "Ein Hund rennt.", [(1, 0), (1, 1), (2, 2)], "Ein <b>Hund</b> rennt."),
    ("A <b>dog</b> runs.", "Ein Hund rennt.", [(0, 0), (1, 0), (1, 1), (2, 2)], "Ein <b>Hund</b> rennt."),
    ("The <b>little girl</b> is happy.", "Das kleine Mädchen ist glücklich.",
     [(0, 0), (1, 1), (2, 2), (4, 3), (4, 4)], "Das <b>kleine Mädchen</b> ist glücklich."),
])
def test_tags_go_around_the_aligned_words_only(fragment, translation, alignment, expected):
    assert translate_markup([fragment], "html", lambda lines: [(translation, alignment)]) == [expected]


@pytest.mark.parametrize("fragment", ["Read <b>more</b>.", '"<i>Stop</i>," he said.', "(<b>see</b> above)",
                                      "A <b>big <i>red</i></b> car.", "<b>one</b>, <i>two</i>; three!"])
def test_punctuation_outside_tags_stays_outside_with_identity_and_reordering(fragment):
    assert translate_markup([fragment], "html", identity) == [fragment]
    (result,) = translate_markup([fragment], "html", reordering)
    for m in re.finditer(r"<(b|i)>(.*?)</\1>", result):
        inner = re.sub(r"<[^>]*>", "", m.group(2))
        assert inner and inner[0].isalnum() and inner[-1].isalnum(), (fragment, result)


@pytest.mark.parametrize("seed", range(100))
def test_any_alignment_keeps_html_well_formed_with_kept_elements_and_punctuation(seed):
    rng = random.Random(seed)
    out, depth = [], []
    for k in range(rng.randint(1, 9)):
        if rng.random() < 0.3:
            name = rng.choice("bius")
            out.append(f'<{name} n="{k}">')
            depth.append(name)
        if rng.random() < 0.15:
            out.append(f'<code n="{k}">c{k} <b>x</b></code> ')
        out.append(rng.choice(["(", '"', ""]) + f"w{k}" + rng.choice([".", ",", "!)", ""]) + " ")
        while depth and rng.random() < 0.4:
            out.append(f"</{depth.pop()}>")
    out.extend(f"</{name}>" for name in reversed(depth))
    fragment = "".join(out)
    n_out = rng.randint(0, 8)
    out_words = [rng.choice(["„", "(", ""]) + f"t{k}" + rng.choice([".", "“", ""]) for k in range(n_out)]

    def translate(lines):
        return [(" ".join(out_words), [(rng.randrange(len(line.split())), rng.randrange(n_out))
                                       for _ in range(rng.randint(0, 12))] if n_out else []) for line in lines]

    (result,) = translate_markup([fragment], "html", translate)
    tags = sorted(t.text for t in _tokens(result, "html") if t.kind != "text")  # well-formed, or _tokens raises
    assert tags == sorted(t.text for t in _tokens(fragment, "html") if t.kind != "text"), (fragment, result)
    codes = re.compile(r"<code[^>]*>.*?</code>")
    assert sorted(codes.findall(result)) == sorted(codes.findall(fragment)), (fragment, result)
    text = html.unescape(re.sub(r"<[^>]*>", "", codes.sub("", result)))
    assert text.split() == out_words, (fragment, result)  # every word whole, the kept elements beside them

"""Markup carried through translation by word alignment (mtkit.runtime.markup): parsing, placing tags back,
and well-formed output whatever the alignment."""

from __future__ import annotations

import html
import random
import re

import pytest

from mtkit.runtime.markup import MarkupError, Sentence, parse, place, translate_markup


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
    # two sibling tags on one target word: the first keeps it, the second follows it, empty
    assert place(s, "Ein Auto.", [(0, 0), (1, 1), (2, 1)]) == 'Ein <b>Auto.</b><a href="/car"></a>'
    assert place(s, "Das Auto ist rot.", [(0, 0), (1, 3), (2, 1)]) == 'Das <a href="/car">Auto</a> ist <b>rot.</b>'
    # a tag whose words found no target word comes back empty, beside the nearest aligned word
    assert place(s, "Ein Auto.", [(0, 0), (2, 1)]) == 'Ein <b></b><a href="/car">Auto.</a>'


def parsed_tags(markup: str) -> list[str]:
    """The tags of well-formed markup, in order (parse raises on any that is not)."""
    from mtkit.runtime.markup import _tokens

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
    from mtkit.runtime.markup import _tokens

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
    from mtkit.runtime.markup import protect_lines

    pattern = re.compile(r"\{\w+\}|%s|<x[^>]*/>")
    lines = ['Hello {name}, you have %s new <x id="1"/> messages & more.', "no placeholders", "{only} %s", ""]

    def upper(sentences):
        return [(s.upper(), [(k, k) for k in range(len(s.split()))]) for s in sentences]

    assert protect_lines(lines, pattern, upper) == [
        'HELLO {name}, YOU HAVE %s NEW <x id="1"/> MESSAGES & MORE.', "NO PLACEHOLDERS", "{only} %s", ""]
    # reordered: each placeholder goes with the word after it
    assert protect_lines(["a %s b"], pattern, lambda s: [("B A", [(0, 1), (1, 0)])]) == ["%s B A"]

"""Markup carried through translation by word alignment: HTML or XML fragments in, the same markup out.

A fragment is cut into sentences at its block tags (HTML's ``<p>``, ``<li>``, ``<br>``, ...), comments,
``<script>``/``<style>`` content (left untouched) and line breaks; each sentence's inline tags (``<b>``,
``<a href=...>``, ``<x id="1"/>``, and with ``xml`` every tag) are taken out, the plain sentence (entities
decoded) is translated with word alignments, and each tag pair is put back around the target words aligned
to the source words it wrapped (as Bergamot's ``html.cpp`` does), its attributes as written; a void or
self-closing tag goes before the target word aligned to the source word after it.

Whatever the alignment says, the output is well-formed: a tag's target words are clipped to its parent's,
siblings that would cross are made to follow each other, a tag whose words found no target word is put
back empty beside the nearest aligned word; so every tag is closed and properly nested, in the source's
nesting order. Markup that is not well-formed itself (a closing tag that closes nothing, a tag left open)
is a :class:`MarkupError` naming the tag, never a guess.

No torch here.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mtkit.data.word_alignment import word_spans
from mtkit.errors import MtkitError

MARKUPS = ("html", "xml")
_TOKENS = re.compile(r"(<!--.*?-->|<!\[CDATA\[.*?\]\]>|<[!?][^>]*>|</?[A-Za-z_:][^<>]*>)", re.S)
_NAME = re.compile(r"<\s*(/?)\s*([A-Za-z_:][-A-Za-z0-9_:.]*)")
HTML_VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
HTML_BLOCK = frozenset("""address article aside blockquote body br caption dd details dialog div dl dt fieldset
    figcaption figure footer form h1 h2 h3 h4 h5 h6 head header hr html li main nav ol option p pre section summary
    table tbody td tfoot th thead title tr ul""".split())
RAW = frozenset(("script", "style"))


class MarkupError(MtkitError):
    """Markup that is not well-formed: a closing tag without its opening one, or a tag never closed."""


@dataclass
class Tag:
    """An inline tag of a sentence: ``open`` as written, ``close`` as written (None: void or self-closing), and
    the characters ``[start, end)`` of the sentence's plain text it wraps (a void one: ``start == end``)."""

    open: str
    close: str | None
    start: int
    end: int
    children: list[Tag] = field(default_factory=list)
    spaced: bool = False  # a void tag with whitespace on both sides (one space is kept after it)


@dataclass
class Sentence:
    """A sentence to translate: its plain text and its inline tags (a tree, outermost first)."""

    text: str
    tags: list[Tag]


@dataclass
class _Token:
    text: str
    kind: str  # "text", "open", "close", "void", "literal" (comment, declaration, raw content)
    name: str = ""
    pair: int | None = None  # the index of the matching tag


def _tokens(markup: str, kind: str) -> list[_Token]:
    """The fragment as text and tags, each opening tag paired with its closing one; raw content kept whole."""
    tokens: list[_Token] = []
    raw: str | None = None
    for i, part in enumerate(_TOKENS.split(markup)):
        if not part:
            continue
        if i % 2 == 0:
            tokens.append(_Token(part, "literal" if raw else "text"))
            continue
        m = _NAME.match(part)
        if m is None:  # a comment, CDATA, a declaration or a processing instruction
            tokens.append(_Token(part, "literal"))
            continue
        closing, name = m.group(1), m.group(2) if kind == "xml" else m.group(2).lower()
        if raw is not None:
            if closing and name == raw:
                raw = None
                tokens.append(_Token(part, "close", name))
            else:
                tokens.append(_Token(part, "literal"))
            continue
        self_closing = part.rstrip(">").rstrip().endswith("/")
        if closing:
            tokens.append(_Token(part, "close", name))
        elif self_closing or (kind == "html" and name in HTML_VOID):
            tokens.append(_Token(part, "void", name))
        else:
            tokens.append(_Token(part, "open", name))
            if kind == "html" and name in RAW:
                raw = name
    stack: list[int] = []
    for k, token in enumerate(tokens):
        if token.kind == "open":
            stack.append(k)
        elif token.kind == "close":
            if not stack or tokens[stack[-1]].name != token.name:
                expected = f"; <{tokens[stack[-1]].name}> is open" if stack else ""
                raise MarkupError(f"{token.text} closes no open tag{expected}")
            opened = stack.pop()
            token.pair, tokens[opened].pair = opened, k
    if stack:
        raise MarkupError(f"{tokens[stack[-1]].text} is never closed")
    return tokens


def _is_boundary(token: _Token, kind: str, inline: bool) -> bool:
    if token.kind == "literal":
        return True
    if token.kind == "text":
        return False
    return not inline or (kind == "html" and (token.name in HTML_BLOCK or token.name in RAW))


def parse(markup: str, kind: str = "html", inline: bool = True) -> list[str | Sentence]:
    """The fragment as literal strings (block tags, comments, raw content, whitespace) and the
    :class:`Sentence` objects between them, in order: joining the literals with the sentences rebuilt gives
    the fragment back. ``inline`` False: every tag cuts sentences (an engine without alignments: the text
    between tags is translated, as LibreTranslate's own HTML mode does)."""
    if kind not in MARKUPS:
        raise MtkitError(f"unknown markup {kind!r}; expected html or xml")
    tokens = _tokens(markup, kind)
    # a text line break is a boundary: cut text tokens at newlines
    cut: list[_Token] = []
    index: dict[int, int] = {}
    for k, token in enumerate(tokens):
        index[k] = len(cut)
        if token.kind == "text" and "\n" in token.text:
            lines = token.text.split("\n")
            for n, line in enumerate(lines):
                if n:
                    cut.append(_Token("\n", "literal"))
                if line:
                    cut.append(_Token(line, "text"))
        else:
            cut.append(_Token(token.text, token.kind, token.name))
    for k, token in enumerate(tokens):
        if token.pair is not None:
            cut[index[k]].pair = index[token.pair]
    boundary = [_is_boundary(t, kind, inline) for t in cut]
    # an inline pair with a boundary between its tags is a boundary itself (until nothing changes)
    changed = True
    while changed:
        changed = False
        for k, token in enumerate(cut):
            if token.kind == "open" and not boundary[k] and any(boundary[k + 1 : token.pair]):
                boundary[k] = boundary[token.pair] = True
                changed = True
    parts: list[str | Sentence] = []
    run: list[_Token] = []

    def flush() -> None:
        if run:
            parts.extend(_sentence(run))
            run.clear()

    for token, is_boundary in zip(cut, boundary, strict=True):
        if is_boundary:
            flush()
            parts.append(token.text)
        else:
            run.append(token)
    flush()
    return parts


def _sentence(run: list[_Token], escape: bool = True) -> list[str | Sentence]:
    """The literals and sentence of a run of text and inline tags: leading and trailing whitespace (and tags
    around text that is whitespace only) stay literal."""
    text = ""
    roots: list[Tag] = []
    stack: list[Tag] = []
    void: Tag | None = None  # the void tag just read, when whitespace came before it
    for token in run:
        if token.kind == "text":
            plain = html.unescape(token.text) if escape else token.text
            if void is not None and plain[:1].isspace():  # "a <img> b": the sentence reads "a b"
                void.spaced, plain = True, plain.lstrip()
            text += plain
        elif token.kind == "close":
            opened = stack.pop()
            opened.close, opened.end = token.text, len(text)
        else:
            tag = Tag(token.text, None, len(text), len(text))
            (stack[-1].children if stack else roots).append(tag)
            if token.kind == "open":
                stack.append(tag)
        void = tag if token.kind == "void" and text[-1:].isspace() else None
    if not text.strip():
        return ["".join(t.text for t in run)]  # as written (escaped already in markup)
    lead = len(text) - len(text.lstrip())
    body = text.strip()

    def shift(tags: list[Tag]) -> None:
        for tag in tags:
            tag.start = min(max(tag.start - lead, 0), len(body))
            tag.end = min(max(tag.end - lead, 0), len(body))
            shift(tag.children)

    shift(roots)
    outside = (lambda x: html.escape(x, quote=False)) if escape else (lambda x: x)
    return [outside(text[:lead]), Sentence(body, roots), outside(text[lead + len(body):])]


# ------------------------------------------------------------------ putting tags back


@dataclass
class _Placed:
    tag: Tag
    lo: int  # target words lo..hi (inclusive); lo > hi: empty, placed before word lo
    hi: int
    order: int
    children: list[_Placed] = field(default_factory=list)


def place(sentence: Sentence, translation: str, alignment: Sequence[tuple[int, int]], escape: bool = True) -> str:
    """``translation`` (plain text) with ``sentence``'s tags put back by ``alignment`` ((source word, target
    word) pairs), escaped (``escape`` False: as it is, for placeholders in plain text): well-formed whatever
    the alignment (module docstring)."""
    words = word_spans(sentence.text)
    out_words = word_spans(translation)
    n = len(out_words)
    targets: dict[int, list[int]] = {}
    for s, t in alignment:
        if 0 <= t < n:
            targets.setdefault(s, []).append(t)
    counter = iter(range(1 << 30))

    def covered(tag: Tag) -> list[int]:
        if tag.close is None or tag.start == tag.end:
            return []
        return [k for k, (b, e) in enumerate(words) if b < tag.end and e > tag.start]

    def anchor(tag: Tag) -> int:
        """Where a tag without target words goes: before the first target word of the nearest source word after
        it that has one, else after the last of the nearest before it, else at the end."""
        after = [k for k, (b, _) in enumerate(words) if b >= tag.start]
        before = [k for k, (_, e) in enumerate(words) if e <= tag.start]
        for k in after:
            if targets.get(k):
                return min(targets[k])
        for k in reversed(before):
            if targets.get(k):
                return max(targets[k]) + 1
        return n

    def build(tag: Tag) -> _Placed:
        found = [t for k in covered(tag) for t in targets.get(k, [])]
        lo, hi = (min(found), max(found)) if found else (anchor(tag), anchor(tag) - 1)
        return _Placed(tag, lo, hi, next(counter), [build(c) for c in tag.children])

    root = _Placed(Tag("", "", 0, 0), 0, n - 1, -1, [build(t) for t in sentence.tags])
    _fit(root)
    return _render(root, translation, out_words, escape)


def _fit(parent: _Placed) -> None:
    """Clip each child to ``parent``'s words, make crossing siblings follow each other, and put empty ones
    where no sibling holds them; then the same below."""
    plo, phi = parent.lo, parent.hi

    def empty(child: _Placed, at: int) -> None:
        child.lo = min(max(at, plo), phi + 1)
        child.hi = child.lo - 1

    for child in parent.children:
        lo, hi = max(child.lo, plo), min(child.hi, phi)
        if child.lo <= child.hi and lo <= hi:
            child.lo, child.hi = lo, hi
        else:
            empty(child, child.lo)
    cursor = plo - 1
    full = sorted((c for c in parent.children if c.lo <= c.hi), key=lambda c: (c.lo, c.order))
    for child in full:
        if child.lo <= cursor:
            child.lo = cursor + 1
            if child.lo > child.hi:
                empty(child, child.lo)
                continue
        cursor = child.hi
    spans = [(c.lo, c.hi) for c in parent.children if c.lo <= c.hi]
    for child in parent.children:
        if child.lo > child.hi:  # an empty or void one: never inside a sibling's words
            for lo, hi in spans:
                if lo < child.lo <= hi:
                    child.lo = hi + 1
            child.hi = child.lo - 1
    for child in parent.children:
        _fit(child)


def _render(root: _Placed, translation: str, words: list[tuple[int, int]], escape: bool) -> str:
    def escaped(a: int, b: int) -> str:
        return html.escape(translation[a:b], quote=False) if escape else translation[a:b]

    def render(node: _Placed) -> str:
        """The node's words from ``node.lo`` to ``node.hi`` with its children's tags, each word followed by the
        space after it except the last."""
        out = []
        children = sorted(node.children, key=lambda c: (c.lo, c.lo <= c.hi, c.order))
        k, w = 0, node.lo
        while w <= node.hi or k < len(children):
            child = children[k] if k < len(children) else None
            if child is not None and child.lo == w:
                k += 1
                if child.lo > child.hi:  # empty: its own children (empty too) inside it
                    spaced = child.tag.spaced and w <= node.hi
                    out.append(child.tag.open + render(child) + (child.tag.close or "") + (" " if spaced else ""))
                    continue
                out.append(child.tag.open + render(child) + (child.tag.close or ""))
                w = child.hi + 1
                if w <= node.hi:
                    out.append(escaped(words[w - 1][1], words[w][0]))
                continue
            if w > node.hi:  # children left past the last word (empty ones at the end)
                out.extend(c.tag.open + render(c) + (c.tag.close or "") for c in children[k:])
                break
            out.append(escaped(*words[w]))
            if w < node.hi:
                out.append(escaped(words[w][1], words[w + 1][0]))
            w += 1
        return "".join(out)

    if not words:
        return render(root) + escaped(0, len(translation))
    before = escaped(0, words[0][0])
    after = escaped(words[-1][1], len(translation))
    return before + render(root) + after


def split_protected(line: str, pattern: re.Pattern) -> tuple[list[str], Callable[[Sequence[tuple[str, Sequence[tuple[
        int, int]]]]], str]]:
    """Placeholders in plain text (``--protect``: ``{name}``, ``%s``, ``<x id="1"/>``): each match of ``pattern``
    taken out of ``line`` as a void tag, put back by the alignment, nothing escaped; as :func:`split_markup`."""
    tokens = []
    at = 0
    for m in pattern.finditer(line):
        if m.end() == m.start():
            continue
        tokens.append(_Token(line[at : m.start()], "text"))
        tokens.append(_Token(m.group(0), "void"))
        at = m.end()
    tokens.append(_Token(line[at:], "text"))
    run = [t for t in tokens if t.text]
    if not any(t.kind == "void" for t in run):  # nothing to protect: the line as it is
        return ([line] if line.strip() else []), lambda found: found[0][0] if found else line
    if not "".join(t.text for t in run if t.kind == "text").strip():  # placeholders alone: nothing to translate
        return [], lambda found: line
    parts = _sentence(run, escape=False)

    def rebuild(translations: Sequence[tuple[str, Sequence[tuple[int, int]]]]) -> str:
        (text, alignment), = translations
        return "".join(place(p, text, alignment, escape=False) if isinstance(p, Sentence) else p for p in parts)

    return [next(p.text for p in parts if isinstance(p, Sentence))], rebuild


def split_markup(fragment: str, kind: str = "html", inline: bool = True
                 ) -> tuple[list[str], Callable[[Sequence[tuple[str, Sequence[tuple[int, int]]]]], str]]:
    """The plain sentences of ``fragment`` to translate, and a function that rebuilds the fragment from their
    translations, each (text, word alignment); :class:`MarkupError` for markup that is not well-formed."""
    parts = parse(fragment, kind, inline)
    sentences = [p for p in parts if isinstance(p, Sentence)]

    def rebuild(translations: Sequence[tuple[str, Sequence[tuple[int, int]]]]) -> str:
        found = iter(translations)
        return "".join(place(p, *next(found)) if isinstance(p, Sentence) else p for p in parts)

    return [s.text for s in sentences], rebuild


def translate_markup(fragments: Sequence[str], kind: str,
                     translate: Callable[[list[str]], list[tuple[str, Sequence[tuple[int, int]]]]],
                     inline: bool = True) -> list[str]:
    """Each fragment translated with its markup carried over: ``translate`` takes the plain sentences of all
    fragments and gives each one's translation and word alignment."""
    return translate_split([split_markup(fragment, kind, inline) for fragment in fragments], translate)


def protect_lines(lines: Sequence[str], pattern: re.Pattern,
                  translate: Callable[[list[str]], list[tuple[str, Sequence[tuple[int, int]]]]]) -> list[str]:
    """Each plain-text line translated with the matches of ``pattern`` carried over (:func:`split_protected`)."""
    return translate_split([split_protected(line, pattern) for line in lines], translate)


def translate_split(split: list, translate) -> list[str]:
    """Items split by :func:`split_markup` or :func:`split_protected`: every item's sentences translated in one call,
    each item rebuilt from its own."""
    sentences = [s for found, _ in split for s in found]
    results = translate(sentences) if sentences else []
    out, at = [], 0
    for found, rebuild in split:
        out.append(rebuild(results[at : at + len(found)]))
        at += len(found)
    return out

"""Markup carried through translation by word alignment: HTML or XML fragments in, the same markup out.

A fragment is cut into sentences at its block tags (HTML's ``<p>``, ``<li>``, ``<br>``, ...), comments,
``<script>``/``<style>`` content (left untouched) and line breaks; each sentence's inline tags (``<b>``,
``<a href=...>``, ``<x id="1"/>``, and with ``xml`` every tag) are taken out, the plain sentence (entities
decoded) is translated with word alignments, and each tag pair is put back around the target words aligned
to the source words it wrapped (as Bergamot's ``html.cpp`` does), its attributes as written (``<``, ``>`` and
a bare ``&`` in a quoted value escaped, so that the tag reads back as one); a void or self-closing tag goes
before the target word aligned to the source word after it (one before a sentence's first word or after its
last stays there).

Tags go around the aligned words only: a tag whose text neither begins nor ends with punctuation leaves the
punctuation of its target words' edges outside (``<b>more</b>.`` -> ``<b>mehr</b>.``, not ``<b>mehr.</b>``),
and a target word at its edge is left out when it belongs beside it: aligned to a source word outside the tag
too, or the article of an unaligned source word beside the tag that the alignment gave to the tag's word
(``A <b>dog</b>`` -> ``Ein <b>Hund</b>``, not ``<b>Ein Hund</b>``).

With ``html``, what the web marks not to translate (``translate="no"``, a ``notranslate`` class, ``<code>``,
``<pre>``, ``<kbd>``, ``<samp>``, ``<var>``, ``<script>``, ``<style>``) is carried as written: in a block's place
it is a literal, inside a sentence one unit placed as a void tag is, its content never translated.
:func:`blocks` reads a whole document (a page, not a fragment) into the runs of text to translate.

Whatever the alignment says, the output is well-formed: a tag's target words are clipped to its parent's,
siblings that would cross are made to follow each other, a tag whose words found no target word is put
back empty beside the nearest aligned word; so every tag is closed and properly nested, in the source's
nesting order. Markup that is not well-formed itself (a closing tag that closes nothing, a tag left open)
is a :class:`MarkupError` naming the tag, never a guess.

A stranger's fragment costs work about linear in its size, however deep its tags nest: it is read left to
right once (a search that found nothing is not repeated), the tag tree is walked with explicit stacks (no
recursion), and a tag's target words come from range queries over the alignment (O(log n) each), never from
scanning the sentence per tag.

Placeholders in plain text (``--protect``: :func:`split_protected`) are matched by a user's regular
expression, run through the ``regex`` module with a time limit per line, and put back spaced as in the
source.

No torch here.
"""

from __future__ import annotations

import html
import re
import secrets
import time
import unicodedata
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from mtkit.data.word_alignment import word_spans
from mtkit.errors import MtkitError, shown

MARKUPS = ("html", "xml")
PROTECT_TIMEOUT = 1.0  # seconds a --protect pattern may take on one line (placeholders take microseconds)
_NAME = re.compile(r"</?([A-Za-z_:][-A-Za-z0-9_:.]*)")
_IN_TAG = re.compile(r"[^<>=]*")  # a tag's characters up to its end, a '<' (then it is no tag) or an '='
_SPACES = re.compile(r"\s*")
_UNSAFE = re.compile(r"[<>]|&(?!(?:[A-Za-z][A-Za-z0-9]*|#[0-9]+|#[xX][0-9A-Fa-f]+);)")  # in a quoted value
_ESCAPED = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}
HTML_VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
HTML_BLOCK = frozenset("""address article aside blockquote body br caption dd details dialog div dl dt fieldset
    figcaption figure footer form h1 h2 h3 h4 h5 h6 head header hr html li main nav ol option p pre section summary
    table tbody td tfoot th thead title tr ul""".split())
RAW = frozenset(("script", "style"))
# what the web marks not to translate, besides translate="no" and class="notranslate" (code, keyboard input, a
# program's output, a variable's name; a preformatted block is code or ASCII art): carried as written
KEPT = frozenset("code kbd pre samp script style var".split())
_ATTRIBUTE = re.compile(r"""\s*([^\s=/>"']+)(?:\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>"']+)))?""")


class MarkupError(MtkitError):
    """Markup that is not well-formed: a closing tag without its opening one, or a tag never closed."""


def _shown_tag(text: str) -> str:
    """A tag as an error message names it: as written, or quoted and shortened (reprlib) when long."""
    return text if len(text) <= 60 else shown(text)


@dataclass
class Tag:
    """An inline tag of a sentence: ``open`` as written, ``close`` as written (None: void or self-closing), and
    the characters ``[start, end)`` of the sentence's plain text it wraps (a void one: ``start == end``)."""

    open: str
    close: str | None
    start: int
    end: int
    children: list[Tag] = field(default_factory=list)
    spaced: bool = False  # a void tag with whitespace (or the sentence's start) before it and whitespace after


@dataclass
class Sentence:
    """A sentence to translate: its plain text and its inline tags (a tree, outermost first)."""

    text: str
    tags: list[Tag]


@dataclass
class _Token:
    text: str
    kind: str  # "text", "open", "close", "void", "literal" (comment, declaration, raw content), "kept"
    name: str = ""
    pair: int | None = None  # the index of the matching tag
    at: int = 0  # where it begins in the markup
    block: bool = False  # a kept element that holds a block tag (then it cuts sentences as a block does)


class _Finder:
    """``str.find`` on one text that remembers each needle's last answer: a search that found nothing from a
    position finds nothing from any later one, and a later search that starts before the last match finds it
    again, so that reading left to right searches each character about once per needle."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._last: dict[str, tuple[int, int]] = {}

    def find(self, needle: str, at: int) -> int:
        since, found = self._last.get(needle, (len(self.text) + 1, -1))
        if since <= at and (found < 0 or found >= at):
            return found
        found = self.text.find(needle, at)
        self._last[needle] = (at, found)
        return found


def _tag_at(markup: str, at: int, finder: _Finder) -> tuple[int, str | None]:
    """The tag whose name starts at ``markup[at]`` (``<`` or ``</``): ``(its end, the tag as written with its
    quoted values escaped)``, or ``(where it stops, None)`` when an unquoted ``<`` or the end comes first (then
    it is text up to there). A quote after ``=`` holds anything up to the same quote (``>`` and ``<`` too); a
    quote without its closing one is an ordinary character."""
    p = _NAME.match(markup, at).end()
    values: list[tuple[int, int]] = []
    while True:
        p = _IN_TAG.match(markup, p).end()
        c = markup[p : p + 1]
        if c == ">":
            break
        if c != "=":  # "<" or the end
            return p, None
        q = _SPACES.match(markup, p + 1).end()
        quote = markup[q : q + 1]
        close = finder.find(quote, q + 1) if quote in ('"', "'") else -1
        if close < 0:
            p += 1
            continue
        values.append((q + 1, close))
        p = close + 1
    pieces, done = [], at
    for begin, end in values:
        pieces.append(markup[done:begin])
        pieces.append(_UNSAFE.sub(lambda m: _ESCAPED[m.group(0)], markup[begin:end]))
        done = end
    pieces.append(markup[done : p + 1])
    return p + 1, "".join(pieces)


def _scan(markup: str, kind: str) -> list[_Token]:
    """The fragment as text and tags, not yet paired; raw content kept whole. One pass from left to right: work
    linear in the fragment's length."""
    tokens: list[_Token] = []
    finder = _Finder(markup)
    at = done = 0  # where to look for the next "<"; where the text not yet taken begins

    def take(start: int, end: int, kind_: str, name: str = "", text: str | None = None) -> None:
        """The text before ``start``, then ``markup[start:end]`` (or ``text``) as a token of ``kind_``."""
        nonlocal at, done
        if start > done:
            tokens.append(_Token(markup[done:start], "text", at=done))
        tokens.append(_Token(markup[start:end] if text is None else text, kind_, name, at=start))
        at = done = end

    while (lt := finder.find("<", at)) >= 0:
        if markup.startswith("<!--", lt) and (close := finder.find("-->", lt + 4)) >= 0:
            take(lt, close + 3, "literal")
        elif markup.startswith("<![CDATA[", lt) and (close := finder.find("]]>", lt + 9)) >= 0:
            take(lt, close + 3, "literal")
        elif markup[lt + 1 : lt + 2] in ("!", "?") and (close := finder.find(">", lt + 2)) >= 0:
            take(lt, close + 1, "literal")  # a declaration or a processing instruction
        elif (m := _NAME.match(markup, lt)) is not None:
            end, written = _tag_at(markup, lt, finder)
            if written is None:  # text up to where it stopped: a "<" inside it began no tag
                at = end
                continue
            name = m.group(1) if kind == "xml" else m.group(1).lower()
            if markup[lt + 1] == "/":
                take(lt, end, "close", name, written)
            elif written[:-1].rstrip().endswith("/") or (kind == "html" and name in HTML_VOID):
                take(lt, end, "void", name, written)
            else:
                take(lt, end, "open", name, written)
                if kind == "html" and name in RAW:  # its content up to its closing tag, untouched
                    found = re.compile(rf"</{re.escape(name)}(?![-A-Za-z0-9_:.])[^<>]*>", re.I).search(markup, end)
                    if found is None:
                        raise MarkupError(f"{_shown_tag(written)} is never closed")
                    if found.start() > end:
                        take(end, found.start(), "literal")
                    take(found.start(), found.end(), "close", name)
        else:
            at = lt + 1
    if done < len(markup):
        tokens.append(_Token(markup[done:], "text", at=done))
    return tokens


def _pair(tokens: list[_Token]) -> None:
    """Pair each opening tag with its closing one; :class:`MarkupError` for one without the other."""
    stack: list[int] = []
    for k, token in enumerate(tokens):
        if token.kind == "open":
            stack.append(k)
        elif token.kind == "close":
            if not stack or tokens[stack[-1]].name != token.name:
                expected = f"; <{_shown_tag(tokens[stack[-1]].name)}> is open" if stack else ""
                raise MarkupError(f"{_shown_tag(token.text)} closes no open tag{expected}")
            opened = stack.pop()
            token.pair, tokens[opened].pair = opened, k
    if stack:
        raise MarkupError(f"{_shown_tag(tokens[stack[-1]].text)} is never closed")


def _attributes(written: str) -> dict[str, str]:
    """An opening tag's attributes (names lowercased, values as written less their quotes)."""
    found = {}
    for m in _ATTRIBUTE.finditer(written, _NAME.match(written).end()):
        value = next((v for v in m.group(2, 3, 4) if v is not None), "")
        found.setdefault(m.group(1).lower(), value)
    return found


def _is_kept(token: _Token) -> bool:
    """Whether an HTML element is one the web marks not to translate: code and its kin, ``translate="no"``, a
    ``notranslate`` class (as browsers' and online translators' page translation read them)."""
    if token.name in KEPT:
        return True
    if "translate" not in token.text.lower():  # the common case, without reading the attributes
        return False
    attributes = _attributes(token.text)
    return (attributes.get("translate", "").strip().lower() == "no"
            or "notranslate" in attributes.get("class", "").split())


def _keep(markup: str, tokens: list[_Token]) -> list[_Token]:
    """``tokens`` with each element not to translate (:func:`_is_kept`, paired) as one ``kept`` token of its
    markup as written, and the pairs renumbered; an element inside a kept one is part of it. Linear: each token
    is looked at once."""
    out: list[_Token] = []
    moved = [0] * len(tokens)  # each token's index in ``out`` (those inside a kept element: unused)
    k = 0
    while k < len(tokens):
        token = tokens[k]
        moved[k] = len(out)
        if token.kind == "open" and token.pair is not None and _is_kept(token):
            end = tokens[token.pair + 1].at if token.pair + 1 < len(tokens) else len(markup)
            inside = tokens[k + 1 : token.pair]
            block = token.name in HTML_BLOCK or token.name in RAW or any(t.name in HTML_BLOCK for t in inside)
            out.append(_Token(markup[token.at : end], "kept", token.name, at=token.at, block=block))
            k = token.pair + 1
            continue
        out.append(token)
        k += 1
    for token in out:
        if token.pair is not None:
            token.pair = moved[token.pair]
    return out


def _tokens(markup: str, kind: str) -> list[_Token]:
    """The fragment as text and tags, each opening tag paired with its closing one; raw content, and with
    ``html`` each element not to translate, kept whole."""
    tokens = _scan(markup, kind)
    _pair(tokens)
    return _keep(markup, tokens) if kind == "html" else tokens


def _is_boundary(token: _Token, kind: str, inline: bool) -> bool:
    if token.kind == "literal":
        return True
    if token.kind == "text":
        return False
    if token.kind == "kept":
        return token.block or not inline
    if token.kind in ("open", "close") and token.pair is None:  # a document's tag left open (blocks())
        return True
    return not inline or (kind == "html" and (token.name in HTML_BLOCK or token.name in RAW))


def _boundaries(cut: list[_Token], kind: str, inline: bool) -> list[bool]:
    """Which tokens cut sentences: block tags, comments, raw content, and an inline pair with a boundary between
    its tags (it holds the boundary that marked it, and so does every pair around it: counting the first
    boundaries is enough)."""
    boundary = [_is_boundary(t, kind, inline) for t in cut]
    before = list(accumulate(boundary, initial=0))  # before[k]: boundaries among cut[:k]
    marked = [k for k, token in enumerate(cut)
              if token.kind == "open" and not boundary[k] and before[token.pair] > before[k + 1]]
    for k in marked:
        boundary[k] = boundary[cut[k].pair] = True
    return boundary


def parse(markup: str, kind: str = "html", inline: bool = True) -> list[str | Sentence]:
    """The fragment as literal strings (block tags, comments, raw content, elements not to translate in a block's
    place, whitespace) and the :class:`Sentence` objects between them, in order: joining the literals with the
    sentences rebuilt gives the fragment back. ``inline`` False: every tag cuts sentences (an engine without
    alignments: the text between tags is translated, as LibreTranslate's own HTML mode does)."""
    if kind not in MARKUPS:
        raise MtkitError(f"unknown markup {kind!r}; expected html or xml")
    tokens = _tokens(markup, kind)
    # a text line break is a boundary: cut text tokens at newlines
    cut: list[_Token] = []
    index: list[int] = []
    for token in tokens:
        index.append(len(cut))
        if token.kind == "text" and "\n" in token.text:
            for n, line in enumerate(token.text.split("\n")):
                if n:
                    cut.append(_Token("\n", "literal"))
                if line:
                    cut.append(_Token(line, "text"))
        else:
            cut.append(_Token(token.text, token.kind, token.name, block=token.block))
    for k, token in enumerate(tokens):
        if token.pair is not None:
            cut[index[k]].pair = index[token.pair]
    boundary = _boundaries(cut, kind, inline)
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


def _walk(tags: list[Tag]) -> Iterator[Tag]:
    """Every tag of the trees ``tags``, parents before their children (an explicit stack: any depth)."""
    stack = list(reversed(tags))
    while stack:
        tag = stack.pop()
        yield tag
        stack.extend(reversed(tag.children))


def _sentence(run: list[_Token], escape: bool = True) -> list[str | Sentence]:
    """The literals and sentence of a run of text and inline tags: leading and trailing whitespace (and tags
    around text that is whitespace only) stay literal, and so do void tags and kept elements before its first
    word or after its last (``<img> A dog.``, ``Run it. <img>``): they stay at the start or the end."""
    def blank(token: _Token) -> bool:
        return not (html.unescape(token.text) if escape else token.text).strip()

    worded = [k for k, token in enumerate(run) if token.kind == "text" and not blank(token)]
    if not worded:
        return ["".join(t.text for t in run)]  # as written (escaped already in markup)
    loose = ("void", "kept", "text")
    head = worded[0] if all(t.kind in loose for t in run[: worded[0]]) else 0
    tail = worded[-1] + 1 if all(t.kind in loose for t in run[worded[-1] + 1 :]) else len(run)
    found = _words(run[head:tail], escape)
    found[0] = "".join(t.text for t in run[:head]) + found[0]
    found[-1] += "".join(t.text for t in run[tail:])
    return found


def _words(run: list[_Token], escape: bool) -> list[str | Sentence]:
    """The literals and sentence of a run that begins and ends with text (:func:`_sentence`)."""
    pieces: list[str] = []
    length = 0
    ends_in_space = False
    roots: list[Tag] = []
    stack: list[Tag] = []
    void: Tag | None = None  # the void tag just read, when whitespace (or nothing) came before it
    for token in run:
        tag = None
        if token.kind == "text":
            plain = html.unescape(token.text) if escape else token.text
            if void is not None and plain[:1].isspace():  # "a <img> b": the sentence reads "a b"
                void.spaced, plain = True, plain.lstrip()
            if plain:
                pieces.append(plain)
                length += len(plain)
                ends_in_space = plain[-1].isspace()
        elif token.kind == "close":
            opened = stack.pop()
            opened.close, opened.end = token.text, length
        else:
            tag = Tag(token.text, None, length, length)
            (stack[-1].children if stack else roots).append(tag)
            if token.kind == "open":
                stack.append(tag)
        void = tag if token.kind in ("void", "kept") and (ends_in_space or not length) else None
    text = "".join(pieces)
    if not text.strip():
        return ["".join(t.text for t in run)]  # as written (escaped already in markup)
    lead = len(text) - len(text.lstrip())
    body = text.strip()
    for tag in _walk(roots):
        tag.start = min(max(tag.start - lead, 0), len(body))
        tag.end = min(max(tag.end - lead, 0), len(body))
    outside = (lambda x: html.escape(x, quote=False)) if escape else (lambda x: x)
    return [outside(text[:lead]), Sentence(body, roots), outside(text[lead + len(body):])]


# ------------------------------------------------------------------ putting tags back


class _Ranges:
    """Minimum and maximum of a list's ranges in O(1) (sparse tables, built in O(n log n))."""

    def __init__(self, low: list[int], high: list[int]) -> None:
        self.low, self.high = [low], [high]
        span = 1
        while 2 * span <= len(low):
            a, b = self.low[-1], self.high[-1]
            self.low.append([min(a[i], a[i + span]) for i in range(len(a) - span)])
            self.high.append([max(b[i], b[i + span]) for i in range(len(b) - span)])
            span *= 2

    def query(self, first: int, last: int) -> tuple[int, int]:
        """(min of ``low``, max of ``high``) over ``first..last`` (inclusive, not empty)."""
        level = (last - first + 1).bit_length() - 1
        other = last - (1 << level) + 1
        low, high = self.low[level], self.high[level]
        return min(low[first], low[other]), max(high[first], high[other])


class _Links:
    """A sentence's word alignment, looked up without scanning the sentence: the target words of the source
    words in a range of characters, and the target position beside the nearest aligned source word."""

    def __init__(self, text: str, alignment: Sequence[tuple[int, int]], n: int) -> None:
        words = word_spans(text)
        self.text, self.n = text, n
        self.begins = [b for b, _ in words]
        self.ends = [e for _, e in words]
        low, high = [n] * len(words), [-1] * len(words)
        source_low, source_high = [len(words)] * n, [-1] * n  # each target word's aligned source words
        for s, t in alignment:
            if 0 <= s < len(words) and 0 <= t < n:
                low[s], high[s] = min(low[s], t), max(high[s], t)
                source_low[t], source_high[t] = min(source_low[t], s), max(source_high[t], s)
        self.low, self.high = low, high
        self.source_low, self.source_high = source_low, source_high
        self._ranges: _Ranges | None = None  # built on the first range asked (a sentence without tags asks none)
        self.next = [len(words)] * (len(words) + 1)  # the first aligned source word at or after each
        for k in range(len(words) - 1, -1, -1):
            self.next[k] = k if high[k] >= 0 else self.next[k + 1]
        self.previous = [-1] * len(words)  # the last aligned source word at or before each
        for k in range(len(words)):
            self.previous[k] = k if high[k] >= 0 else self.previous[k - 1] if k else -1

    def covered(self, start: int, end: int) -> tuple[int, int] | None:
        """The first and last target word aligned to the source words that overlap characters ``[start, end)``,
        or None. A target word at either end is left out when another word remains and it belongs beside them
        rather than to them: it is aligned to a source word outside them too (an article a soft alignment gave
        to its noun and its own word), or the source word beside them on its side found no target word while
        its own source word has another (a hard alignment gave "Ein" and "Hund" to "dog" in "A <b>dog</b>" ->
        "Ein Hund": "Ein" is the unaligned "A")."""
        first, last = bisect_right(self.ends, start), bisect_left(self.begins, end) - 1
        if first > last:
            return None
        if self._ranges is None:
            self._ranges = _Ranges(self.low, self.high)
        low, high = self._ranges.query(first, last)
        if high < 0:
            return None
        if low < high and (self.source_low[low] < first or self.source_high[low] > last
                           or (first > 0 and self.high[first - 1] < 0 and self._shared(low))):
            low += 1
        if low < high and (self.source_low[high] < first or self.source_high[high] > last
                           or (last + 1 < len(self.high) and self.high[last + 1] < 0 and self._shared(high))):
            high -= 1
        return low, high

    def _shared(self, t: int) -> bool:
        """Whether target word ``t``'s source word has other target words too (as "dog" has "Ein" and "Hund")."""
        s = self.source_low[t]
        return self.low[s] < self.high[s]

    def punctuated(self, start: int, end: int) -> tuple[bool, bool]:
        """Whether the text of characters ``[start, end)`` begins, and whether it ends, with punctuation (its
        first and last characters that are not whitespace)."""
        first, last = bisect_right(self.ends, start), bisect_left(self.begins, end) - 1
        if first > last:
            return True, True
        return (_is_punctuation(self.text[max(start, self.begins[first])]),
                _is_punctuation(self.text[min(end, self.ends[last]) - 1]))

    def after(self, at: int) -> int | None:
        """Before the first target word of the nearest aligned source word at or after character ``at``."""
        k = self.next[bisect_left(self.begins, at)]
        return self.low[k] if k < len(self.low) else None

    def before(self, at: int) -> int | None:
        """After the last target word of the nearest aligned source word that ends at or before ``at``."""
        k = bisect_right(self.ends, at) - 1
        k = self.previous[k] if k >= 0 else -1
        return self.high[k] + 1 if k >= 0 else None


def _is_punctuation(ch: str) -> bool:
    return unicodedata.category(ch).startswith("P")


class _Punctuation:
    """How many punctuation characters begin and end each word of a translation (each word read once)."""

    def __init__(self, text: str, words: list[tuple[int, int]]) -> None:
        self.text, self.words = text, words
        self._found: dict[int, tuple[int, int]] = {}

    def __call__(self, w: int) -> tuple[int, int]:
        if w not in self._found:
            begin, end = self.words[w]
            lead = begin
            while lead < end and _is_punctuation(self.text[lead]):
                lead += 1
            tail = end
            while tail > lead and _is_punctuation(self.text[tail - 1]):
                tail -= 1
            self._found[w] = (lead - begin, end - tail)
        return self._found[w]


@dataclass
class _Placed:
    tag: Tag
    lo: int  # target words lo..hi (inclusive); lo > hi: empty, placed before word lo
    hi: int
    order: int  # its place among its siblings
    children: list[_Placed] = field(default_factory=list)
    bare: tuple[bool, bool] = (False, False)  # its first / last target word's outer punctuation left outside it
    begin: int = 0  # the characters of the translation it wraps (empty: where it goes), set last
    end: int = 0


def place(sentence: Sentence, translation: str, alignment: Sequence[tuple[int, int]], escape: bool = True) -> str:
    """``translation`` (plain text) with ``sentence``'s tags put back by ``alignment`` ((source word, target
    word) pairs), escaped (``escape`` False: as it is): well-formed whatever the alignment (module docstring).
    A tag around words that neither begin nor end with punctuation (``<b>more</b>.``) leaves the punctuation
    that begins or ends its target words outside it too (``<b>mehr</b>.``), not only the words beside them."""
    out_words = word_spans(translation)
    n = len(out_words)
    links = _Links(sentence.text, alignment, n)
    root = _Placed(Tag("", "", 0, 0), 0, n - 1, -1)
    root.begin, root.end = (out_words[0][0], out_words[-1][1]) if n else (0, 0)
    stack = [(root, sentence.tags)]
    while stack:
        parent, tags = stack.pop()
        for order, tag in enumerate(tags):
            found = links.covered(tag.start, tag.end) if tag.close is not None and tag.start < tag.end else None
            bare = (False, False)
            if found is None:  # where a tag without target words goes: beside the nearest aligned word
                at = links.after(tag.start)
                at = links.before(tag.start) if at is None else at
                at = n if at is None else at
                found = (at, at - 1)
            else:
                lead, tail = links.punctuated(tag.start, tag.end)
                bare = (not lead, not tail)
            placed = _Placed(tag, found[0], found[1], order, bare=bare)
            parent.children.append(placed)
            stack.append((placed, tag.children))
    punctuation = _Punctuation(translation, out_words)
    stack = [root]
    while stack:  # parents before children: a child is clipped to its parent's final words and characters
        parent = stack.pop()
        _fit(parent)
        for child in parent.children:
            _characters(child, parent, out_words, punctuation)
        stack.extend(parent.children)
    return _render(root, translation, escape)


def _characters(child: _Placed, parent: _Placed, words: list[tuple[int, int]], punctuation: _Punctuation) -> None:
    """The characters ``child`` wraps (or, empty, where it goes), within its parent's."""
    if child.lo > child.hi:
        begin = end = words[child.lo][0] if child.lo <= parent.hi else parent.end
    else:
        begin, end = words[child.lo][0], words[child.hi][1]
        if child.bare[0]:
            lead = punctuation(child.lo)[0]
            if begin + lead < words[child.lo][1]:
                begin += lead
        if child.bare[1]:
            tail = punctuation(child.hi)[1]
            if end - tail > begin:
                end -= tail
    child.begin = min(max(begin, parent.begin), parent.end)
    child.end = min(max(end, child.begin), parent.end)


def _fit(parent: _Placed) -> None:
    """Clip each child to ``parent``'s words, make crossing siblings follow each other, and put empty ones
    where no sibling holds them."""
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
    spans = [(c.lo, c.hi) for c in full if c.lo <= c.hi]  # disjoint now, in order
    starts = [lo for lo, _ in spans]
    for child in parent.children:
        if child.lo > child.hi:  # an empty or void one: never inside a sibling's words
            k = bisect_left(starts, child.lo) - 1
            if k >= 0 and child.lo <= spans[k][1]:
                child.lo = spans[k][1] + 1
            child.hi = child.lo - 1


def _render(root: _Placed, translation: str, escape: bool) -> str:
    """The translation with the placed tags, written through one list (an explicit stack: any depth)."""
    def escaped(a: int, b: int) -> str:
        return html.escape(translation[a:b], quote=False) if escape else translation[a:b]

    def body(node: _Placed) -> list[str | _Placed]:
        """The node's characters with its children (each as its open tag, itself and its close tag) in place;
        an empty child spaced in the source (``a <img> b``) is followed by a space when words follow it."""
        out: list[str | _Placed] = []
        at = node.begin
        for child in sorted(node.children, key=lambda c: (c.begin, c.lo <= c.hi, c.order)):
            out += [escaped(at, child.begin), child.tag.open, child, child.tag.close or ""]
            at = child.end
            if child.lo > child.hi and child.tag.spaced and child.lo <= node.hi and (
                    child.begin == 0 or translation[child.begin - 1].isspace()):  # (never inside a word)
                out.append(" ")
        out.append(escaped(at, node.end))
        return out

    out = [escaped(0, root.begin)]
    todo: list[str | _Placed] = [root]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            out.append(item)
        else:
            todo.extend(reversed(body(item)))
    out.append(escaped(root.end, len(translation)))
    return "".join(out)


# ------------------------------------------------------------------ placeholders in plain text


def _matches(line: str, pattern, timeout: float) -> Iterator[tuple[int, int]]:
    """The spans of ``pattern``'s non-empty matches in ``line``, all of them within ``timeout`` seconds (the
    ``regex`` module's time limit, given what is left of it at each search): a pattern that backtracks without
    end raises TimeoutError instead of running on."""
    deadline = time.monotonic() + timeout
    at = 0
    while at <= len(line):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("regex timed out")
        m = pattern.search(line, at, timeout=left)
        if m is None:
            return
        if m.end() == m.start():
            at = m.end() + 1
            continue
        yield m.start(), m.end()
        at = m.end()


@dataclass
class _Placeholders:
    """Placeholders side by side in a line (nothing but whitespace between them), as written; ``at``: the
    character of the sentence they stood before; ``glued_left``/``glued_right``: no whitespace between them and
    the text before / after them in the line."""

    text: str
    at: int
    glued_left: bool
    glued_right: bool


def split_protected(line: str, pattern, timeout: float = PROTECT_TIMEOUT) -> tuple[list[str], Callable[[Sequence[
        tuple[str, Sequence[tuple[int, int]]]]], str]]:
    """Placeholders in plain text (``--protect``: ``{name}``, ``%s``, ``<x id="1"/>``): the matches of
    ``pattern`` (a ``regex`` pattern, run within ``timeout`` seconds: else TimeoutError) are taken out of
    ``line``, the rest translated, and each put back as :func:`place_placeholders` says; as
    :func:`split_markup`."""
    spans = list(_matches(line, pattern, timeout))
    if not spans:  # nothing to protect: the line as it is
        return ([line] if line.strip() else []), lambda found: found[0][0] if found else line
    groups: list[list[int]] = []
    for begin, end in spans:
        if groups and not line[groups[-1][1] : begin].strip():
            groups[-1][1] = end
        else:
            groups.append([begin, end])
    texts = [line[a:b] for a, b in zip([0] + [e for _, e in groups], [b for b, _ in groups] + [len(line)])]
    if not "".join(texts).strip():  # placeholders alone: nothing to translate
        return [], lambda found: line
    plain, length, at = [], 0, []
    for k, text in enumerate(texts):
        if k and (not length or plain[-1][-1:].isspace()):  # "a {x} b" reads "a b", "{x} b" reads "b"
            text = text.lstrip()
        if k:
            at.append(length)
        if text:
            plain.append(text)
            length += len(text)
    joined = "".join(plain)
    body = joined.strip()
    lead = len(joined) - len(joined.lstrip())
    holders = [_Placeholders(line[b:e], min(max(a - lead, 0), len(body)), b > 0 and not line[b - 1].isspace(),
                             e < len(line) and not line[e].isspace()) for (b, e), a in zip(groups, at)]

    def rebuild(translations: Sequence[tuple[str, Sequence[tuple[int, int]]]]) -> str:
        (text, alignment), = translations
        return place_placeholders(body, holders, text, alignment)

    return [body], rebuild


def place_placeholders(source: str, holders: list[_Placeholders], translation: str,
                       alignment: Sequence[tuple[int, int]]) -> str:
    """``translation`` with the placeholders put back, spaced as in the source: each group goes before the target
    word of the nearest aligned source word after it (after the one before it, when it was glued to the word
    before it alone); a side that touched a source word touches the target word beside it when that one is
    aligned to it, every other side has one space, and the line neither begins nor ends with whitespace."""
    words = word_spans(translation)
    n = len(words)
    links = _Links(source, alignment, n)
    pairs = {(s, t) for s, t in alignment}
    at: dict[int, list[tuple[_Placeholders, int | None, int | None]]] = {}
    for holder in holders:
        k = bisect_left(links.ends, holder.at)  # the source words it touched, if any
        left = k if holder.glued_left and k < len(links.ends) and links.ends[k] == holder.at else None
        k = bisect_left(links.begins, holder.at)
        right = k if holder.glued_right and k < len(links.begins) and links.begins[k] == holder.at else None
        tries = (links.before, links.after) if left is not None and right is None else (links.after, links.before)
        gap = next((g for g in (find(holder.at) for find in tries) if g is not None), None)
        if gap is None:  # no source word is aligned: the start when it came before every word, else the end
            gap = 0 if holder.at == 0 else n
        at.setdefault(gap, []).append((holder, left, right))
    out: list[str] = []
    last: int | tuple[_Placeholders, int | None, int | None] | None = None
    for gap in range(n + 1):
        for item in [*at.get(gap, []), *([gap] if gap < n else [])]:
            if isinstance(item, int):
                if isinstance(last, int):
                    out.append(translation[words[last][1] : words[item][0]])
                elif last is not None:
                    out.append("" if (last[2], item) in pairs else " ")
                out.append(translation[words[item][0] : words[item][1]])
            else:
                if isinstance(last, int):
                    out.append("" if (item[1], last) in pairs else " ")
                elif last is not None:
                    out.append(" ")
                out.append(item[0].text)
            last = item
    return "".join(out)


# ------------------------------------------------------------------ whole documents


@dataclass
class Block:
    """A run of a document's text and inline tags between two block tags: ``source`` as written, ``fragment``
    what is translated (its line breaks read as spaces, each element not to translate as a placeholder void
    tag ``<{mark}-{k}/>``, its other tags as :func:`parse` writes them)."""

    source: str
    fragment: str
    kept: list[str]
    mark: str

    def rebuild(self, translated: str) -> str:
        """The run from ``translated`` (the fragment translated, its tags placed): the source as written when
        nothing changed (the same text and tags), else the translation with the kept elements back in place."""
        if html.unescape(translated) == html.unescape(self.fragment):
            return self.source
        return re.sub(rf"<{self.mark}-([0-9]+)/>", lambda m: self.kept[int(m.group(1))], translated)


def blocks(markup: str) -> list[str | Block]:
    """A whole HTML (or XHTML) document as literal strings (doctype, comments, block tags, head, elements not to
    translate in a block's place, the whitespace between blocks, all as written) and the :class:`Block` runs of
    text between them, in order: joining them (each run's ``source``) gives the document back.

    A document is read as a browser reads a page, not as a fragment: a line break is whitespace, not a
    boundary; a block tag needs no closing tag (``<p>`` and ``<li>`` often have none); an inline tag whose
    partner is missing (or that crosses another) is left in place as a boundary, not an error. Only an element
    not to translate must be closed (its extent is what is kept). Linear work, explicit stacks."""
    tokens = _scan(markup, "html")
    stacks: dict[str, list[int]] = {}  # the extent of each element, by its name alone (for the kept ones)
    for k, token in enumerate(tokens):
        if token.kind == "open":
            stacks.setdefault(token.name, []).append(k)
        elif token.kind == "close" and stacks.get(token.name):
            opened = stacks[token.name].pop()
            token.pair, tokens[opened].pair = opened, k
    for token in tokens:
        if token.kind == "open" and token.pair is None and _is_kept(token):
            raise MarkupError(f"{_shown_tag(token.text)} is never closed")
    tokens = _keep(markup, tokens)
    for token in tokens:
        token.pair = None
    _pair_inline(tokens)
    boundary = _boundaries(tokens, "html", True)
    ends = [t.at for t in tokens[1:]] + [len(markup)]
    mark = f"mtkit-kept-{secrets.token_hex(6)}"
    parts: list[str | Block] = []
    first = 0
    for k in range(len(tokens) + 1):
        if k < len(tokens) and not boundary[k]:
            continue
        if first < k:
            parts.extend(_run(markup, tokens[first:k], ends[k - 1], mark))
        if k < len(tokens):
            parts.append(markup[tokens[k].at : ends[k]])
        first = k + 1
    return parts


def _pair_inline(tokens: list[_Token]) -> None:
    """Pair a document's inline tags as a stack does, leaving unpaired a closing tag whose opening one is not
    open and an opening one closed past (each tag is pushed and popped once: linear)."""
    stack: list[int] = []
    open_names: dict[str, int] = {}
    for k, token in enumerate(tokens):
        if token.kind not in ("open", "close") or token.name in HTML_BLOCK:
            continue
        if token.kind == "open":
            stack.append(k)
            open_names[token.name] = open_names.get(token.name, 0) + 1
            continue
        if not open_names.get(token.name):
            continue
        while True:
            opened = stack.pop()
            open_names[tokens[opened].name] -= 1
            if tokens[opened].name == token.name:
                token.pair, tokens[opened].pair = opened, k
                break


def _run(markup: str, run: list[_Token], stop: int, mark: str) -> list[str | Block]:
    """A run of text and inline tags (ending at ``stop``) as its whitespace before, its :class:`Block` and its
    whitespace after, or as one literal when it holds no text to translate."""
    start = begin = run[0].at
    end = stop
    if not any(t.kind == "text" and t.text.strip() for t in run):
        return [markup[start:stop]]
    if run[0].kind == "text":
        begin += len(run[0].text) - len(run[0].text.lstrip())
    if run[-1].kind == "text":
        end -= len(run[-1].text) - len(run[-1].text.rstrip())
    pieces: list[str] = []
    kept: list[str] = []
    for token in run:
        if token.kind == "text":
            text = markup[max(token.at, begin) : min(token.at + len(token.text), end)]
            pieces.append(text.replace("\r", " ").replace("\n", " "))
        elif token.kind == "kept":
            pieces.append(f"<{mark}-{len(kept)}/>")
            kept.append(token.text)
        else:
            pieces.append(token.text)
    return [markup[start:begin], Block(markup[begin:end], "".join(pieces), kept, mark), markup[end:stop]]


# ------------------------------------------------------------------ fragments and lines


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


def protect_lines(lines: Sequence[str], pattern,
                  translate: Callable[[list[str]], list[tuple[str, Sequence[tuple[int, int]]]]]) -> list[str]:
    """Each plain-text line translated with the matches of ``pattern`` (a ``regex`` pattern) carried over
    (:func:`split_protected`)."""
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

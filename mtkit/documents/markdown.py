"""Markdown (.md): the text of paragraphs, headings and table cells translated, the rest as written.

The file is parsed with markdown-it-py (CommonMark, with GFM tables and strikethrough), whose block tokens say
which source lines each paragraph, heading and table row came from. Those lines are rewritten, each keeping
its prefix (``#``, ``- ``, ``1. ``, ``> ``, indentation) and its line ending; every other line (code blocks,
HTML blocks, link reference definitions, thematic breaks, YAML front matter, blank lines) is left byte for
byte, and so is a block whose text came back unchanged (an identity round trip gives the file back).

A block's inline syntax becomes placeholders, each as written in the source: emphasis, strong emphasis,
strikethrough and a link's text wrap their words (``<g id="N">``; the link's URL and title stay with its
closing bracket); inline code, images (kept whole, their alt text untranslated), autolinks and raw inline
HTML are atoms (``<x id="N"/>``) that go where the alignment puts them. A paragraph's lines are translated
together and broken again into as many lines (:func:`~mtkit.documents.subtitles.break_lines`: better for
diffs), never before what would begin another block; a hard line break cuts the paragraph into pieces
translated each on their own, the break kept. What the translation adds that Markdown would read (``*``,
``_``, `````, ``[``, a leading ``#`` or ``1.``) is escaped; the source's own escapes are read as the
characters they stand for and written escaped again.

The inline tokens carry no source offsets, so each block's source is walked along its tokens, each token's
syntax found where the token says (markdown-it's own rules, run in their checking mode, find where a link,
image, code span or autolink ends); a block whose source and tokens do not line up is left as written. Work
is linear in the file's size: markdown-it stops nesting at ``maxNesting`` levels (what lies deeper is left as
written) and nothing here recurses.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from markdown_it import MarkdownIt
from markdown_it.rules_inline import StateInline, autolink, backtick, image, link
from markdown_it.token import Token

from mtkit.documents import Limits, Texts
from mtkit.documents.plain import decode_text
from mtkit.documents.subtitles import _plain, break_lines, from_fragment

MAX_NESTING = 20  # markdown-it's own default: blocks or inline markup nested deeper are left as written
_LINE = re.compile(r"([^\r\n]*)(\r\n|\r|\n|$)")
_SOFT = re.compile(r"[ \t]*\n[ \t]*")
_HARD = re.compile(r"(\\| {2,})\n[ \t]*")
_FRONT_END = re.compile(r"(?:---|\.\.\.)[ \t]*")
_PAIRED = {"em_open": "em_close", "strong_open": "strong_close", "s_open": "s_close"}
# what a translation may hold that Markdown would read: escaped (a "_" between two letters or digits is no
# emphasis, a "<" before no name or "!"/"?"/"/" begins no tag, an "&" begins an entity only before a name and ";")
_SPECIAL = re.compile(r"[\\`*\[\]]|~~|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])|<(?=[A-Za-z!?/])|&(?=#?[0-9A-Za-z]+;)")
_CELL_SPECIAL = re.compile(_SPECIAL.pattern + r"|\|")
_HTML_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9-]*)(?:\s[^<>]*)?(?<!/)>")
_LEADING = re.compile(r"(#|>|[-+=](?=[ \t]|$)|[0-9]{1,9}(?=[.)]))")  # would begin another block
_LIST_NUMBER = re.compile(r"[0-9]{1,9}[.)](?:[ \t]|$)")


class _Skip(Exception):
    """A block whose source and tokens do not line up: left as written."""


@dataclass
class _Segment:
    """A block's text up to a hard line break (or its end) as placeholder markup, ``lines`` source lines long,
    ``marker`` the hard break after it as written (``"\\\\"`` or spaces; ``""`` for the last)."""

    markup: str = ""
    lines: int = 1
    marker: str = ""


@dataclass
class _Inline:
    """A block's inline content as segments, ``tags[N]`` the syntax (opening, closing; closing None for an
    atom) that ``<g id="N">`` or ``<x id="N"/>`` stands for, and which tags wrap emphasis (left out when they
    come back around nothing)."""

    segments: list[_Segment] = field(default_factory=list)
    tags: list[tuple[str, str | None]] = field(default_factory=list)
    emphasis: set[int] = field(default_factory=set)
    entities: dict[str, str] = field(default_factory=dict)  # a character the source wrote as an entity: as written


def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"maxNesting": MAX_NESTING}).enable(["table", "strikethrough"])
    return md.disable("text_join")  # escapes and entities stay tokens of their own, as written


def _inline(content: str, children: list[Token], md: MarkdownIt, env: dict) -> _Inline:
    """``content`` (an inline token's source) as placeholder segments, walked along its ``children``."""
    found = _Inline()
    out: list[str] = []
    stack: list[tuple[int, int, int, int]] = []  # each open pair: (tag number, its place in out, words, source)
    at, segment, words = 0, _Segment(), 0  # words: text pieces with a word, so far
    state: StateInline | None = None
    skipping = False  # inside an autolink, taken whole
    link_ends: dict[int, int] = {}  # an open link's tag number: where its source ends

    def expect(written: str) -> None:
        nonlocal at
        if not content.startswith(written, at):
            raise _Skip
        at += len(written)

    def ended_by(rule: Callable[[StateInline, bool], bool]) -> int:
        """Where the syntax that begins at ``at`` ends, as markdown-it's ``rule`` (checking only) finds it."""
        nonlocal state
        if state is None:
            state = StateInline(content, md, env, [])
        state.pos, state.posMax = at, len(content)
        if not rule(state, True):
            raise _Skip
        return state.pos

    def atom(end: int) -> None:
        nonlocal at
        out.append(f'<x id="{len(found.tags)}"/>')
        found.tags.append((content[at:end], None))
        at = end

    def open_pair(written: str) -> None:
        """A pair's opening syntax (``written``, at ``at``) as a ``<g>``; its closing syntax comes when it closes."""
        stack.append((len(found.tags), len(out), words, at))
        out.append(f'<g id="{len(found.tags)}">')
        found.tags.append((written, None))
        expect(written)

    paired = _html_pairs(children)
    for k, token in enumerate(children):
        kind = token.type
        if skipping:
            skipping = kind != "link_close"
        elif kind == "text":
            expect(token.content)
            out.append(html.escape(token.content, quote=False))
            words += bool(token.content.strip())
        elif kind == "text_special":  # an escape or an entity: the character it stands for
            expect(token.markup)
            out.append(html.escape(token.content, quote=False))
            words += bool(token.content.strip())
            if token.info == "entity":
                found.entities[token.content] = token.markup
        elif kind == "softbreak":
            m = _SOFT.match(content, at)
            if m is None:
                raise _Skip
            at = m.end()
            out.append(" ")
            segment.lines += 1
        elif kind == "hardbreak":
            m = _HARD.match(content, at)
            if m is None or stack:  # a break inside emphasis or a link cannot cut the block
                raise _Skip
            at = m.end()
            segment.markup, segment.marker = "".join(out), m.group(1)
            found.segments.append(segment)
            out, segment = [], _Segment()
        elif kind in _PAIRED:
            found.emphasis.add(len(found.tags))
            open_pair(token.markup)
        elif kind == "html_inline" and k in paired and paired[k] > k:  # <span> ... </span>: around its words
            open_pair(token.content)
        elif kind in _PAIRED.values() or kind == "link_close" or (kind == "html_inline" and k in paired):
            if not stack:
                raise _Skip
            opened, place, words_before, source = stack.pop()
            start = at
            if kind == "html_inline":
                expect(token.content)
            elif kind == "link_close":
                expect("]")
                at = link_ends.pop(opened)  # where the link ends (its URL and title), found when it opened
            else:
                expect(token.markup)
            found.tags[opened] = (found.tags[opened][0], content[start:at])
            if words == words_before:  # no word inside (``**`code`**``, a linked image): one atom, whole
                del out[place:]
                out.append(f'<x id="{len(found.tags)}"/>')
                found.tags.append((content[source:at], None))
            else:
                out.append("</g>")
        elif kind == "link_open" and token.info == "auto":
            atom(ended_by(autolink))
            skipping = True
        elif kind == "link_open":
            link_ends[len(found.tags)] = ended_by(link)
            open_pair("[")
        elif kind == "image":
            atom(ended_by(image))
        elif kind == "code_inline":
            atom(ended_by(backtick))
        elif kind == "html_inline":
            if not content.startswith(token.content, at):
                raise _Skip
            atom(at + len(token.content))
        else:
            raise _Skip
    if stack or content[at:].strip():
        raise _Skip
    segment.markup = "".join(out)
    found.segments.append(segment)
    return found


def _html_pairs(children: list[Token]) -> dict[int, int]:
    """Raw inline HTML tags that open and close around text (``<span>…</span>``) inside the same emphasis or
    link, each paired with the other (index to index); any other raw tag is an atom."""
    pairs: dict[int, int] = {}
    stack: list[tuple[int, str]] = []  # (index, tag name; "" for emphasis or a link)
    for k, token in enumerate(children):
        if token.type == "html_inline":
            m = _HTML_TAG.fullmatch(token.content)
            if m is None:
                continue
            if not m.group(1):
                stack.append((k, m.group(2).lower()))
            elif stack and stack[-1][1] == m.group(2).lower():
                opened = stack.pop()[0]
                pairs[opened], pairs[k] = k, opened
        elif token.nesting == 1:
            stack.append((k, ""))
        elif token.nesting == -1:
            while stack and stack[-1][1]:  # raw tags left open inside it: atoms
                stack.pop()
            if stack:
                stack.pop()
    return pairs


def _escaper(inline: _Inline, cell: bool) -> Callable[[str], str]:
    """What escapes a block's translated text: what Markdown would read backslash-escaped (a cell's ``|`` too),
    each character the block's source wrote as an entity written so again."""
    pattern = (_CELL_SPECIAL if cell else _SPECIAL).pattern
    if inline.entities:
        pattern = "|".join(re.escape(c) for c in sorted(inline.entities, key=len, reverse=True)) + "|" + pattern
    special = re.compile(pattern)

    def escape(m: re.Match) -> str:
        found = m.group(0)
        return inline.entities.get(found) or "".join("\\" + c for c in found)

    return lambda text: special.sub(escape, text)


def _escape_leading(text: str) -> str:
    """``text`` with what would begin another block at the start of a line escaped (``#``, ``>``, ``- ``,
    ``1.``)."""
    m = _LEADING.match(text)
    if m is None:
        return text
    return text[: m.end()] + "\\" + text[m.end() :] if text[0].isdigit() else "\\" + text


def _can_break(joined: str, start: int, end: int) -> bool:
    """Whether a line may end at ``start`` and the next begin at ``end`` without the next reading as another
    block (a list item, heading, quote, fence, HTML block, setext underline) or the line ending in a hard
    break."""
    nxt = joined[end : end + 3]
    if joined[start - 1] == "\\" or _LIST_NUMBER.match(joined, end):
        return False
    return nxt[0].isalnum() or nxt[0] in "[_!(\"'" or (nxt[0] in "*`" and nxt[:3] not in ("***", "```")
                                                       and not nxt[1:2].isspace())


def _render(inline: _Inline, translated: list[str], cell: bool) -> list[str]:
    """A block's translated segments as its new lines (at most as many as the source's)."""
    lines: list[str] = []
    escape = _escaper(inline, cell)
    for segment, markup in zip(inline.segments, translated, strict=True):
        pieces = from_fragment(inline.tags, markup, escape, inline.emphasis.__contains__)
        first = next((k for k, (t, m) in enumerate(pieces) if t and (m or t.strip())), None)
        if first is not None and not pieces[first][1]:  # nothing before it: its first characters begin the line
            pieces[first] = (_escape_leading(pieces[first][0].lstrip()), False)
        broken = break_lines(pieces, 1 if cell else segment.lines, _can_break)
        broken = [b.strip() for b in broken]
        broken[-1] += segment.marker
        lines.extend(broken)
    return lines


def _front_matter(lines: list[tuple[str, str]]) -> int:
    """The number of lines of YAML front matter (``---`` on the first line, up to a ``---`` or ``...``), 0 for
    none."""
    if not lines or lines[0][0].rstrip() != "---":
        return 0
    for k in range(1, len(lines)):
        if _FRONT_END.fullmatch(lines[k][0]):
            return k + 1
    return 0


def _cells(body: str) -> list[tuple[int, int]]:
    """The spans of a table row's cells in its source line (split at pipes not after a backslash, as
    markdown-it's ``escapedSplit``; a container's ``>`` and spaces before the first pipe, and an empty cell
    after the last pipe, are no cells)."""
    cuts = [k for k in range(len(body)) if body[k] == "|" and (k == 0 or body[k - 1] != "\\")]
    spans = list(zip([0] + [c + 1 for c in cuts], cuts + [len(body)]))
    if spans and (re.fullmatch(r"[\s>]*", body[: spans[0][1]]) and cuts):
        spans.pop(0)
    elif spans:
        lead = re.match(r"[\s>]*", body).end()
        spans[0] = (lead, spans[0][1])
    if spans and not body[spans[-1][0] : spans[-1][1]].strip() and cuts:
        spans.pop()
    return [(a + len(body[a:b]) - len(body[a:b].lstrip()), b - (len(body[a:b]) - len(body[a:b].rstrip())))
            for a, b in spans]


@dataclass
class _Block:
    """Where a block's text lies: ``spans`` (line, start, end) of each of its source lines (a cell: one), and
    its inline content."""

    spans: list[tuple[int, int, int]]
    inline: _Inline
    cell: bool = False


def _paragraph(token: Token, lines: list[tuple[str, str]], md: MarkdownIt, env: dict) -> _Block:
    """A paragraph's or heading's lines and inline content (:class:`_Skip` where the lines do not hold it)."""
    content = token.content
    parts = content.split("\n")
    first = token.map[0] if token.map else -1
    if first < 0 or first + len(parts) > len(lines) or not content.strip():
        raise _Skip
    spans = []
    for j, part in enumerate(parts):
        body = lines[first + j][0]
        if j < len(parts) - 1:
            if not body.endswith(part):
                raise _Skip
            start = len(body) - len(part)
        else:
            start = body.rfind(part)
            if start < 0:
                raise _Skip
        spans.append((first + j, start, start + len(part)))
    return _Block(spans, _inline(content, token.children or [], md, env))


def _blocks(tokens: list[Token], lines: list[tuple[str, str]], md: MarkdownIt, env: dict) -> list[_Block]:
    """The blocks of text to translate: paragraphs, headings, and each table cell."""
    blocks: list[_Block] = []
    k = 0
    while k < len(tokens):
        token = tokens[k]
        if token.type == "tr_open" and token.map:
            row = token.map[0]
            cells = []
            while k < len(tokens) and tokens[k].type != "tr_close":
                if tokens[k].type == "inline":
                    cells.append(tokens[k].content)
                k += 1
            body = lines[row][0]
            for (a, b), content in zip(_cells(body), cells, strict=False):
                source = body[a:b]
                if not content or source.replace("\\|", "|") != content:
                    continue
                try:
                    children = md.parseInline(source, env)[0].children or []
                    blocks.append(_Block([(row, a, b)], _inline(source, children, md, env), cell=True))
                except _Skip:
                    pass
        elif token.type == "inline":
            try:
                blocks.append(_paragraph(token, lines, md, env))
            except _Skip:
                pass
        k += 1
    return blocks


def translate(data: bytes, fmt: str, texts: Texts, name: str, limits: Limits) -> bytes:
    text, bom = decode_text(data, name)
    lines = [(m.group(1), m.group(2)) for m in _LINE.finditer(text) if m.group(0)]
    front = _front_matter(lines)
    md, env = _parser(), {}
    # the front matter's lines are blank to markdown-it (else its --- would read as a rule or a heading's
    # underline), so that the token maps still count the file's lines
    tokens = md.parse("\n" * front + text[sum(len(a) + len(b) for a, b in lines[:front]):], env)
    del text
    blocks = _blocks(tokens, lines, md, env)
    sources = [s.markup for block in blocks for s in block.inline.segments]
    done = iter(texts.fragments(sources, "xml", name))
    out = [a + b for a, b in lines]
    cells: dict[int, list[tuple[int, int, str]]] = {}  # a row's new cells, put in from right to left
    for block in blocks:
        segments = block.inline.segments
        translated = [next(done) for _ in segments]
        if [_plain(t) for t in translated] == [_plain(s.markup) for s in segments]:
            continue  # its own words came back: as written
        new = _render(block.inline, translated, block.cell)
        if block.cell:
            row, start, end = block.spans[0]
            cells.setdefault(row, []).append((start, end, new[0]))
            continue
        last, _, last_end = block.spans[-1]
        for j, (row, start, end) in enumerate(block.spans):
            body, ending = lines[row]
            if j < len(new) - 1:
                out[row] = body[:start] + new[j] + body[end:] + ending
            elif j == len(new) - 1:  # the block's last line: the last source line's end (a heading's closing #s)
                out[row] = body[:start] + new[j] + lines[last][0][last_end:] + lines[last][1]
            else:  # fewer places to break than lines: the rest go
                out[row] = ""
    for row, found in cells.items():
        body, ending = lines[row]
        for start, end, cell in reversed(found):
            body = body[:start] + cell + body[end:]
        out[row] = body + ending
    return (bom + "".join(out)).encode("utf-8")

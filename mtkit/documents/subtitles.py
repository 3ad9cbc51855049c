"""Subtitles (.srt, .vtt): each cue's text translated, everything else kept as written.

Cue numbers, timings (and WebVTT cue settings), cue identifiers, the ``WEBVTT`` header and ``NOTE``, ``STYLE``
and ``REGION`` blocks come back byte for byte, and so do blank lines, line endings (``\\n``, ``\\r\\n``) and a
byte order mark. A cue's lines are translated together (joined with a space: one fragment) and broken again
into as many lines, balanced by length (:func:`break_lines`); a cue whose lines all begin with a dash is a
dialogue and each of its lines is translated alone. Inline tags (SubRip's ``<i>``, ``<b>``, ``<u>``,
``<font color=...>`` and ``{\\an8}``; WebVTT's ``<i>``, ``<b>``, ``<u>``, ``<c.class>``, ``<v Speaker>``,
``<lang en>``, ``<ruby>``/``<rt>`` and timestamps ``<00:00:01.500>``) become the placeholders of
:mod:`mtkit.documents.runs` (``<g id="N">`` around words, ``<x id="N"/>`` for a tag that wraps nothing or is
not closed) so that the markup carrier never reads subtitle syntax, and go back around the aligned words.

The block structure is read here, one line at a time, rather than through the ``srt`` or ``webvtt-py`` packages:
both rewrite what they keep (``srt`` renumbers and reformats timings, reading ``00:00:01,5`` as 1.005 s, and
writes ``\\n`` only; ``webvtt-py`` writes every timing with hours), so an identity round trip would not give the
file back. Work is linear in the file's size; the text is held as its lines and one output list.
"""

from __future__ import annotations

import html
import re
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mtkit.documents import Limits, Texts
from mtkit.documents.plain import decode_text
from mtkit.errors import MtkitError, shown

_LINE = re.compile(r"[^\n]*\n|[^\n]+")
_NUMBER = re.compile(r"[ \t]*[0-9]+[ \t]*")
_SRT_TIME = r"[0-9]+:[0-9]+:[0-9]+(?:[,.:][0-9]+)?"
_SRT_TIMING = re.compile(rf"[ \t]*{_SRT_TIME}[ \t]*-->[ \t]*{_SRT_TIME}(?:[ \t].*)?")
_VTT_TIME = r"(?:[0-9]+:)?[0-9]{2}:[0-9]{2}\.[0-9]{3}"
_VTT_TIMING = re.compile(rf"{_VTT_TIME}[ \t]+-->[ \t]+{_VTT_TIME}(?:[ \t].*)?")
_VTT_BLOCKS = re.compile(r"(?:NOTE|STYLE|REGION)(?:[ \t].*)?")  # kept whole, up to the next blank line
# a tag as each format writes it: (closing slash, name, rest); SubRip's {\...} overrides and WebVTT's timestamps
# are atoms. SubRip text is literal (a "<" that begins none of its tags is text); WebVTT escapes "<" and "&".
_SRT_TAG = re.compile(r"<(/?)(i|b|u|s|font)\b([^<>]*)>|\{\\[^{}]*\}", re.IGNORECASE)
_VTT_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9]*)([^<>]*)>|<[0-9:.]+>")
_PLACEHOLDER = re.compile(r'<(/?)([gx]) ?(?:id="([0-9]+)")?\s*(/?)>')
_DIALOGUE = re.compile(r"[-\u2010-\u2014]")
_VTT_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "\u00a0": "&nbsp;", "\u200e": "&lrm;", "\u200f": "&rlm;"}
_VTT_UNSAFE = re.compile("[&<>\u00a0\u200e\u200f]")


@dataclass
class Cue:
    """A cue's text: its lines (``first``, the index of its first line in the file, and how many) as groups
    translated each as one fragment (the whole cue, or each line of a dialogue)."""

    first: int
    count: int
    groups: list[tuple[int, int]] = field(default_factory=list)  # (first line, lines) of each fragment


@dataclass
class Fragment:
    """A group of cue lines as placeholder markup: ``tags[N]`` what ``<g id="N">`` or ``<x id="N"/>`` stands for
    (the opening tag as written and its closing one; None for an atom)."""

    markup: str
    tags: list[tuple[str, str | None]]


def _where(name: str, number: int) -> str:
    return f"{name}: line {number}"


def _blocks(lines: list[str], fmt: str, name: str) -> list[Cue]:
    """The cues of the file's ``lines`` (line endings kept): one pass, a line at a time; :class:`MtkitError`
    naming the line where a timing was expected and something else was found."""
    timing = _SRT_TIMING if fmt == "srt" else _VTT_TIMING
    cues: list[Cue] = []
    n, k = len(lines), 0

    def body(i: int) -> str:
        return lines[i].rstrip("\r\n")

    def blank(i: int) -> bool:
        return not body(i).strip()

    if fmt == "vtt":
        if not lines or not re.match(r"WEBVTT(?:[ \t]|$)", body(0)):
            raise MtkitError(f"{_where(name, 1)}: not a WebVTT file (it must begin with WEBVTT)")
        while k < n and not blank(k):  # the header block
            k += 1
    while k < n:
        if blank(k):
            k += 1
            continue
        start = k
        if fmt == "vtt" and "-->" not in body(k) and _VTT_BLOCKS.fullmatch(body(k)):
            while k < n and not blank(k):
                k += 1
            continue
        if "-->" not in body(k):  # a cue number (SubRip) or identifier (WebVTT) before the timing
            if fmt == "srt" and not _NUMBER.fullmatch(body(k)):
                raise MtkitError(f"{_where(name, k + 1)}: expected a cue number or a timing, found "
                                 f"{shown(body(k))}")
            k += 1
        if k >= n or not timing.fullmatch(body(k)):
            found = shown(body(k)) if k < n else "the end of the file"
            after = f" (after the cue's line {start + 1})" if k > start else ""
            raise MtkitError(f"{_where(name, k + 1)}: expected a timing{after}, found {found}")
        k += 1
        first = k
        while k < n and not blank(k):
            k += 1
        if k > first:
            cue = Cue(first, k - first)
            texts = [body(i).lstrip() for i in range(first, k)]
            if len(texts) > 1 and all(_DIALOGUE.match(t) for t in texts):
                cue.groups = [(i, 1) for i in range(first, k)]
            else:
                cue.groups = [(first, k - first)]
            cues.append(cue)
    return cues


def to_fragment(text: str, fmt: str) -> Fragment:
    """The cue text ``text`` as placeholder markup: each tag paired with its closing one by name (a closing tag
    that closes nothing open on top, and a tag never closed, are atoms), text escaped for the markup (WebVTT's
    entities decoded first)."""
    pattern = _SRT_TAG if fmt == "srt" else _VTT_TAG
    tokens: list[tuple[str, str, str]] = []  # (kind, written, name): kind text | open | close | atom
    at = 0
    for m in pattern.finditer(text):
        if m.start() > at:
            tokens.append(("text", text[at : m.start()], ""))
        closing, tag_name = m.group(1), (m.group(2) or "").lower()
        kind = "atom" if not tag_name else "close" if closing else "open"
        tokens.append((kind, m.group(0), tag_name))
        at = m.end()
    if at < len(text):
        tokens.append(("text", text[at:], ""))
    pair: dict[int, int] = {}
    stack: list[int] = []
    for k, (kind, _, tag_name) in enumerate(tokens):
        if kind == "open":
            stack.append(k)
        elif kind == "close" and stack and tokens[stack[-1]][2] == tag_name:
            opened = stack.pop()
            pair[opened], pair[k] = k, opened
    frag = Fragment("", [])
    out: list[str] = []
    k = 0
    while k < len(tokens):
        kind, written, tag_name = tokens[k]
        k += 1
        if kind == "open" and tag_name == "rt" and k - 1 in pair:  # a ruby's reading goes whole with its base
            written = "".join(t[1] for t in tokens[k - 1 : pair[k - 1] + 1])
            kind, k = "atom", pair[k - 1] + 1
        if kind == "text":
            plain = html.unescape(written) if fmt == "vtt" else written
            out.append(html.escape(plain, quote=False))
        elif kind == "open" and k - 1 in pair:
            out.append(f'<g id="{len(frag.tags)}">')
            frag.tags.append((written, tokens[pair[k - 1]][1]))
        elif kind == "close" and k - 1 in pair:
            out.append("</g>")
        else:
            out.append(f'<x id="{len(frag.tags)}"/>')
            frag.tags.append((written, None))
    frag.markup = "".join(out)
    return frag


def _escaped(text: str, fmt: str) -> str:
    return text if fmt == "srt" else _VTT_UNSAFE.sub(lambda m: _VTT_ESCAPES[m.group(0)], text)


def from_fragment(tags: Sequence[tuple[str, str | None]], markup: str, escape: Callable[[str], str],
                  drop_empty: Callable[[int], bool] = lambda number: False) -> list[tuple[str, bool]]:
    """The translated placeholder ``markup`` back in the document's syntax: pieces (text, whether it is markup),
    ``tags[N]`` written for ``<g id="N">`` (and its closing tag) or ``<x id="N"/>``, the text between them
    through ``escape``; a ``<g>`` for which ``drop_empty`` says so is left out when it wraps no text."""
    pieces: list[tuple[str, bool]] = []
    stack: list[tuple[int, int, int]] = []  # (tag number, its piece, how many pieces held anything before it)
    held = 0  # pieces so far that hold text or markup (not whitespace alone): counted, never searched again

    def add(text: str, markup: bool) -> None:
        nonlocal held
        pieces.append((text, markup))
        held += bool(text.strip())

    at = 0
    for m in _PLACEHOLDER.finditer(markup):
        if m.start() > at:
            add(escape(html.unescape(markup[at : m.start()])), False)
        at = m.end()
        closing, kind, number, _ = m.groups()
        if closing:
            opened, k, before = stack.pop()
            if drop_empty(opened) and held == before + 1:  # nothing since its opening tag
                pieces[k] = ("", True)
                held -= 1
            else:
                add(tags[opened][1] or "", True)
        else:
            add(tags[int(number)][0], True)
            if kind == "g":
                stack.append((int(number), len(pieces) - 1, held - 1))
    if at < len(markup):
        add(escape(html.unescape(markup[at:])), False)
    return pieces


def _plain(markup: str) -> str:
    return html.unescape(_PLACEHOLDER.sub("", markup))


def break_lines(pieces: Sequence[tuple[str, bool]], lines: int,
                can_break: Callable[[str, int, int], bool] | None = None) -> list[str]:
    """The text of ``pieces`` (text, whether it is markup: never broken inside) broken at whitespace into
    ``lines`` lines (fewer when it has fewer places to break), each break at the place nearest an equal share
    of the visible characters; ``can_break(joined, start, end)`` may refuse a whitespace run."""
    joined, places, offsets = [], [], []  # places: (start, end) of a whitespace run in the joined text
    length = visible = 0
    for text, markup in pieces:
        if not markup:
            for m in re.finditer(r"\s+", text):
                places.append((length + m.start(), length + m.end()))
                offsets.append(visible + m.start())
            visible += len(text)
        joined.append(text)
        length += len(text)
    whole = "".join(joined)
    keep = [k for k, (a, b) in enumerate(places) if 0 < a and b < len(whole)
            and (can_break is None or can_break(whole, a, b))]
    places, offsets = [places[k] for k in keep], [offsets[k] for k in keep]
    wanted = min(lines - 1, len(places))
    chosen, lo = [], 0
    for i in range(1, wanted + 1):
        hi = len(places) - (wanted - i)  # leave a place for each break still to come
        k = bisect_left(offsets, visible * i / lines, lo, hi)
        if k == hi or (k > lo and visible * i / lines - offsets[k - 1] <= offsets[k] - visible * i / lines):
            k -= 1
        k = max(k, lo)
        chosen.append(places[k])
        lo = k + 1
    out, at = [], 0
    for a, b in chosen:
        out.append(whole[at:a])
        at = b
    out.append(whole[at:])
    return out


def translate(data: bytes, fmt: str, texts: Texts, name: str, limits: Limits) -> bytes:
    text, bom = decode_text(data, name)
    lines = _LINE.findall(text)
    del text
    cues = _blocks(lines, fmt, name)
    groups = [g for cue in cues for g in cue.groups]
    bodies = [[lines[i].rstrip("\r\n") for i in range(first, first + count)] for first, count in groups]
    frags = [to_fragment(" ".join(b.strip() for b in body), fmt) for body in bodies]
    done = texts.fragments([f.markup for f in frags], "xml", name)
    for (first, count), body, frag, markup in zip(groups, bodies, frags, done, strict=True):
        words = _plain(markup)
        if words == _plain(frag.markup) or not words.strip():
            continue  # its own words came back (an identity round trip gives the file back), or none: as written
        broken = break_lines(from_fragment(frag.tags, markup, lambda t: _escaped(t, fmt)), count)
        for i, (old, new) in enumerate(zip(body, broken)):
            lines[first + i] = new + lines[first + i][len(old):]
        for i in range(len(broken), count):  # fewer places to break than lines: the rest go
            lines[first + i] = ""
    return (bom + "".join(lines)).encode("utf-8")

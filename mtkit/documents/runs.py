"""A paragraph of formatted runs (Word's ``w:r``, PowerPoint's ``a:r``, ODF's ``text:span``) as one fragment of
inline markup and back.

The runs of a paragraph are grouped by their formatting (a key the format module gives: the run's properties as
written); the most common formatting (by characters) is the paragraph's own and goes bare, every other one
becomes ``<g id="N">…</g>``; an object inside the text that is not text (a tab, a break, a field, a picture) is a
``<x id="N"/>`` that the alignment carries to its place. Hyperlinks and other wrappers around runs nest:
``<g id="L"><g id="N">…</g></g>``. After translation :func:`spans` reads the fragment back as (text, the keys of
the tags around it, innermost last) so the format module can rebuild its runs, each from a run of that
formatting.
"""

from __future__ import annotations

import html
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

_TAG = re.compile(r'<(/?)([gx]) ?(?:id="([0-9]+)")?\s*(/?)>')


@dataclass
class Piece:
    """A run's text (``text``) or an object that is not text (``atom``: the format module's own, carried whole),
    with its formatting (``run``: a hashable the format module chose, such as the run's properties as written)
    and the wrappers around it (``wrappers``: hashables too, outermost first, such as a hyperlink)."""

    text: str = ""
    run: Hashable = None
    wrappers: tuple[Hashable, ...] = ()
    atom: object | None = None


@dataclass
class Fragment:
    """A paragraph as inline markup (``markup``) and what its ids stand for."""

    markup: str = ""
    keys: list[tuple[str, Hashable]] = field(default_factory=list)  # g id -> ("run" | "wrap", key)
    atoms: list[object] = field(default_factory=list)  # x id -> atom
    base: Hashable = None  # the paragraph's own (bare) run formatting

    @property
    def text(self) -> str:
        """The plain text (tags dropped, entities decoded)."""
        return html.unescape(_TAG.sub("", self.markup))


def to_fragment(pieces: Sequence[Piece]) -> Fragment:
    """The fragment of ``pieces``: the most common run formatting (by characters) bare, every other one and every
    wrapper a ``<g>``, each atom an ``<x/>``; adjacent pieces in the same tags share them."""
    weight: dict[Hashable, int] = {}
    for p in pieces:
        if p.atom is None:
            weight[p.run] = weight.get(p.run, 0) + len(p.text)
    frag = Fragment(base=max(weight, key=lambda k: weight[k]) if weight else None)
    ids: dict[tuple[str, Hashable], int] = {}

    def tag(kind: str, key: Hashable) -> str:
        if (kind, key) not in ids:
            ids[(kind, key)] = len(frag.keys)
            frag.keys.append((kind, key))
        return f'<g id="{ids[(kind, key)]}">'

    out: list[str] = []
    opened: list[tuple[str, Hashable]] = []
    for p in pieces:
        wanted = [("wrap", w) for w in p.wrappers]
        if p.atom is None and p.run != frag.base:
            wanted.append(("run", p.run))
        common = 0
        while common < min(len(opened), len(wanted)) and opened[common] == wanted[common]:
            common += 1
        out.extend("</g>" for _ in opened[common:])
        del opened[common:]
        for key in wanted[common:]:
            out.append(tag(*key))
            opened.append(key)
        if p.atom is not None:
            out.append(f'<x id="{len(frag.atoms)}"/>')
            frag.atoms.append(p.atom)
        else:
            out.append(html.escape(p.text, quote=False))
    out.extend("</g>" for _ in opened)
    frag.markup = "".join(out)
    return frag


def from_fragment(frag: Fragment, markup: str) -> list[Piece]:
    """The pieces of ``markup`` (``frag``'s translation, tags as :func:`to_fragment` wrote them): each text with
    the innermost run formatting around it (the base where none) and its wrappers, each atom in its place;
    adjacent texts with the same formatting and wrappers merged."""
    pieces: list[Piece] = []
    stack: list[tuple[str, Hashable]] = []
    at = 0

    def where() -> tuple[Hashable, tuple[Hashable, ...]]:
        runs = [key for kind, key in stack if kind == "run"]
        return (runs[-1] if runs else frag.base), tuple(key for kind, key in stack if kind == "wrap")

    def text(s: str) -> None:
        if not s:
            return
        run, wrappers = where()
        s = html.unescape(s)
        if pieces and pieces[-1].atom is None and (pieces[-1].run, pieces[-1].wrappers) == (run, wrappers):
            pieces[-1].text += s
        else:
            pieces.append(Piece(s, run, wrappers))

    for m in _TAG.finditer(markup):
        text(markup[at : m.start()])
        at = m.end()
        closing, kind, number, void = m.groups()
        if kind == "x":
            run, wrappers = where()
            pieces.append(Piece("", run, wrappers, frag.atoms[int(number)]))
        elif closing:
            stack.pop()
        elif not void:
            stack.append(frag.keys[int(number)])
    text(markup[at:])
    return pieces

"""Per-line phrase constraints: what must (``include``) and must not (``exclude``) be in a translation.

The text form, :class:`Constraints`, is what users give: one JSON object per input line
(``{"include": ["Kaffeetasse"], "exclude": ["Tasse"]}``, ``{}`` for none; :func:`read_constraints`),
a glossary's matches (:mod:`mtkit.runtime.glossary`), or a server request. The engines get
:class:`PieceConstraints`: each phrase encoded with the target SentencePiece model as it appears
inside a sentence (after a word boundary, with the leading ``▁``), and the text an output must
contain, which is the phrase as the model writes it (through its normalization: a lowercasing
model writes it in lowercase). :func:`unmet` checks an output's text.

Phrases match at a word start: an excluded ``Tasse`` keeps ``Tasse`` (and ``Tassen``, which starts
with it) out, not ``Kaffeetasse``; it is banned in each of its :func:`segmentations` into pieces,
not only SentencePiece's own, since a model also writes words in other pieces at times.

No torch here: the CTranslate2 engine uses this module too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mtkit.errors import MtkitError


@dataclass(frozen=True)
class Constraints:
    """Phrases a translation must contain (``include``) and must not contain (``exclude``), as text."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.include or self.exclude)

    def merged(self, other: Constraints | None) -> Constraints:
        """Both sets of phrases (each phrase once, in order)."""
        if not other:
            return self
        return Constraints(tuple(dict.fromkeys(self.include + other.include)),
                           tuple(dict.fromkeys(self.exclude + other.exclude)))

    @classmethod
    def from_json(cls, value: object, where: str) -> Constraints:
        """From a decoded JSON object ``{"include": [str], "exclude": [str]}`` (both optional); an error
        names ``where`` (``FILE: line N`` or a request field)."""
        if not isinstance(value, dict):
            raise MtkitError(f"{where}: expected a JSON object such as {{\"include\": [\"...\"]}}, "
                             f"got {type(value).__name__}")
        unknown = sorted(set(value) - {"include", "exclude"})
        if unknown:
            raise MtkitError(f"{where}: unknown key {unknown[0]!r}; expected include and/or exclude")
        found = {}
        for key in ("include", "exclude"):
            phrases = value.get(key, [])
            if not isinstance(phrases, list) or not all(isinstance(p, str) for p in phrases):
                raise MtkitError(f"{where}: {key} must be a list of strings")
            for p in phrases:
                if not p.strip():
                    raise MtkitError(f"{where}: {key} holds an empty phrase")
                if "\n" in p or "\r" in p:
                    raise MtkitError(f"{where}: {key} phrase {p!r} holds a line break")
            found[key] = tuple(dict.fromkeys(p.strip() for p in phrases))
        clash = set(found["include"]) & set(found["exclude"])
        if clash:
            raise MtkitError(f"{where}: {min(clash)!r} is both included and excluded")
        return cls(found["include"], found["exclude"])


# What the engines' pipeline asks for each input line: (0-based index, line) -> its constraints.
ConstraintSource = Callable[[int, str], "Constraints | None"]


def read_constraints(path: Path, flag: str = "--constraints") -> list[Constraints]:
    """Every line of a JSON-lines constraints file, checked: a line that is not a JSON object of
    include/exclude lists is an error naming the file and line number."""
    try:
        with open(path, "rb") as f:
            raw_lines = f.read().split(b"\n")
    except FileNotFoundError:
        raise MtkitError(f"{flag} {path}: no such file") from None
    except IsADirectoryError:
        raise MtkitError(f"{flag} {path}: is a directory, expected a file") from None
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()  # the newline that ends the last line
    found = []
    for number, raw in enumerate(raw_lines, 1):
        where = f"{flag} {path}: line {number}"
        try:
            text = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError:
            raise MtkitError(f"{where}: not valid UTF-8") from None
        if not text.strip():
            raise MtkitError(f"{where}: empty; write {{}} for a line without constraints")
        try:
            value = json.loads(text)
        except ValueError as e:
            raise MtkitError(f"{where}: malformed JSON ({e})") from None
        found.append(Constraints.from_json(value, where))
    return found


def constraint_source(per_line: list[Constraints] | None, glossary=None,
                      name: str = "--constraints") -> ConstraintSource:
    """The constraints of input line ``index``: ``per_line[index]`` (from a constraints file; a missing
    line is an error naming ``name``) merged with the ``glossary``'s matches in the line, if any."""

    def source(index: int, line: str) -> Constraints | None:
        found = None
        if per_line is not None:
            if index >= len(per_line):
                raise MtkitError(f"{name}: has {len(per_line)} lines, but the input has more "
                                 f"(line {index + 1}); give one JSON object per input line")
            found = per_line[index]
        if glossary is not None:
            found = glossary.constraints(line).merged(found)
        return found

    return source


@dataclass(frozen=True)
class PieceConstraints:
    """Constraints as target ids: ``include`` / ``exclude`` phrases (tuples of ids), and ``texts``, the
    text of each include phrase as the model writes it (what :func:`unmet` looks for)."""

    include: tuple[tuple[int, ...], ...]
    exclude: tuple[tuple[int, ...], ...]
    texts: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.include or self.exclude)

    @property
    def include_pieces(self) -> int:
        return sum(len(p) for p in self.include)


_MAX_SEGMENTATIONS = 32  # per exclude phrase: its canonical pieces and the next fewest-piece alternatives
_SEARCH_STEPS = 20_000  # per phrase: a long phrase has exponentially many segmentations


class _PieceTable:
    """A vocabulary's target pieces -> ids (special ids 0-3 left out), and the segmentations found so far."""

    def __init__(self, vocab) -> None:
        self.vocab = vocab
        ids = range(4, vocab.tgt_size)
        self.ids = {piece: i for piece, i in zip(vocab.tgt_pieces(ids), ids)}
        self.longest = max(map(len, self.ids), default=1)
        self.found: dict[tuple[int, ...], list[tuple[int, ...]]] = {}


_TABLES: dict[int, _PieceTable] = {}


def segmentations(vocab, ids: list[int], limit: int = _MAX_SEGMENTATIONS) -> list[tuple[int, ...]]:
    """``ids`` and other ways to write the same pieces' text with ``vocab``'s target pieces, fewest
    pieces first (at most ``limit``): a model trained on one segmentation still writes others at
    times, and an excluded phrase must stay out however it is spelt in pieces."""
    key = tuple(ids)
    if not (hasattr(vocab, "tgt_pieces") and hasattr(vocab, "tgt_size")) or any(i < 4 for i in key):
        return [key]
    table = _TABLES.get(id(vocab))
    if table is None or table.vocab is not vocab:
        table = _TABLES[id(vocab)] = _PieceTable(vocab)
    if key not in table.found:
        table.found[key] = _segment("".join(vocab.tgt_pieces(key)), key, table, limit)
    return table.found[key]


def _segment(text: str, canonical: tuple[int, ...], table: _PieceTable, limit: int) -> list[tuple[int, ...]]:
    found = [canonical]
    budget = [_SEARCH_STEPS]

    def split(start: int, pieces_left: int, prefix: list[int]):
        if start == len(text):
            yield tuple(prefix)
            return
        if pieces_left == 0 or budget[0] <= 0 or len(text) - start > pieces_left * table.longest:
            return
        for end in range(start + 1, min(len(text), start + table.longest) + 1):
            budget[0] -= 1
            piece = table.ids.get(text[start:end])
            if piece is not None:
                yield from split(end, pieces_left - 1, prefix + [piece])

    for count in range(1, len(text) + 1):  # fewest pieces first
        for seg in split(0, count, []):
            if len(seg) == count and seg not in found:
                found.append(seg)
                if len(found) >= limit:
                    return found
        if budget[0] <= 0:
            break
    return found


def encode_constraints(constraints: Constraints | None, vocab) -> PieceConstraints | None:
    """Encode ``constraints`` with ``vocab``'s target model; None for no constraints. An include phrase
    whose text lies inside another include phrase is dropped: the longer one brings it. An exclude
    phrase becomes each of its :func:`segmentations`."""
    if not constraints:
        return None
    written = {p: vocab.decode_tgt(vocab.encode_tgt(p)) for p in (*constraints.include, *constraints.exclude)}
    phrases = constraints.include
    include = [p for i, p in enumerate(phrases)  # kept: the first of equal texts, and no text inside a longer one
               if not any(j != i and written[p] in written[q] and (len(written[q]) > len(written[p]) or j < i)
                          for j, q in enumerate(phrases))]
    return PieceConstraints(
        include=tuple(tuple(vocab.encode_tgt(p)) for p in include),
        exclude=tuple(s for p in constraints.exclude for s in segmentations(vocab, vocab.encode_tgt(p))),
        texts=tuple(written[p] for p in include),
    )


def unmet(constraints: PieceConstraints | None, text: str) -> list[str]:
    """The include phrases (as the model writes them) that ``text`` lacks."""
    if constraints is None:
        return []
    return [t for t in constraints.texts if t not in text]

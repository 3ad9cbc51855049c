"""Per-line phrase constraints: what must (``include``) and must not (``exclude``) be in a translation.

The text form, :class:`Constraints`, is what users give: one JSON object per input line
(``{"include": ["Kaffeetasse"], "exclude": ["Tasse"]}``, ``{}`` for none; :func:`read_constraints`),
a glossary's matches (:mod:`mtkit.text.glossary`), or a server request. The engines get
:class:`PieceConstraints`: each phrase encoded with the target SentencePiece model as it appears
inside a sentence (after a word boundary, with the leading ``▁``), and the text an output must
contain, which is the phrase as the model writes it (through its normalization: a lowercasing
model writes it in lowercase). :func:`unmet` checks an output's text.

Phrases match at a word start: an excluded ``Tasse`` keeps ``Tasse`` and every word it begins
(``Tassen``) out, not ``Kaffeetasse``, however the model spells them in pieces: one piece
``▁Tassen``, or ``▁Ta`` + ``ssen``. An :class:`ExcludeMatcher` per phrase, built from a scan of the
vocabulary, lists the pieces that would complete the phrase's text after each prefix of it, and
the pieces that carry a hypothesis further into it; mtkit's search tracks every hypothesis's prefixes.
The phrase's piece sequences (its :func:`segmentations` and the pieces that complete it, a bounded
list) are also kept, for engines that ban sequences (CTranslate2's ``suppress_sequences``).

A phrase the model cannot write (a piece of it is ``<unk>``: a character missing from the
vocabulary) is never forced: :class:`PieceConstraints` lists it in ``unwritable`` with the reason,
and the engines report it unmet. Phrases holding a reserved piece's text (``<s>``, ``</s>``,
``<pad>``, ``<unk>``, a language tag ``<2de>``) or a lone surrogate are refused when read.

No torch here: the CTranslate2 engine uses this module too.
"""

from __future__ import annotations

import bisect
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mtkit.data.vocab import check_text
from mtkit.errors import MtkitError, counted

UNK_ID = 1  # mtkit.config's (not imported here: no torch)
# Phrases (include and exclude, a glossary's matches too) one line of `mtkit translate` may hold: the
# constrained search's work and memory grow with them (beam x phrases candidates a step, ranked pairwise),
# and 2,000 on one line took minutes and gigabytes. The server has its own limit (--max-phrases).
MAX_LINE_PHRASES = 256
# Text of reserved pieces: the special pieces and a multilingual model's target-language tags.
_RESERVED = re.compile(r"<(?:/?s|pad|unk|2[^\s<>]+)>")


def check_phrase(phrase: str, where: str, what: str = "phrase") -> None:
    """Raise :class:`MtkitError` naming ``where`` for a phrase no translation may be made to hold: one
    with a lone surrogate, or with a reserved piece's text (``</s>``, ``<2de>``: never text)."""
    check_text(phrase, f"{where}: {what} {phrase!r}")
    found = _RESERVED.search(phrase)
    if found:
        raise MtkitError(f"{where}: {what} {phrase!r} holds {found.group(0)!r}, a reserved piece of the "
                         "vocabulary (a special token or language tag), not text a translation can hold")


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
    def from_json(cls, value: object, where: str, max_phrases: int | None = None) -> Constraints:
        """From a decoded JSON object ``{"include": [str], "exclude": [str]}`` (both optional); an error
        names ``where`` (``FILE: line N`` or a request field), and more than ``max_phrases`` phrases
        (None: any number) is one."""
        if not isinstance(value, dict):
            raise MtkitError(f"{where}: expected a JSON object such as {{\"include\": [\"...\"]}}, "
                             f"got {type(value).__name__}")
        unknown = sorted(set(value) - {"include", "exclude"})
        if unknown:
            raise MtkitError(f"{where}: unknown key {unknown[0]!r}; expected include and/or exclude")
        if max_phrases is not None:
            check_count(sum(len(v) for v in value.values() if isinstance(v, list)), max_phrases, where)
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
                check_phrase(p, where, f"{key} phrase")
            found[key] = tuple(dict.fromkeys(p.strip() for p in phrases))
        clash = set(found["include"]) & set(found["exclude"])
        if clash:
            raise MtkitError(f"{where}: {min(clash)!r} is both included and excluded")
        return cls(found["include"], found["exclude"])


def check_count(phrases: int, limit: int, where: str) -> None:
    """A one-line error naming ``where`` for more than ``limit`` phrases on one line."""
    if phrases > limit:
        raise MtkitError(f"{where}: {phrases} constraint phrases, more than the {limit} a line may hold "
                         "(constrained search's work grows with them)")


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
        except RecursionError:  # a line nested 100,000 deep: one line, never a traceback
            raise MtkitError(f"{where}: nested too deep") from None
        except ValueError as e:
            raise MtkitError(f"{where}: malformed JSON ({str(e)[:120]})") from None
        found.append(Constraints.from_json(value, where, MAX_LINE_PHRASES))
    return found


def constraint_source(per_line: list[Constraints] | None, glossary=None,
                      name: str = "--constraints") -> ConstraintSource:
    """The constraints of input line ``index``: ``per_line[index]`` (from a constraints file; a missing
    line is an error naming ``name``) merged with the ``glossary``'s matches in the line, if any."""

    def source(index: int, line: str) -> Constraints | None:
        found = None
        if per_line is not None:
            if index >= len(per_line):
                raise MtkitError(f"{name}: has {counted(len(per_line), 'line')}, but the input has more "
                                 f"(line {index + 1}); give one JSON object per input line")
            found = per_line[index]
        if glossary is not None:
            found = glossary.constraints(line).merged(found)
            if found:
                check_count(len(found.include) + len(found.exclude), MAX_LINE_PHRASES,
                            f"input line {index + 1} (with the glossary's matches)")
        return found

    return source


@dataclass(frozen=True)
class ExcludeMatcher:
    """One exclude phrase against a vocabulary's pieces: ``text``, the phrase in pieces' text (``▁fünf``);
    ``bans``, (k, piece id) pairs: after the first k characters of ``text`` (written by whole pieces from
    a piece start, k = 0: at any piece start), that piece would complete it (``▁fünfhundert`` at 0,
    ``fhundert`` after ``▁fün``); ``steps``, (k, piece id, k'): the piece writes more of it, up to k'.
    ``start``: the prefix the start of an output counts as written (``▁``: it is a word start)."""

    text: str
    bans: tuple[tuple[int, int], ...]
    steps: tuple[tuple[int, int, int], ...]
    start: int = 0


class ExcludeSet(tuple):
    """A sentence's exclude phrases as piece sequences (a tuple of id tuples: what an engine that bans
    sequences takes) with ``matchers``, one :class:`ExcludeMatcher` per phrase (what mtkit's
    constrained search uses: every spelling of every word the phrase begins)."""

    matchers: tuple[ExcludeMatcher, ...] = ()

    def __new__(cls, sequences=(), matchers=()):
        found = super().__new__(cls, sequences)
        found.matchers = tuple(matchers)
        return found


@dataclass(frozen=True)
class PieceConstraints:
    """Constraints as target ids: ``include`` / ``exclude`` phrases (tuples of ids; ``exclude`` is an
    :class:`ExcludeSet` when encoded by :func:`encode_constraints`), ``texts``, the text of each include
    phrase as the model writes it (what :func:`unmet` looks for), and ``unwritable``: include phrases
    (as given) the model cannot write, which are not forced, with the reason."""

    include: tuple[tuple[int, ...], ...]
    exclude: tuple[tuple[int, ...], ...]
    texts: tuple[str, ...]
    unwritable: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.include or self.exclude)

    @property
    def include_pieces(self) -> int:
        return sum(len(p) for p in self.include)


_MAX_SEGMENTATIONS = 32  # per exclude phrase: its canonical pieces and the next fewest-piece alternatives
_SEARCH_STEPS = 20_000  # per phrase: a long phrase has exponentially many segmentations
_MAX_SEQUENCES = 512  # per exclude phrase: the sequences that complete it (for an engine that bans sequences)
# Entries each of a PieceIndex's memos keeps, the least recently used dropped first: every request of a
# server writes them (its exclude phrases, their characters), so that a stream of distinct phrases
# costs a bounded memory. A glossary repeats its terms, and a sentence's phrases fit many times over.
MEMO_ENTRIES = {"segmentations": 2048, "inner": 1024, "matchers": 1024, "sequences": 512}


class Memo:
    """A dict of at most ``size`` entries, the least recently used dropped first, safe for threads
    (one lock around each read and write; a value is computed outside it, and threads that compute
    the same entry at once store equal values)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def put(self, key, value) -> None:
        with self._lock:
            if key not in self._entries:  # room first: the memo never holds more than its size
                while self._entries and len(self._entries) >= self.size:
                    self._entries.popitem(last=False)
            self._entries[key] = value
            self._entries.move_to_end(key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, key) -> bool:
        with self._lock:
            return key in self._entries


class PieceIndex:
    """A vocabulary's target pieces -> ids (special ids 0-3 left out), and the segmentations, matchers
    and piece sequences found so far, each a :class:`Memo` of :data:`MEMO_ENTRIES` entries. An engine
    builds one (on its first exclude phrase) and owns it; its calls, in any number of threads, share it."""

    def __init__(self, vocab, entries: dict[str, int] | None = None) -> None:
        sizes = {**MEMO_ENTRIES, **(entries or {})}
        self.vocab = vocab
        ids = range(4, vocab.tgt_size)
        self.ids = {piece: i for piece, i in zip(vocab.tgt_pieces(ids), ids)}
        self.longest = max(map(len, self.ids), default=1)
        self.sorted = sorted(self.ids)  # the pieces, for those that start with a text (bisect)
        self.found = Memo(sizes["segmentations"])  # canonical ids -> their segmentations
        self.inner = Memo(sizes["inner"])  # a character -> the pieces holding it after their start
        self.matchers = Memo(sizes["matchers"])  # a phrase's pieces' text -> its ExcludeMatcher
        self.sequences = Memo(sizes["sequences"])  # a phrase's pieces' text -> the piece sequences writing it

    def memos(self) -> dict[str, Memo]:
        return {"segmentations": self.found, "inner": self.inner, "matchers": self.matchers,
                "sequences": self.sequences}

    def starting_with(self, text: str) -> list[int]:
        """Ids of the pieces whose text starts with ``text``."""
        lo = bisect.bisect_left(self.sorted, text)
        hi = bisect.bisect_left(self.sorted, text + "\U0010ffff")
        return [self.ids[p] for p in self.sorted[lo:hi] if p.startswith(text)]

    def holding_inside(self, char: str) -> list[tuple[str, int]]:
        """(piece, id) of the pieces holding ``char`` after their first character."""
        found = self.inner.get(char)
        if found is None:
            found = [(p, i) for p, i in self.ids.items() if char in p[1:]]
            self.inner.put(char, found)
        return found


def has_pieces(vocab) -> bool:
    """Whether ``vocab`` lists its target pieces (a :class:`PieceIndex` can be built of it)."""
    return hasattr(vocab, "tgt_pieces") and hasattr(vocab, "tgt_size")


def segmentations(table: PieceIndex, ids: list[int], limit: int = _MAX_SEGMENTATIONS) -> list[tuple[int, ...]]:
    """``ids`` and other ways to write the same pieces' text with the table's target pieces, fewest
    pieces first (at most ``limit``): a model trained on one segmentation still writes others at
    times, and an excluded phrase must stay out however it is spelt in pieces."""
    key = tuple(ids)
    if any(i < 4 for i in key):
        return [key]
    found = table.found.get(key)
    if found is None:
        found = _segment("".join(table.vocab.tgt_pieces(key)), key, table, limit)
        table.found.put(key, found)
    return found


def matcher(table: PieceIndex, text: str) -> ExcludeMatcher:
    """The :class:`ExcludeMatcher` of an exclude phrase whose pieces' text is ``text`` (``▁fünf``), from
    a scan of the table's target pieces (kept in the table)."""
    found = table.matchers.get(text)
    if found is not None:
        return found
    bans: set[tuple[int, int]] = set()
    steps: set[tuple[int, int, int]] = set()
    for piece, i in table.holding_inside(text[0]):  # an occurrence that starts inside a piece
        for offset in range(1, len(piece)):
            rest = piece[offset:]
            if rest.startswith(text):
                bans.add((0, i))
            elif text.startswith(rest):
                steps.add((0, i, len(rest)))
    for k in range(len(text)):
        tail = text[k:]
        bans.update((k, i) for i in table.starting_with(tail))
        for j in range(1, min(len(tail), table.longest + 1)):  # no piece is longer than the longest
            i = table.ids.get(tail[:j])
            if i is not None:
                steps.add((k, i, k + j))
    found = ExcludeMatcher(text, tuple(sorted(bans)), tuple(sorted(steps)), 1 if text.startswith("▁") else 0)
    table.matchers.put(text, found)
    return found


def _sequences(table: PieceIndex, ids: list[int], found: ExcludeMatcher) -> tuple[tuple[int, ...], ...]:
    """Piece sequences that write an exclude phrase or a word it begins, at most :data:`_MAX_SEQUENCES`:
    its :func:`segmentations`, each one-piece completion, then each completion after two spellings of
    the prefix before it (the shortest prefixes first)."""
    known = table.sequences.get(found.text)
    if known is not None:
        return known
    out = dict.fromkeys(segmentations(table, ids))
    out.update(((i,), None) for k, i in found.bans if k == 0)
    for k in sorted({k for k, _ in found.bans if k > 0}):
        heads = _segment(found.text[:k], None, table, 2)
        for head in heads:
            for kk, i in found.bans:
                if kk == k:
                    out[head + (i,)] = None
        if len(out) >= _MAX_SEQUENCES:
            break
    result = tuple(list(out)[:_MAX_SEQUENCES])
    table.sequences.put(found.text, result)
    return result


def _segment(text: str, canonical: tuple[int, ...] | None, table: PieceIndex, limit: int) -> list[tuple[int, ...]]:
    found = [canonical] if canonical is not None else []
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


def _cannot_write(vocab, phrase: str) -> str:
    """Why ``vocab``'s target model cannot write ``phrase`` (a piece of it is ``<unk>``, or it has none)."""
    if not vocab.encode_tgt(phrase):
        return "the model writes nothing for it (its normalization removes every character); the phrase is not forced"
    missing = [c for c in dict.fromkeys(phrase) if not c.isspace() and UNK_ID in vocab.encode_tgt(c)]
    if not missing:
        return "the model's vocabulary cannot write it (a piece of it is <unk>)"
    return (f"the model cannot write {', '.join(map(repr, missing))} (not in its vocabulary); "
            "the phrase is not forced")


def encode_constraints(constraints: Constraints | None, vocab,
                       pieces: Callable[[], PieceIndex] | None = None) -> PieceConstraints | None:
    """Encode ``constraints`` with ``vocab``'s target model; None for no constraints. ``pieces`` gives
    the :class:`PieceIndex` of ``vocab``'s target pieces (an engine's own; by default one built here). An include phrase
    whose text lies inside another include phrase is dropped: the longer one brings it. An include
    phrase the model cannot write (a piece of it is ``<unk>``) goes to ``unwritable`` instead (forced,
    it would come out as `` ⁇ ``); an exclude phrase it cannot write needs no ban. An exclude phrase
    becomes an :class:`ExcludeMatcher` (for a vocabulary of pieces) and piece sequences."""
    if not constraints:
        return None
    ids = {p: vocab.encode_tgt(p) for p in (*constraints.include, *constraints.exclude)}
    unwritable = {p: _cannot_write(vocab, p) for p in constraints.include if not ids[p] or UNK_ID in ids[p]}
    written = {p: vocab.decode_tgt(ids[p]) for p in ids}
    phrases = [p for p in constraints.include if p not in unwritable]
    include = [p for i, p in enumerate(phrases)  # kept: the first of equal texts, and no text inside a longer one
               if not any(j != i and written[p] in written[q] and (len(written[q]) > len(written[p]) or j < i)
                          for j, q in enumerate(phrases))]
    excluded = [p for p in constraints.exclude if ids[p] and UNK_ID not in ids[p]]
    if has_pieces(vocab):
        table = (pieces() if pieces is not None else PieceIndex(vocab)) if excluded else None
        matchers = [matcher(table, "".join(vocab.tgt_pieces(ids[p]))) for p in excluded]
        sequences = dict.fromkeys(s for p, m in zip(excluded, matchers) for s in _sequences(table, ids[p], m))
        exclude = ExcludeSet(sequences, matchers)
    else:  # a vocabulary without a piece table (tests): the phrases' own ids
        exclude = tuple(tuple(ids[p]) for p in excluded)
    return PieceConstraints(
        include=tuple(tuple(ids[p]) for p in include),
        exclude=exclude,
        texts=tuple(written[p] for p in include),
        unwritable=unwritable,
    )


def unmet(constraints: PieceConstraints | None, text: str) -> list[str]:
    """The include phrases (as the model writes them) that ``text`` lacks."""
    if constraints is None:
        return []
    return [t for t in constraints.texts if t not in text]

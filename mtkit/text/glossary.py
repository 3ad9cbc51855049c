"""Glossaries: pairs of a source term and its target term; where a source line holds the source
term, the translation must hold the target term (an ``include`` constraint).

A source term matches case-insensitively (Unicode case folding) and as whole words: not inside
a longer word (``cup`` does not match ``cupboard``), with any Unicode letter, digit or underscore
counting as part of a word. Where terms overlap, the longest wins (``coffee cup`` before ``cup``).
The target term is forced as written. A glossary file is TSV, ``source term<TAB>target term``
per line; blank lines and lines starting with ``#`` are skipped. A term with a lone surrogate, or a
target term holding a reserved piece's text (``</s>``, ``<2de>``), is an error naming its line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from mtkit.data.vocab import check_text
from mtkit.engines.constraints import Constraints, check_phrase
from mtkit.errors import MtkitError


class Glossary:
    """Source terms and their target terms.

    Args:
        pairs: (source term, target term, where) triples; ``where`` names the pair in errors
            (``FILE: line N`` or a request field).
    """

    def __init__(self, pairs: Iterable[tuple[str, str, str]]) -> None:
        self.targets: dict[str, str] = {}
        seen: dict[str, str] = {}
        for source, target, where in pairs:
            source, target = source.strip(), target.strip()
            if not source or not target:
                raise MtkitError(f"{where}: expected a source term and a target term, both non-empty")
            check_text(source, f"{where}: source term {source!r}")
            check_phrase(target, where, "target term")
            key = source.casefold()
            if key in self.targets and self.targets[key] != target:
                raise MtkitError(f"{where}: {source!r} already has the target term {self.targets[key]!r} "
                                 f"({seen[key]})")
            self.targets.setdefault(key, target)
            seen.setdefault(key, where)
        terms = sorted(self.targets, key=len, reverse=True)  # the longest first: it wins an overlap
        self._pattern = (re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, terms)) + r")(?!\w)", re.IGNORECASE)
                         if terms else None)

    def __len__(self) -> int:
        return len(self.targets)

    @classmethod
    def read(cls, path: Path, flag: str = "--glossary") -> Glossary:
        """A TSV glossary file (see the module docstring); a malformed line is an error naming it."""
        try:
            raw_lines = Path(path).read_bytes().split(b"\n")
        except FileNotFoundError:
            raise MtkitError(f"{flag} {path}: no such file") from None
        except IsADirectoryError:
            raise MtkitError(f"{flag} {path}: is a directory, expected a file") from None
        lines = []
        for number, raw in enumerate(raw_lines, 1):  # the encoding first: a file in another one fails on it
            try:
                lines.append(raw.decode("utf-8").rstrip("\r"))
            except UnicodeDecodeError as e:
                raise MtkitError(f"{flag} {path}: line {number}: not valid UTF-8 "
                                 f"(byte {e.start + 1} of the line)") from None
        pairs = []
        for number, line in enumerate(lines, 1):
            if not line.strip() or line.startswith("#"):
                continue
            fields = line.split("\t")
            where = f"{flag} {path}: line {number}"
            if len(fields) != 2:
                raise MtkitError(f"{where}: expected 'source term<TAB>target term', found {len(fields)} "
                                 f"tab-separated field{'s' if len(fields) != 1 else ''}")
            pairs.append((fields[0], fields[1], where))
        return cls(pairs)

    def constraints(self, line: str) -> Constraints:
        """The target terms of the source terms ``line`` holds, as include constraints."""
        if self._pattern is None:
            return Constraints()
        found = (self.targets.get(m.group(0).casefold()) for m in self._pattern.finditer(line))
        return Constraints(include=tuple(dict.fromkeys(t for t in found if t is not None)))

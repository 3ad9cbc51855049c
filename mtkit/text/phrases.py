"""The phrase files a command reads before any model loads: ``--constraints`` (JSON lines, one object per
input line, :mod:`mtkit.engines.constraints`) and ``--glossary`` (TSV, :mod:`mtkit.text.glossary`), checked
against what the engine and the decoding can do."""

from __future__ import annotations

from pathlib import Path

from mtkit.engines.capabilities import include_refusal
from mtkit.engines.constraints import read_constraints
from mtkit.errors import MtkitError, counted
from mtkit.text.glossary import Glossary


def read_constraint_options(constraints: Path | None, glossary: Path | None, engine: str = "torch",
                            sampling: bool = False):
    """The ``--constraints`` file (a checked list of :class:`Constraints`, one per input line) and the
    ``--glossary`` (a :class:`Glossary`), None for those not given; an error, before any model loads,
    for what the engine or the decoding cannot do (include phrases on CTranslate2, sampling)."""
    if constraints is None and glossary is None:
        return None, None
    per_line = read_constraints(constraints) if constraints is not None else None
    terms = Glossary.read(glossary) if glossary is not None else None
    if sampling:
        raise MtkitError(f"{'--constraints' if constraints is not None else '--glossary'} needs beam search: "
                         "drop --sampling")
    refusal = include_refusal(engine)  # an engine that takes exclude phrases only
    if refusal is not None:
        include = next((n for n, c in enumerate(per_line or [], 1) if c.include), None)
        if terms is not None or include is not None:
            where = "--glossary" if terms is not None else f"--constraints {constraints}: line {include}"
            raise MtkitError(f"{where}: {refusal}")
    return per_line, terms


def check_line_counts(per_line: list | None, flag: str, path: Path | None, lines: int | None) -> None:
    """A constraints file must have one line per input line (``lines``; None: not known yet)."""
    if per_line is not None and lines is not None and len(per_line) != lines:
        raise MtkitError(f"{flag} {path}: has {counted(len(per_line), 'line')}, the input {lines}; "
                         "give one JSON object per input line ({} for none)")

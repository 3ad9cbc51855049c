"""Test sets of real-looking text made from Multi30k's test captions (test_2016_flickr.en), for the
integrity guard (benchmarks/guard.py) and sentence splitting.

* :func:`number_captions`: captions with a phrase inserted that carries what a translation must keep: a
  count ("with 24 balloons"), a time ("at 10:30", "at 7:45 pm"), an amount ("for 1,250 dollars", "for $35",
  "for 12.50 euros"), a decimal ("3.5 meters"), a code ("(photo 4711)", "in room A-113"), a date ("on
  12/24/2020", "on 2020-12-24"), an ordinal ("in the 21st row"), a percentage, a URL, an e-mail address or
  a placeholder ("{name}", "%s"); one phrase per caption, a second in every third.
* :func:`paragraphs`: consecutive lines joined ``k`` to a line with a space.

The same ``seed`` gives the same set on every run and machine (a seeded :class:`random.Random` draws the
phrases and values, in order; nothing else varies)::

    python benchmarks/real_text_sets.py numbers [--n 300] [--seed 1] > numbers.en
    python benchmarks/real_text_sets.py paragraphs --k 3 < lines.en > paragraphs.en
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# $MTKIT_MULTI30K, else ../shared/data/multi30k beside the checkout (or beside its folder: a git worktree's)
DEFAULT_DATA = Path(os.environ.get("MTKIT_MULTI30K") or next(
    (p for p in (REPO.parent / "shared/data/multi30k", REPO.parents[1] / "shared/data/multi30k") if p.is_dir()),
    REPO.parent / "shared/data/multi30k"))
CAPTIONS = "test_2016_flickr.en"

_WORDS = ("photos", "gallery", "team", "event", "park", "beach", "race", "music")
_NAMES = ("name", "user", "city", "0", "1", "count")


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 11 <= n % 100 <= 13 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


# Each phrase: a function of the generator that writes one (at the end of a caption, before its full stop).
PHRASES: list[Callable[[random.Random], str]] = [
    lambda r: f"with {r.randint(2, 99)} balloons",
    lambda r: f"at {r.randint(1, 12)}:{r.choice(['00', '15', '30', '45', '05', '50'])}",
    lambda r: f"at {r.randint(1, 11)}:{r.randint(10, 59)} pm",
    lambda r: f"for {r.randint(1, 99)},{r.randint(0, 999):03d} dollars",
    lambda r: f"for ${r.randint(5, 500)}",
    lambda r: f"for {r.randint(2, 99)}.{r.choice(['50', '99', '25', '75'])} euros",
    lambda r: f"(photo {r.randint(1000, 9999)})",
    lambda r: f"in room {r.choice('ABCDK')}-{r.randint(100, 999)}",
    lambda r: f"on {r.randint(1, 12)}/{r.randint(13, 28)}/{r.randint(1995, 2024)}",
    lambda r: f"on {r.randint(1995, 2024)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
    lambda r: f"{r.randint(1, 9)}.{r.randint(1, 9)} meters away",
    lambda r: f"in the {_ordinal(r.randint(1, 40))} row",
    lambda r: f"{r.randint(10, 95)}% of the time",
    lambda r: f"next to {r.randint(2, 9)},{r.randint(100, 999)} people",
    lambda r: f"(see www.example.com/{r.choice(_WORDS)})",
    lambda r: f"(mail {r.choice(_WORDS)}@example.com)",
    lambda r: f"for {{{r.choice(_NAMES)}}}",
    lambda r: "for %s",
    lambda r: f"wearing number {r.randint(2, 99)}",
    lambda r: f"at {r.randint(1, 12)}:{r.randint(0, 59):02d} on {r.randint(1, 12)}/{r.randint(13, 28)}/2019",
]


def read_captions(data_dir: Path = DEFAULT_DATA) -> list[str]:
    path = data_dir / CAPTIONS
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (set MTKIT_MULTI30K or pass data_dir)")
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _insert(caption: str, phrase: str) -> str:
    body = caption.rstrip()
    end = "."
    if body[-1:] in ".!?":
        body, end = body[:-1].rstrip(), body[-1]
    return f"{body} {phrase}{end}"


def number_captions(n: int = 300, seed: int = 1, captions: Sequence[str] | None = None) -> list[str]:
    """``n`` captions (Multi30k's test captions in order, from the start again past the end), each with a
    phrase from :data:`PHRASES` inserted before its full stop (the phrases taken in turn, their values drawn
    from ``random.Random(seed)``), every third with a second phrase drawn at random."""
    lines = list(captions) if captions is not None else read_captions()
    rng = random.Random(seed)
    out = []
    for i in range(n):
        caption = _insert(lines[i % len(lines)], PHRASES[i % len(PHRASES)](rng))
        if i % 3 == 2:
            caption = _insert(caption, PHRASES[rng.randrange(len(PHRASES))](rng))
        out.append(caption)
    return out


def paragraphs(lines: Sequence[str], k: int = 3) -> list[str]:
    """``lines`` joined ``k`` to a line (consecutive ones, with a space; the last may have fewer)."""
    return [" ".join(lines[i : i + k]) for i in range(0, len(lines), k)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    numbers = sub.add_parser("numbers", help="captions with numbers, times, amounts, codes (stdout)")
    numbers.add_argument("--n", type=int, default=300)
    numbers.add_argument("--seed", type=int, default=1)
    numbers.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    joined = sub.add_parser("paragraphs", help="stdin's lines joined k to a line (stdout)")
    joined.add_argument("--k", type=int, default=3)
    args = parser.parse_args()
    if args.what == "numbers":
        lines = number_captions(args.n, args.seed, read_captions(args.data_dir))
    else:
        lines = paragraphs([line.rstrip("\n") for line in sys.stdin], args.k)
    sys.stdout.write("".join(line + "\n" for line in lines))


if __name__ == "__main__":
    main()

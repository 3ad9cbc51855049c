"""Noisy Multi30k: the en-de training set with web-crawl noise added, for measuring cleaning filters.

    python benchmarks/noisy_multi30k.py MULTI30K_DIR OUT_DIR [--seed 1]

writes OUT_DIR/train.en, train.de (the 29,000 clean pairs plus, drawn with the seed from the same pairs)
and train.kind (each line's kind, for scoring which filter caught what):

  misaligned  10 %  a target of another pair (shuffled targets)
  french      10 %  the same image's French caption instead of the German one
  copy         5 %  the target is the source
  truncated  2.5 %  the target cut to its first third of words
  garbage    2.5 %  the target replaced by symbols, a repeated word, or mojibake

Percentages are of the clean set's size; the lines are shuffled together.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

KINDS = {"misaligned": 0.10, "french": 0.10, "copy": 0.05, "truncated": 0.025, "garbage": 0.025}


def _garbage(rng: random.Random, target: str) -> str:
    choice = rng.randrange(3)
    if choice == 0:  # symbols and digits
        return "".join(rng.choice("#*%$&@!?0123456789=+-_/|<>~^") for _ in range(rng.randint(15, 60)))
    if choice == 1:  # one word repeated
        word = rng.choice(target.split())
        return " ".join([word] * rng.randint(6, 14))
    # mojibake: replacement and private-use characters between the words
    return " ".join(w + rng.choice(["\ufffd", "\ue000\ue001", "\ufffd\ufffd"]) for w in target.split())


def noisy_pairs(en: list[str], de: list[str], fr: list[str], seed: int) -> list[tuple[str, str, str]]:
    """The clean pairs and the noise, shuffled: (source, target, kind) triples."""
    rng = random.Random(seed)
    n = len(en)
    rows = [(s, t, "clean") for s, t in zip(en, de, strict=True)]
    for kind, share in KINDS.items():
        for i in rng.sample(range(n), round(share * n)):
            if kind == "misaligned":
                j = rng.randrange(n - 1)
                target = de[j if j < i else j + 1]
            elif kind == "french":
                target = fr[i]
            elif kind == "copy":
                target = en[i]
            elif kind == "truncated":
                words = de[i].split()
                target = " ".join(words[: max(1, len(words) // 3)])
            else:
                target = _garbage(rng, de[i])
            rows.append((en[i], target, kind))
    rng.shuffle(rows)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("multi30k", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    def read(lang: str) -> list[str]:
        return (args.multi30k / f"train.{lang}").read_text(encoding="utf-8").splitlines()

    rows = noisy_pairs(read("en"), read("de"), read("fr"), args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    for k, suffix in enumerate(("en", "de", "kind")):
        (args.out / f"train.{suffix}").write_text("".join(r[k] + "\n" for r in rows), encoding="utf-8")
    counts = {kind: sum(r[2] == kind for r in rows) for kind in ("clean", *KINDS)}
    print(f"{args.out}: {len(rows)} pairs ({', '.join(f'{k} {v}' for k, v in counts.items())})")


if __name__ == "__main__":
    main()

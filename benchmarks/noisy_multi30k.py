"""Noisy Multi30k: the en-de training set with web-crawl noise added, for measuring cleaning filters.

    python benchmarks/noisy_multi30k.py make MULTI30K_DIR OUT_DIR [--seed 1]
    python benchmarks/noisy_multi30k.py crosstab PREPARED_DIR OUT_DIR

``make``
writes OUT_DIR/train.en, train.de (the 29,000 clean pairs plus, drawn with the seed from the same pairs)
and train.kind (each line's kind, for scoring which filter caught what):

  misaligned  10 %  a target of another pair (shuffled targets)
  french      10 %  the same image's French caption instead of the German one
  copy         5 %  the target is the source
  truncated  2.5 %  the target cut to its first third of words
  garbage    2.5 %  the target replaced by symbols, a repeated word, or mojibake

Percentages are of the clean set's size; the lines are shuffled together.

``crosstab``: which rule or filter of a directory prepared from OUT_DIR's pairs (its manifest's settings,
its SentencePiece model, the dual cross-entropy scores it names) drops each pair, against each pair's kind:
a table of counts, each kind's row summing to its pairs.
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


def first_rule(prepared: Path, noisy: Path) -> list[str]:
    """The rule or filter that drops each pair of ``noisy``'s train.en/de as ``prepared`` was made ("kept")."""
    import json

    import numpy as np

    from mtkit.config import config_from_dict
    from mtkit.data.cleaning import length_mask, make_normalizer, pair_hash
    from mtkit.data.filters import dual_xent_keep, make_filters
    from mtkit.data.vocab import Vocab

    manifest = json.loads((prepared / "manifest.json").read_text())
    data = config_from_dict({"data": {"clean": manifest["clean"], "src_lang": manifest["src_lang"],
                                      "tgt_lang": manifest["tgt_lang"]}}).data
    clean, vocab = data.clean, Vocab.load(prepared)
    normalize, filters = make_normalizer(clean), make_filters(clean.filters, data.src_lang, data.tgt_lang)
    dual = clean.filters.dual_xent if clean.filters is not None else None
    kept_by_dual = dual_xent_keep(Path(dual.forward), Path(dual.backward), dual.keep)[0] if dual else None
    src = (noisy / "train.en").read_text(encoding="utf-8").splitlines()
    tgt = (noisy / "train.de").read_text(encoding="utf-8").splitlines()
    seen: set[int] = set()
    out = []
    for k, (s, t) in enumerate(zip(src, tgt, strict=True)):
        s, t = normalize(s), normalize(t)
        rule = "empty" if clean.drop_empty and (not s or not t) else None
        rule = rule or next((name for name, test in filters if test(s, t) is not None), None)
        if rule is None and kept_by_dual is not None and not kept_by_dual[k]:
            rule = "dual_xent"
        if rule is None:
            lens = [np.array([len(vocab.encode_src(s))]), np.array([len(vocab.encode_tgt(t))])]
            _, too_long, ratio = length_mask(*lens, clean)
            rule = "too_long" if too_long else "ratio" if ratio else None
        if rule is None and clean.dedup:
            h = pair_hash(s, t)
            rule = "duplicate" if h in seen else None
            seen.add(h)
        out.append(rule or "kept")
    return out


def crosstab(prepared: Path, noisy: Path) -> None:
    import json
    from collections import Counter

    rules = first_rule(prepared, noisy)
    kinds = (noisy / "train.kind").read_text().splitlines()
    table = Counter(zip(kinds, rules))
    columns = [r for r in dict.fromkeys(json.loads((prepared / "manifest.json").read_text())["dropped"]["train"])
               if any(rule == r for rule in rules)] + ["kept"]
    print("| kind | pairs | " + " | ".join(columns) + " |")
    print("|---|---:|" + "---:|" * len(columns))
    for kind in ("clean", *KINDS):
        n = sum(k == kind for k in kinds)
        print(f"| {kind} | {n} | " + " | ".join(str(table[kind, c]) for c in columns) + " |")
    dropped = json.loads((prepared / "manifest.json").read_text())["dropped"]["train"]
    mine = Counter(rules)
    assert all(mine[r] == n for r, n in dropped.items() if r != "invalid_utf8"), (dict(mine), dropped)


def main() -> None:
    if len(__import__("sys").argv) > 1 and __import__("sys").argv[1] == "crosstab":
        parser = argparse.ArgumentParser(description="which filter drops which kind of noise")
        parser.add_argument("command")
        parser.add_argument("prepared", type=Path)
        parser.add_argument("noisy", type=Path)
        args = parser.parse_args()
        crosstab(args.prepared, args.noisy)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("make",))
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

"""Test BLEU of Multi30k en-de models on test_2016_flickr as it is and in three harder forms: UPPER CASE,
Title Case (both scored case-insensitively, the input's case being changed) and with 5 % character typos on
the source (seeded; ``mtkit.training.augment.typos``, the modifier train.augment trains with), each model
with its recipe's decoding (beam 5 for the Multi30k recipe), through the Python API.

    .venv/bin/python benchmarks/robustness.py clean=runs/clean noisy=runs/noisy ... [--only plain]

``name=path``: a run directory or checkpoint. ``--only plain`` scores the plain test set alone (the noisy
Multi30k table); ``--limit N`` the first N lines. sacreBLEU's default tokenization; lines/s per model.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MULTI30K = REPO.parent / "shared/data/multi30k"
TYPO_RATE = 0.05


def variants(sources: list[str], only: str | None) -> dict[str, list[str]]:
    from mtkit.training.augment import title_case, typos

    forms = {"plain": sources,
             "upper": [s.upper() for s in sources],
             "title": [title_case(s) for s in sources],
             "typos": [typos(s, TYPO_RATE, np.random.default_rng([7, i])) for i, s in enumerate(sources)]}
    return {k: v for k, v in forms.items() if only is None or k == only}


def main() -> None:
    import sacrebleu

    import mtkit

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="name=run-directory-or-checkpoint")
    parser.add_argument("--multi30k", type=Path, default=DEFAULT_MULTI30K)
    parser.add_argument("--only", choices=("plain", "upper", "title", "typos"))
    parser.add_argument("--limit", type=int, default=0)
    args = parser.parse_args()
    src = (args.multi30k / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    ref = (args.multi30k / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    if args.limit:
        src, ref = src[: args.limit], ref[: args.limit]
    forms = variants(src, args.only)
    rows = []
    for spec in args.models:
        name, path = spec.split("=", 1)
        model = mtkit.load(path)
        row, seconds, lines = {"model": name}, 0.0, 0
        for form, sources in forms.items():
            start = time.perf_counter()
            out = [r.text for r in model.translate(sources)]
            seconds += time.perf_counter() - start
            lines += len(sources)
            lowercase = form in ("upper", "title")
            row[form] = sacrebleu.corpus_bleu(out, [ref], lowercase=lowercase).score
        row["lines/s"] = lines / seconds
        rows.append(row)
        print(name, {k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    print()
    print("| model | " + " | ".join(f"{f}{' (ci)' if f in ('upper', 'title') else ''}" for f in forms)
          + " | lines/s |")
    print("|---|" + "---:|" * (len(forms) + 1))
    for row in rows:
        print(f"| {row['model']} | " + " | ".join(f"{row[f]:.2f}" for f in forms) + f" | {row['lines/s']:.0f} |")


if __name__ == "__main__":
    main()

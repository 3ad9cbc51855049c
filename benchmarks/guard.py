"""The integrity guard: how much of what a source protects (numbers, times, dates, amounts, codes, URLs,
e-mail addresses, placeholders: :func:`mtkit.text.guard.protected_tokens`) reaches its translation, and how
many translations run into a loop (:func:`mtkit.text.guard.looping`), on the captions of
:func:`benchmarks.real_text_sets.number_captions` (Multi30k's test captions with such phrases inserted).

Prints, per setting: tokens kept / protected (the share, and per kind), lines with every token kept,
lines with a loop, and the speed. ``--guard on,off`` passes ``guard=True``/``False`` to
:meth:`mtkit.Model.translate` (a setting the pipeline does not know yet is reported and skipped);
``--from FILE`` scores translations made elsewhere (``mtkit translate``'s output, one line per caption)::

    python benchmarks/guard.py -m ../shared/models/multi30k-en-de [--n 300] [--seed 1] [--beam 5]
    python benchmarks/guard.py --from numbers.de [--n 300] [--seed 1] [--paragraphs 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # real_text_sets beside this script

from real_text_sets import DEFAULT_DATA, number_captions, paragraphs, read_captions  # noqa: E402

from mtkit.errors import MtkitError  # noqa: E402
from mtkit.text.guard import looping, missing, protected_tokens  # noqa: E402


def score(sources: Sequence[str], translations: Sequence[str], src_lang: str, tgt_lang: str) -> dict:
    """Protected tokens kept (all and per kind), lines with all kept, lines with a loop."""
    kept, total, kinds_kept, kinds_total, whole, loops = 0, 0, Counter(), Counter(), 0, 0
    for source, translation in zip(sources, translations):
        tokens = protected_tokens(source, src_lang, tgt_lang)
        lacking = missing(tokens, translation)
        total += len(tokens)
        kept += len(tokens) - len(lacking)
        kinds_total.update(t.kind for t in tokens)
        kinds_kept.update(t.kind for t in tokens)
        kinds_kept.subtract(t.kind for t in lacking)
        whole += not lacking
        loops += looping(translation, source)
    return {"kept": kept, "total": total, "kinds": {k: (kinds_kept[k], n) for k, n in sorted(kinds_total.items())},
            "whole": whole, "lines": len(sources), "loops": loops}


def show(name: str, s: dict, seconds: float | None = None) -> None:
    share = s["kept"] / max(1, s["total"])
    speed = f", {s['lines'] / seconds:.1f} lines/s" if seconds else ""
    print(f"{name}: protected tokens kept {s['kept']}/{s['total']} = {100 * share:.1f} %; lines with all kept "
          f"{s['whole']}/{s['lines']} = {100 * s['whole'] / max(1, s['lines']):.1f} %; lines with a loop "
          f"{s['loops']}/{s['lines']} = {100 * s['loops'] / max(1, s['lines']):.1f} %{speed}")
    print("  per kind: " + ", ".join(f"{k} {a}/{n} ({100 * a / n:.0f} %)" for k, (a, n) in s["kinds"].items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", type=Path, help="a model mtkit.load reads (run directory, checkpoint, ...)")
    parser.add_argument("--from", dest="given", type=Path, help="score these translations instead (one per line)")
    parser.add_argument("--n", type=int, default=300, help="captions in the set")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--paragraphs", type=int, default=1, help="captions joined k to a line (1: one per line)")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--guard", default="", help="comma-separated settings of translate's guard= (on, off); "
                                                   "none: the pipeline as it is")
    parser.add_argument("--src-lang", default="en")
    parser.add_argument("--tgt-lang", default="de")
    parser.add_argument("--threads", type=int, default=0,
                        help="CPU threads (0: those other work leaves free, as mtkit translate chooses)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--save", type=Path, help="a folder to write the sources and each setting's translations "
                                                  "to (sources.txt, as-it-is.txt, guard-on.txt ...), for --from")
    args = parser.parse_args()
    if (args.model is None) == (args.given is None):
        parser.error("give one of -m MODEL or --from FILE")
    sources = number_captions(args.n, args.seed, read_captions(args.data_dir))
    if args.paragraphs > 1:
        sources = paragraphs(sources, args.paragraphs)
    print(f"# {len(sources)} lines (number_captions(n={args.n}, seed={args.seed}), paragraphs of "
          f"{args.paragraphs}), {args.src_lang}→{args.tgt_lang}")
    if args.given is not None:
        translations = args.given.read_text(encoding="utf-8").splitlines()
        if len(translations) != len(sources):
            sys.exit(f"error: {args.given}: {len(translations)} lines for {len(sources)} sources")
        show(str(args.given), score(sources, translations, args.src_lang, args.tgt_lang))
        return

    import mtkit

    if args.save is not None:
        args.save.mkdir(parents=True, exist_ok=True)
        (args.save / "sources.txt").write_text("".join(f"{s}\n" for s in sources), encoding="utf-8")
    model = mtkit.load(args.model, threads=args.threads)
    print(f"# {args.model}, beam {args.beam}")
    settings = [s.strip() for s in args.guard.split(",") if s.strip()] or [None]
    for setting in settings:
        extra = {} if setting is None else {"guard": setting in ("on", "true", "1")}
        try:
            model.translate(sources[:2], beam=args.beam, **extra)  # a warm-up
            start = time.perf_counter()
            results = model.translate(sources, beam=args.beam, **extra)
            seconds = time.perf_counter() - start
        except (TypeError, MtkitError) as e:  # a guard= the pipeline does not take yet
            print(f"guard={setting}: not run ({e})")
            continue
        name = "as it is" if setting is None else f"guard={setting}"
        if args.save is not None:
            file = args.save / f"{'as-it-is' if setting is None else f'guard-{setting}'}.txt"
            file.write_text("".join(f"{r.text}\n" for r in results), encoding="utf-8")
        show(name, score(sources, [r.text for r in results], args.src_lang, args.tgt_lang), seconds)


if __name__ == "__main__":
    main()

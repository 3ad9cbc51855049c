"""Real text through the line pipeline (mtkit.text.pipeline): what sentence splitting and the integrity guard cost
on lines of one sentence, and what they give on paragraphs.

One process, one loaded model; every setting translates the same lines, in rounds that alternate the settings
(so a busy machine slows each alike), and the figures are each setting's best round:

* ``test_2016_flickr`` one caption a line (1,000 lines, one sentence each): lines/s and sacreBLEU with
  ``split=none, guard=off`` (the engine alone), ``split=sentences``, ``guard=on`` and both (the default), and
  each one's cost against the engine alone;
* the same captions joined three to a line (334 paragraphs): sacreBLEU against the references joined the same
  way, with and without splitting, beside the captions translated one per line and joined after.

    python benchmarks/real_text.py -m ../shared/models/multi30k-en-de [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import sacrebleu

import mtkit

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
SETTINGS = {"engine alone": {"split": "none", "guard": False}, "split": {"split": "sentences", "guard": False},
            "guard": {"split": "none", "guard": True}, "split + guard (default)": {"split": "sentences", "guard": True}}


def joined(lines: list[str], k: int = 3) -> list[str]:
    return [" ".join(lines[i:i + k]) for i in range(0, len(lines), k)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--data", type=Path, default=DATA, help="the folder of test_2016_flickr.{en,de}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    src = (args.data / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    ref = (args.data / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    model = mtkit.load(args.model, threads=args.threads)
    print(f"# {args.model}, {model.kind} engine, {args.threads} thread(s), its own decoding settings "
          f"(beam {model.decode.beam}); {time.strftime('%Y-%m-%d')}")
    model.translate(src[:50])  # warm
    best: dict[str, float] = {}
    outputs: dict[str, list[str]] = {}
    for _ in range(args.rounds):
        for name, options in SETTINGS.items():
            started = time.perf_counter()
            outputs[name] = [r.text for r in model.translate(src, **options)]
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - started)
    base = best["engine alone"]
    print(f"\none caption a line ({len(src)} lines)")
    print(f"{'setting':26} {'lines/s':>8} {'cost':>7} {'BLEU':>6}")
    for name in SETTINGS:
        bleu = sacrebleu.corpus_bleu(outputs[name], [ref]).score
        print(f"{name:26} {len(src) / best[name]:8.1f} {best[name] / base - 1:+7.1%} {bleu:6.2f}")
    paragraphs, refs = joined(src), joined(ref)
    print(f"\nthree captions a line ({len(paragraphs)} lines), BLEU against the references joined alike")
    one_by_one = sacrebleu.corpus_bleu(joined(outputs["engine alone"]), [refs]).score
    print(f"{'captions one per line, joined after':40} {one_by_one:6.2f}")
    for name in ("engine alone", "split + guard (default)"):
        hyps = [r.text for r in model.translate(paragraphs, **SETTINGS[name])]
        bleu = sacrebleu.corpus_bleu(hyps, [refs]).score
        words = sum(len(h.split()) for h in hyps) / max(1, sum(len(h.split()) for h in joined(outputs[name])))
        print(f"{'paragraphs, ' + name:40} {bleu:6.2f}  ({bleu / one_by_one:.1%} of it; {words:.2f}x the words)")


if __name__ == "__main__":
    sys.exit(main())

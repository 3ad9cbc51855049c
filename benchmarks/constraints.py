"""Lexically constrained decoding (issue #24): how often the constraints are met, what they do to BLEU,
and what they cost in speed, on Multi30k en→de test_2016_flickr with a trained model.

Constraints are drawn from the reference as Post & Vilar (2018) draw them: per sentence, 1 or 2
random phrases of 1 to 3 reference words (non-overlapping; punctuation at a phrase's edges dropped),
seeded (``--seed``). Each setting translates the whole test set with mtkit's torch engine, batched
(the checkpoint's ``decode.batch_tokens``), beam ``--beam`` (default 5) and the checkpoint's length
penalty:

* satisfaction: the share of phrases, and of sentences with all their phrases, found in the
  detokenized output (as the model writes them: through its SentencePiece normalization);
* BLEU: sacreBLEU's default (cased, 13a) against the reference, with and without constraints;
* speed: sentences per second, each setting timed ``--repeats`` times (the best kept), in
  turn, after a warm-up; the ratio is constrained / unconstrained.

Usage::

    .venv/bin/python benchmarks/constraints.py -m RUN [--data-dir DIR] [--beam 5] [--threads 2]

``--data-dir`` defaults to ``$MTKIT_MULTI30K`` or ``../shared/data/multi30k`` (read, never written).
"""

from __future__ import annotations

import argparse
import os
import random
import string
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = Path(os.environ.get("MTKIT_MULTI30K", REPO.parent / "shared/data/multi30k"))
EDGE_PUNCTUATION = string.punctuation + "„“”‚‘’«»…–—"


def draw_phrases(reference: str, k: int, rng: random.Random) -> list[str]:
    """Up to ``k`` non-overlapping phrases of 1-3 consecutive words of ``reference`` (Post & Vilar 2018)."""
    words = reference.split()
    taken: set[int] = set()
    phrases: list[str] = []
    for _ in range(20 * k):
        if len(phrases) == k or not words:
            break
        n = rng.randint(1, min(3, len(words)))
        start = rng.randrange(len(words) - n + 1)
        span = set(range(start, start + n))
        if span & taken:
            continue
        phrase = " ".join(words[start : start + n]).strip(EDGE_PUNCTUATION + " ")
        if phrase and phrase not in phrases:
            phrases.append(phrase)
            taken |= span
    return phrases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", type=Path, required=True, help="run directory or checkpoint (en→de)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA,
                        help="folder holding test_2016_flickr.en/.de (default: $MTKIT_MULTI30K or "
                             "../shared/data/multi30k)")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--phrases", default="1,2", help="phrases per sentence, one setting each (comma-separated)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="timings per setting (the best is kept)")
    parser.add_argument("--sentences", type=int, default=0, help="the first N test sentences (0: all)")
    args = parser.parse_args()
    src_file, ref_file = args.data_dir / "test_2016_flickr.en", args.data_dir / "test_2016_flickr.de"
    for path in (src_file, ref_file):
        if not path.is_file():
            sys.exit(f"error: {path}: no such file (use --data-dir or set MTKIT_MULTI30K)")
    counts = [int(k) for k in args.phrases.split(",") if k.strip()]

    import sacrebleu
    import torch

    from mtkit.checkpoints.io import describe, load_model
    from mtkit.engines.constraints import Constraints
    from mtkit.engines.engine import EngineOptions
    from mtkit.engines.torch_engine import TorchEngine
    from mtkit.host_memory import keep_freed_memory

    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as the mtkit CLI does
    sources = src_file.read_text(encoding="utf-8").splitlines()
    references = ref_file.read_text(encoding="utf-8").splitlines()
    if args.sentences:
        sources, references = sources[: args.sentences], references[: args.sentences]
    loaded = load_model(args.model, "cpu")
    decode = loaded.config.decode
    decode = replace(decode, beam=args.beam, nbest=1)
    translator = TorchEngine(loaded, decode, EngineOptions(warn=False))  # its warnings (unmet phrases) unsaid
    print(f"# {' '.join(sys.argv)}")
    print(f"# model {describe(loaded)}; {len(sources)} sentences; beam {decode.beam}, {decode.length_penalty} "
          f"alpha {decode.alpha}, batch_tokens {decode.batch_tokens}; torch {torch.__version__}, "
          f"{args.threads} threads, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)

    settings: dict[str, list[Constraints] | None] = {"none": None}
    for k in counts:
        rng = random.Random(args.seed * 1000 + k)
        name = f"{k} phrase{'s' if k > 1 else ''}"
        settings[name] = [Constraints(tuple(draw_phrases(r, k, rng))) for r in references]

    def run(wanted):
        source = None if wanted is None else (lambda i, line: wanted[i])
        start = time.perf_counter()
        found = list(translator.translate(sources, buffer_size=len(sources), constraints=source))
        return found, time.perf_counter() - start

    warm = min(64, len(sources))  # warm-up: the allocator, the threads, both searches
    list(translator.translate(sources[:warm]))
    first = next(w for w in settings.values() if w is not None) if counts else None
    if first is not None:
        list(translator.translate(sources[:warm], constraints=lambda i, line: first[i]))
    best: dict[str, float] = {}
    outputs: dict[str, list] = {}
    for _ in range(max(1, args.repeats)):
        for name, wanted in settings.items():
            found, seconds = run(wanted)
            best[name] = min(seconds, best.get(name, float("inf")))
            outputs[name] = found

    rows = []
    base_bleu = base_speed = None
    for name, wanted in settings.items():
        found = outputs[name]
        hyps = [t.best.text for t in found]
        bleu = sacrebleu.corpus_bleu(hyps, [references]).score
        speed = len(sources) / best[name]
        if wanted is None:
            base_bleu, base_speed = bleu, speed
            rows.append([name, "-", "-", f"{bleu:.2f}", "", f"{speed:.1f}", "1.00"])
            continue
        phrases = sum(len(c.include) for c in wanted)
        missing = sum(len(t.unmet) for t in found)
        sentences_met = sum(not t.unmet for t in found)
        rows.append([name, f"{100 * (phrases - missing) / max(1, phrases):.2f}% of {phrases}",
                     f"{100 * sentences_met / len(found):.2f}%", f"{bleu:.2f}", f"{bleu - base_bleu:+.2f}",
                     f"{speed:.1f}", f"{speed / base_speed:.2f}"])
    header = ["constraints", "phrases met", "sentences met", "BLEU", "Δ BLEU", "sent/s", "speed ratio"]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    print(f"# BLEU: sacreBLEU {sacrebleu.__version__} default (cased, 13a); issue #24's targets: phrases met >= 99%, "
          "speed ratio >= 0.5")
    print(f"# load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()

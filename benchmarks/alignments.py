"""Word alignments of mtkit models against eflomal's, on Multi30k test_2016_flickr, and what they cost.

For each model given (a run directory or checkpoint; ``name=path``), the test pairs (the English source and
the German reference) are aligned by the model (``Engine.align``: its guided head if it has one, else the
penultimate decoder layer's mean cross-attention; hard, one source word per target word), and scored
against eflomal's grow-diag-final-and alignments of the same pairs, computed on train + test together (the
reference a user would otherwise run; no human gold alignments here): precision, recall, F1 and AER
(= 1 - F1, every reference link taken as sure). For a model without a guided head, every decoder layer is
scored too, and the penultimate layer read one step later ("shift", Chen et al. 2020: the attention of
the step whose input is the target word, not the step that predicts it).

The markup test: each test sentence with ``<b>`` around one content word (4 letters or more) whose most
frequent translation in the training pairs (by eflomal) the model writes exactly once in its plain output,
translated as ``--format html`` does: how many tags wrap that translation, and how many outputs are
well-formed.

Then each model translates the test set (its recipe's decoding): sacreBLEU, and lines/s without and with
``--alignments`` (best of ``--repeats`` runs, in this process, one engine per model).

Usage::

  .venv/bin/python benchmarks/alignments.py attention=../shared/models/multi30k-en-de guided=work/guided
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MULTI30K = REPO.parent / "shared/data/multi30k"


def eflomal_reference(multi30k: Path, test: str, src: str, tgt: str
                      ) -> tuple[list[list[tuple[int, int]]], dict[str, str]]:
    """eflomal's symmetrized alignments of the test pairs, aligned together with the training pairs, and the
    training pairs' most frequent translation of each source word (lowercased, punctuation stripped)."""
    from mtkit.data.alignments import eflomal_align
    from mtkit.data.word_alignment import parse_pharaoh

    train_src = (multi30k / f"train.{src}").read_text(encoding="utf-8").splitlines()
    train_tgt = (multi30k / f"train.{tgt}").read_text(encoding="utf-8").splitlines()
    test_src = (multi30k / f"{test}.{src}").read_text(encoding="utf-8").splitlines()
    test_tgt = (multi30k / f"{test}.{tgt}").read_text(encoding="utf-8").splitlines()
    everything = eflomal_align(train_src + test_src, train_tgt + test_tgt)
    counts: dict[str, Counter] = {}
    for line, s, t in zip(everything, train_src, train_tgt):
        sw, tw = s.split(), t.split()
        for a, b in parse_pharaoh(line, len(sw), len(tw), "eflomal"):
            counts.setdefault(bare(sw[a]), Counter())[bare(tw[b])] += 1
    lexicon = {w: c.most_common(1)[0][0] for w, c in counts.items() if sum(c.values()) >= 5}
    found = everything[len(train_src):]
    return [parse_pharaoh(line, len(s.split()), len(t.split()), f"eflomal, test line {k + 1}")
            for k, (line, s, t) in enumerate(zip(found, test_src, test_tgt, strict=True))], lexicon


def bare(word: str) -> str:
    return word.strip(".,;:!?\"'()").lower()


def markup_test(engine, lines: list[str], lexicon: dict[str, str]) -> tuple[int, int, int, int]:
    """Each test sentence with <b> around a content word (4 letters or more) whose training translation the
    model writes once in its plain output: (tags placed on that translation, tags tested, well-formed
    outputs, outputs)."""
    import re

    from mtkit.text.markup import MarkupError, _tokens, translate_markup

    plain = [t.best.text for t in engine.translate(lines)]
    cases = []
    for line, output in zip(lines, plain, strict=True):
        words = line.split()
        out = [bare(w) for w in output.split()]
        for k, w in enumerate(words):
            want = lexicon.get(bare(w))
            if len(bare(w)) >= 4 and want and out.count(want) == 1:
                cases.append((" ".join(words[:k] + [f"<b>{w}</b>"] + words[k + 1 :]), want))
                break

    def translate(sentences):
        return [(t.best.text, t.best.alignment or []) for t in
                engine.translate(sentences, options=dataclasses.replace(engine.decode, alignments="hard"))]

    results = translate_markup([m for m, _ in cases], "html", translate)
    right = formed = 0
    for (_, want), result in zip(cases, results, strict=True):
        try:
            tags = [t.text for t in _tokens(result, "html") if t.kind != "text"]
            formed += tags == ["<b>", "</b>"]
        except MarkupError:
            continue
        inside = re.search(r"<b>(.*?)</b>", result)
        right += inside is not None and want in [bare(w) for w in inside.group(1).split()]
    return right, len(cases), formed, len(results)


def shifted(engine, lines: list[str], refs: list[str], layer: int) -> list[list[tuple[int, int]]]:
    """Hard alignments from ``layer``'s mean attention one step later (Shift-Att): target piece t's row is the
    step whose input is t (the reference forced, its EOS appended, the first row dropped)."""
    from mtkit.config import EOS_ID
    from mtkit.data.word_alignment import word_alignment

    call = engine.call()
    found = []
    for start in range(0, len(lines), 64):
        chunk, targets = lines[start : start + 64], refs[start : start + 64]
        src = [call.vocab.encode_src(line)[: engine.max_src_len(call.decode) - 1] + [EOS_ID] for line in chunk]
        out = [call.vocab.encode_tgt(t) for t in targets]
        maps = engine.attention_batch(src, [ids + [EOS_ID] for ids in out], call, layer, None)
        for line, ids, s, attention in zip(chunk, out, src, maps, strict=True):
            words = call.vocab.src_words(line)[: len(s) - 1] + [-1]
            found.append(word_alignment(attention[1:], words, call.vocab.tgt_words(ids)))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="name=path: a run directory or checkpoint each")
    parser.add_argument("--multi30k", type=Path, default=Path(os.environ.get("MTKIT_MULTI30K", DEFAULT_MULTI30K)))
    parser.add_argument("--test", default="test_2016_flickr")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not (args.multi30k / "train.en").is_file():
        sys.exit(f"error: Multi30k not found at {args.multi30k} (set --multi30k or MTKIT_MULTI30K)")

    import sacrebleu

    from mtkit.api import LoadOptions, load_models
    from mtkit.data.word_alignment import default_layer, scores

    t = time.perf_counter()
    reference, lexicon = eflomal_reference(args.multi30k, args.test, "en", "de")
    print(f"eflomal reference: {sum(map(len, reference))} links on {len(reference)} test pairs "
          f"({time.perf_counter() - t:.0f} s, train + test aligned together)", flush=True)
    lines = (args.multi30k / f"{args.test}.en").read_text(encoding="utf-8").splitlines()
    refs = (args.multi30k / f"{args.test}.de").read_text(encoding="utf-8").splitlines()

    def row(name: str, found) -> None:
        s = scores(found, reference)
        print(f"| {name} | {s['precision'] * 100:.1f} | {s['recall'] * 100:.1f} | {s['f1'] * 100:.1f} "
              f"| {s['aer'] * 100:.1f} |", flush=True)

    print("\n| alignments | precision | recall | F1 | AER (vs eflomal) |\n|---|---|---|---|---|")
    engines = {}
    for spec in args.models:
        name, _, path = spec.partition("=")
        engine = load_models([Path(path)], LoadOptions(engine="torch", device="cpu", threads=0,
                                                       any_target=False)).engine  # says nothing: no handler
        engines[name] = engine
        how = f"guided head (layer {engine.guided[0]}, head {engine.guided[1]})" if engine.guided else \
            f"layer {default_layer(engine.decoder_layers)} mean"
        row(f"{name}: {how}", engine.align(lines, refs))
        if engine.guided is None:
            for layer in range(engine.decoder_layers):
                options = dataclasses.replace(engine.decode, alignment_layer=layer)
                row(f"{name}: layer {layer} mean", engine.align(lines, refs, options))
            layer = default_layer(engine.decoder_layers)
            row(f"{name}: layer {layer} mean, shifted", shifted(engine, lines, refs, layer))

    print("\n| markup test (<b> around a word the model translates) | tags on its translation | well-formed |\n"
          "|---|---|---|")
    for name, engine in engines.items():
        right, cases, formed, outputs = markup_test(engine, lines, lexicon)
        print(f"| {name} | {right}/{cases} ({right / max(cases, 1):.1%}) | {formed}/{outputs} |", flush=True)

    print("\n| model | sacreBLEU | lines/s | lines/s with --alignments | cost |\n|---|---|---|---|---|")
    for name, engine in engines.items():
        timings = {}
        for aligning in ("off", "hard"):
            options = dataclasses.replace(engine.decode, alignments=aligning)
            best = float("inf")
            for _ in range(args.repeats):
                t = time.perf_counter()
                outputs = [tr.best.text for tr in engine.translate(lines, options=options)]
                best = min(best, time.perf_counter() - t)
            timings[aligning] = best
        bleu = sacrebleu.corpus_bleu(outputs, [refs]).score
        off, on = len(lines) / timings["off"], len(lines) / timings["hard"]
        print(f"| {name} | {bleu:.2f} | {off:.1f} | {on:.1f} | {timings['hard'] / timings['off'] - 1:+.1%} |",
              flush=True)


if __name__ == "__main__":
    main()

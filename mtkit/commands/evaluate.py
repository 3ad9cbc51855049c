"""``mtkit evaluate``: score detokenized hypotheses against raw references, as a table or JSON.

Lines are read as UTF-8 (``.gz`` too) with trailing whitespace removed, exactly
as the ``sacrebleu`` command line reads them, so the scores are the ones it
prints. Several ``--ref`` files are several references per sentence. Several
``--hyp`` files are compared with paired bootstrap resampling (sacrebleu's
``paired-bs``, seed ``$SACREBLEU_SEED`` or 12345); the first is the baseline.
One of the files may be ``-``, stdin. :func:`evaluate_lines` scores lines already
in memory (translations, sacrebleu test sets), each stream named by a label.

JSON schema (``--json``, ``schema_version`` 1; keys are never removed or renamed
within a schema version)::

    {
      "mtkit_version": str,
      "schema_version": 1,
      "hyp": str,                  # path of the (first) hypothesis file ("<stdin>" for -), or
                                   # the --model that translated them in memory
      "refs": [str, ...],          # reference paths, one per reference stream (for --testset:
                                   # "NAME:LANGPAIR" and the stream number)
      "n_sentences": int,
      "scores": [                  # one entry per metric, in the order asked for
        {"metric": "BLEU", "score": float, "signature": str,
         "counts": [int]*4, "totals": [int]*4, "precisions": [float]*4,
         "bp": float, "sys_len": int, "ref_len": int},
        {"metric": "chrF2" | "chrF2++", "score": float, "signature": str,
         "char_order": int, "word_order": int, "beta": int},
        {"metric": "TER", "score": float, "signature": str,
         "num_edits": int, "ref_length": float},
        # with --lc-tok / --compound-split, BLEU entries named
        # "BLEU-lc-tok" / "BLEU-tok-compound" (same keys as BLEU)
      ],
      "paired_test": null | {      # null unless several --hyp files were given
        "method": "paired_bs",
        "n_samples": int,
        "baseline": str,           # = "hyp"
        "systems": [               # baseline first, then the other --hyp files in order
          {"hyp": str,
           "scores": [{"metric": str, "score": float, "mean": float,
                       "ci95": float,            # half-width of the 95% interval
                       "p_value": float | null,  # null for the baseline
                       "signature": str}]}
        ]
      }
    }

``score`` values are full-precision floats; the table rounds to two decimals.
For ``BLEU-lc-tok`` and ``BLEU-tok-compound`` see :mod:`mtkit.metrics`: they
are for comparison with older papers and are not comparable with sacreBLEU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

import mtkit
from mtkit.errors import MtkitError
from mtkit.io import read_lines
from mtkit.metrics import (
    BleuScore,
    BootstrapScore,
    MetricScore,
    load_pairs_refs,
    load_testset,
    paired_bootstrap,
    score,
)

__all__ = ["evaluate_files", "evaluate_lines", "read_named", "load_testset", "load_pairs_refs", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1
STDIN = "<stdin>"

Named = tuple[str, list[str]]  # (label: a path, or what produced the lines), the lines


def _read_stdin() -> list[str]:
    lines = []
    for number, raw in enumerate(sys.stdin.buffer, start=1):
        try:
            lines.append(raw.decode("utf-8").rstrip())
        except UnicodeDecodeError as e:
            raise MtkitError(f"{STDIN}: line {number}: invalid UTF-8 (byte {e.start + 1} of the line)") from None
    return lines


def read_named(paths: Sequence[str | Path]) -> list[Named]:
    """Each file's lines, trailing whitespace removed (as the sacrebleu command line reads them);
    ``-`` is stdin, which can be read once only."""
    if sum(str(p) == "-" for p in paths) > 1:
        raise MtkitError("only one of the --hyp/--ref files can be '-' (stdin)")
    return [(STDIN, _read_stdin()) if str(p) == "-" else (str(p), _read(p)) for p in paths]


def _read(path: str | Path) -> list[str]:
    return [line.rstrip() for line in read_lines(path)]  # type: ignore[union-attr]


def _infer_lang(labels: list[str]) -> str | None:
    """The language code a file name ends with (``test.de``, ``test.lc.norm.tok.de.gz``), if any."""
    for label in labels:
        suffixes = [s.lstrip(".") for s in Path(label).suffixes if s != ".gz"]
        if suffixes and len(suffixes[-1]) == 2 and suffixes[-1].isalpha():  # ISO 639-1, not "txt"
            return suffixes[-1].lower()
    return None


def evaluate_files(
    hyp_paths: list[Path],
    ref_paths: list[Path],
    metrics: list[str],
    chrf_plus: bool,
    lc_tok: bool,
    as_json: bool,
    *,
    compound_split: bool = False,
    lang: str | None = None,
    n_samples: int = 1000,
    lowercase: bool = False,
) -> str:
    """Score hypothesis files against reference files; return the table or JSON text to print.

    Args:
        hyp_paths: one hypothesis file, or several to compare (the first is the baseline); ``-`` is stdin.
        ref_paths: one or more reference files (several references per sentence).
        others: as :func:`evaluate_lines`.
    """
    if not hyp_paths:
        raise MtkitError("no hypothesis file given: pass --hyp FILE")
    if not ref_paths:
        raise MtkitError("no reference file given: pass --ref FILE")
    named = read_named([*ref_paths, *hyp_paths])
    return evaluate_lines(named[len(ref_paths):], named[: len(ref_paths)], metrics, chrf_plus, lc_tok, as_json,
                          compound_split=compound_split, lang=lang, n_samples=n_samples, lowercase=lowercase)


def evaluate_lines(
    hyps: list[Named],
    refs: list[Named],
    metrics: list[str],
    chrf_plus: bool,
    lc_tok: bool,
    as_json: bool,
    *,
    compound_split: bool = False,
    lang: str | None = None,
    n_samples: int = 1000,
    lowercase: bool = False,
) -> str:
    """Score hypothesis lines against reference lines; return the table or JSON text to print.

    Args:
        hyps: (label, lines) of one system, or of several to compare (the first is the baseline).
        refs: (label, lines) of one or more reference streams (several references per sentence).
        metrics: any of ``bleu``, ``chrf``, ``ter``.
        chrf_plus: report chrF++ instead of chrF.
        lc_tok: also report Multi30k-style lowercased tokenized BLEU (references raw or official lc-tok).
        as_json: return JSON (schema in the module docstring) instead of a table.
        compound_split: also report legacy WMT14 tokenized BLEU with compound splitting.
        lang: target language (``--lang``): Moses rules, and sacreBLEU's zh/ja/ko tokenizers as with
            ``sacrebleu -l``; without it, tokenized BLEU infers the Moses language from the labels' file names.
        n_samples: bootstrap resamples for the paired test.
        lowercase: case-insensitive BLEU and chrF (as ``sacrebleu -lc``), e.g. for a model trained
            on lowercased text.
    """
    if not hyps:
        raise MtkitError("no hypotheses given: pass --hyp FILE")
    if not refs:
        raise MtkitError("no references given: pass --ref FILE")
    hyp_labels, hyp_lines = [h[0] for h in hyps], [h[1] for h in hyps]
    ref_labels, ref_lines = [r[0] for r in refs], [r[1] for r in refs]
    for hyp_label, lines in hyps:
        for ref_label, ref in refs:
            if len(lines) != len(ref):
                raise MtkitError(
                    f"line counts differ: {hyp_label} has {len(lines)} lines, {ref_label} has {len(ref)}"
                )
    if not ref_lines[0]:
        raise MtkitError(f"{ref_labels[0]}: empty file, nothing to score")
    moses_lang = None
    if (lc_tok or compound_split) and lang is None:
        # Inferred only for the Moses rules: sacreBLEU's own tokenizer changes only on an explicit --lang.
        moses_lang = _infer_lang(ref_labels) or _infer_lang(hyp_labels)
        if moses_lang is None:
            raise MtkitError(
                f"tokenized BLEU needs the target language and none can be read from {ref_labels[0]}: pass --lang"
            )
    options = dict(
        metrics=metrics,
        chrf_plus=chrf_plus,
        lowercase_tok=lc_tok,
        compound_split=compound_split,
        lang=lang,
        moses_lang=moses_lang,
        lowercase=lowercase,
    )
    results = score(hyp_lines[0], ref_lines, **options)
    paired = None
    if len(hyps) > 1:
        paired = paired_bootstrap(list(zip(hyp_labels, hyp_lines)), ref_lines, n_samples=n_samples, **options)
    if as_json:
        return _to_json(hyp_labels, ref_labels, len(ref_lines[0]), results, paired, n_samples)
    return _to_table(hyp_labels, ref_labels, len(ref_lines[0]), results, paired)


def _to_json(
    hyp_paths: list[str],
    ref_paths: list[str],
    n: int,
    results: list[MetricScore],
    paired: list[list[BootstrapScore]] | None,
    n_samples: int,
) -> str:
    doc: dict = {
        "mtkit_version": mtkit.__version__,
        "schema_version": SCHEMA_VERSION,
        "hyp": str(hyp_paths[0]),
        "refs": [str(p) for p in ref_paths],
        "n_sentences": n,
        "scores": [r.to_dict() for r in results],
        "paired_test": None,
    }
    if paired is not None:
        doc["paired_test"] = {
            "method": "paired_bs",
            "n_samples": n_samples,
            "baseline": str(hyp_paths[0]),
            "systems": [
                {
                    "hyp": str(path),
                    "scores": [{k: v for k, v in s.to_dict().items() if k != "system"} for s in row],
                }
                for path, row in zip(hyp_paths, paired)
            ],
        }
    return json.dumps(doc, indent=2, ensure_ascii=False)


def _to_table(
    hyp_paths: list[str],
    ref_paths: list[str],
    n: int,
    results: list[MetricScore],
    paired: list[list[BootstrapScore]] | None,
) -> str:
    lines = [f"refs: {', '.join(map(str, ref_paths))}  ({n} sentences)"]
    if paired is None:
        lines.append(f"hyp:  {hyp_paths[0]}")
        width = max(len(r.metric) for r in results)
        for r in results:
            detail = ""
            if isinstance(r, BleuScore):
                precisions = "/".join(f"{p:.1f}" for p in r.precisions)
                ratio = r.sys_len / r.ref_len if r.ref_len else 0.0
                detail = f"  {precisions} (BP {r.bp:.3f}, ratio {ratio:.3f}, hyp_len {r.sys_len}, ref_len {r.ref_len})"
            lines.append(f"{r.metric:<{width}}  {r.score:6.2f}{detail}")
        signatures = [(r.metric, r.signature) for r in results]
    else:
        metric_names = [s.metric for s in paired[0]]
        header = ["system"] + [f"{m} (mean ± 95% CI)" for m in metric_names]
        rows = [header]
        for path, row in zip(hyp_paths, paired):
            cells = [str(path)]
            for s in row:
                p = "" if s.p_value is None else f" p={s.p_value:.4f}{'*' if s.p_value < 0.05 else ''}"
                cells.append(f"{s.score:.2f} ({s.mean:.2f} ± {s.ci95:.2f}){p}")
            rows.append(cells)
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.append(f"paired bootstrap against the baseline {hyp_paths[0]}; * p < 0.05")
        signatures = [(s.metric, s.signature) for s in paired[0]]
    lines.append("signatures:")
    lines += [f"  {metric}: {signature}" for metric, signature in signatures]
    return "\n".join(lines)

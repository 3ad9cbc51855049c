"""Scoring translations: read hypothesis and reference files, check they line up, and score them
with :mod:`mtkit.metrics.scores` (and, for several systems, the paired bootstrap test).

Lines are read as UTF-8 (``.gz`` too) with trailing whitespace removed, exactly
as the ``sacrebleu`` command line reads them, so the scores are the ones it
prints. Several reference streams are several references per sentence. Several
hypothesis streams are compared with paired bootstrap resampling (sacrebleu's
``paired-bs``, seed ``$SACREBLEU_SEED`` or 12345); the first is the baseline.
One of the files may be ``-``, stdin.

The result is an :class:`Evaluation` of score objects; the commands turn it into a table or JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from mtkit.errors import MtkitError, counted
from mtkit.io import STDIN_NAME, decode_line, read_lines, standard_input
from mtkit.metrics.scores import (
    BootstrapScore,
    MetricOptions,
    MetricScore,
    mean_score,
    paired_bootstrap,
    paired_bootstrap_segments,
    score,
)

STDIN = STDIN_NAME

Named = tuple[str, list[str]]  # (label: a path, or what produced the lines), the lines


@dataclass
class Evaluation:
    """The scores of one system (``scores``, in the order the metrics were asked for), and with
    several systems the paired test (``paired``: a row per system, baseline first)."""

    hyps: list[str]  # the systems' labels, baseline first
    refs: list[str]  # the reference streams' labels
    n_sentences: int
    scores: list[MetricScore]
    paired: list[list[BootstrapScore]] | None = None
    n_samples: int = 1000


def _read_stdin() -> list[str]:
    return [decode_line(raw, STDIN, number).rstrip() for number, raw in enumerate(standard_input(), start=1)]


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


def score_files(
    hyp_paths: Sequence[str | Path],
    ref_paths: Sequence[str | Path],
    metrics: Sequence[str],
    options: MetricOptions | None = None,
    n_samples: int = 1000,
) -> Evaluation:
    """Score hypothesis files against reference files (``-`` is stdin); ``options`` and ``n_samples`` as
    :func:`score_lines` takes them.

    Args:
        hyp_paths: one hypothesis file, or several to compare (the first is the baseline).
        ref_paths: one or more reference files (several references per sentence).
    """
    if not hyp_paths:
        raise MtkitError("no hypothesis file given: pass --hyp FILE")
    if not ref_paths:
        raise MtkitError("no reference file given: pass --ref FILE")
    named = read_named([*ref_paths, *hyp_paths])
    return score_lines(named[len(ref_paths):], named[: len(ref_paths)], metrics, options, n_samples=n_samples)


def score_lines(
    hyps: list[Named],
    refs: list[Named],
    metrics: Sequence[str],
    options: MetricOptions | None = None,
    *,
    n_samples: int = 1000,
    sources: list[str] | None = None,
    comet=None,
) -> Evaluation:
    """Score hypothesis lines against reference lines.

    Args:
        hyps: (label, lines) of one system, or of several to compare (the first is the baseline).
        refs: (label, lines) of one or more reference streams (several references per sentence).
        metrics: any of ``bleu``, ``chrf``, ``ter``.
        options: how they are computed (:class:`~mtkit.metrics.scores.MetricOptions`): chrF++
            (``chrf_plus``), also Multi30k-style lowercased tokenized BLEU (``lowercase_tok``; references raw or
            official lc-tok), legacy WMT14 tokenized BLEU with compound splitting (``compound_split``), the
            target language (``lang``, ``--lang``: Moses rules, and sacreBLEU's zh/ja/ko tokenizers as with
            ``sacrebleu -l``; without it, tokenized BLEU infers the Moses language from the labels' file names),
            case-insensitive BLEU and chrF (``lowercase``, as ``sacrebleu -lc``, e.g. for a model trained on
            lowercased text).
        n_samples: bootstrap resamples for the paired test.
        sources: the source lines, for COMET.
        comet: a :class:`~mtkit.metrics.comet.CometScorer` for the metric ``comet`` (COMET after the others;
            with a reference-free model, ``refs`` may be empty when it is the only metric).
    """
    options = options or MetricOptions()
    lc_tok, compound_split, lang = options.lowercase_tok, options.compound_split, options.lang
    sacre = [m for m in metrics if m.lower() != "comet"]
    if len(sacre) < len(metrics) and comet is None:
        raise MtkitError("the metric comet needs a COMET model")
    if not hyps:
        raise MtkitError("no hypotheses given: pass --hyp FILE")
    if not refs and (sacre or lc_tok or compound_split or comet.needs_references):
        raise MtkitError("no references given: pass --ref FILE")
    hyp_labels, hyp_lines = [h[0] for h in hyps], [h[1] for h in hyps]
    ref_labels, ref_lines = [r[0] for r in refs], [r[1] for r in refs]
    for hyp_label, lines in hyps:
        for ref_label, ref in refs:
            if len(lines) != len(ref):
                raise MtkitError(
                    f"line counts differ: {hyp_label} has {counted(len(lines), 'line')}, {ref_label} has {len(ref)}"
                )
    for label, lines in (refs[:1] or hyps[:1]):
        if not lines:
            raise MtkitError(f"{label}: empty file, nothing to score")
    if len(sacre) < len(metrics):
        return _with_comet(score_lines(hyps, refs, sacre, options, n_samples=n_samples) if sacre else
                           Evaluation(hyp_labels, ref_labels, len(hyp_lines[0]), [], None, n_samples),
                           hyp_lines, ref_lines, sources, comet)
    moses_lang = options.moses_lang
    if (lc_tok or compound_split) and lang is None and moses_lang is None:
        # Inferred only for the Moses rules: sacreBLEU's own tokenizer changes only on an explicit --lang.
        moses_lang = _infer_lang(ref_labels) or _infer_lang(hyp_labels)
        if moses_lang is None:
            raise MtkitError(
                f"tokenized BLEU needs the target language and none can be read from {ref_labels[0]}: pass --lang"
            )
    options = replace(options, moses_lang=moses_lang)
    results = score(hyp_lines[0], ref_lines, list(metrics), options)
    paired = None
    if len(hyps) > 1:
        paired = paired_bootstrap(list(zip(hyp_labels, hyp_lines)), ref_lines, list(metrics), options, n_samples)
    return Evaluation(hyp_labels, ref_labels, len(ref_lines[0]), results, paired, n_samples)


def _with_comet(evaluation: Evaluation, hyp_lines: list[list[str]], ref_lines: list[list[str]],
                sources: list[str] | None, comet) -> Evaluation:
    """``evaluation`` with COMET after its scores and, with several systems, in its paired test (the
    bootstrap on segment scores, :func:`~mtkit.metrics.scores.paired_bootstrap_segments`)."""
    if len(ref_lines) > 1:
        raise MtkitError("COMET takes one reference per sentence; give one --ref")
    reference = ref_lines[0] if ref_lines else None  # a model that takes none leaves it
    systems = [mean_score("COMET", comet.score(sources, lines, reference), comet.signature, comet.name)
               for lines in hyp_lines]
    evaluation.scores.append(systems[0])
    if len(systems) > 1:
        rows = paired_bootstrap_segments([(label, s.segments) for label, s in zip(evaluation.hyps, systems)],
                                         "COMET", comet.signature, evaluation.n_samples)
        if evaluation.paired is None:
            evaluation.paired = [[row] for row in rows]
        else:
            for columns, row in zip(evaluation.paired, rows):
                columns.append(row)
    return evaluation

"""sacreBLEU scores with signatures, tokenized BLEU (:mod:`mtkit.metrics.tokenized`), paired bootstrap.

Scores come from sacrebleu's Python API (``BLEU``, ``CHRF``, ``TER``) and carry
sacrebleu's reproducibility signature, so a number printed by mtkit is the
number ``sacrebleu REF -i HYP -m bleu chrf ter`` prints on the same lines.

Inputs
    Hypotheses are **detokenized** text, one sentence per line, as ``mtkit
    translate`` writes them. References are raw (detokenized) text as well;
    never score against SentencePiece-encoded or Moses-tokenized references
    with plain sacreBLEU. ``refs`` follows sacrebleu's layout: a list of
    reference *streams*, ``refs[k][i]`` is the k-th reference of sentence i.

Cased detokenized sacreBLEU (``BLEU``) is the score to report first.

Lowercased tokenized BLEU (``lowercase_tok=True``, metric ``BLEU-lc-tok``)
    The score Multi30k papers quote: the official references
    ``*.lc.norm.tok.LANG`` were made with Moses ``lowercase.perl`` then
    ``normalize-punctuation.perl -l LANG`` then ``tokenizer.perl -l LANG``
    (XML escaping on: ``"`` -> ``&quot;``, ``'`` -> ``&apos;``, ``&`` ->
    ``&amp;``; no ``-a``, so hyphenated words stay whole). The order matters:
    the German tokenizer treats capitalised ``Bart.`` as a non-breaking prefix
    and keeps the period attached, so lowercasing first is what reproduces
    the official files (1000/1000 lines of test_2016_flickr, both en and de).
    Hypotheses (and raw references) go through the same pipeline with
    ``sacremoses``; references that already look lc-tok (no upper case, and
    nearly every line a fixed point of the pipeline) are used as given. BLEU
    is then computed with ``tokenize='none'``. Because case errors no longer
    count and tokenization differs, lc-tok BLEU is usually a few points
    *higher* than cased detokenized sacreBLEU on the same output: it is
    comparable only with other lc-tok numbers, never with sacreBLEU.

Tokenized BLEU with compound splitting (``compound_split=True``, ``BLEU-tok-compound``)
    The legacy WMT14 en-de number of the Transformer paper (tensor2tensor's
    ``get_ende_bleu.sh``, fairseq's ``compound_split_bleu.sh``): cased Moses
    ``tokenizer.perl -l LANG`` on hypotheses and raw references, then
    ``s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g``, then BLEU on those tokens. It is
    typically higher than sacreBLEU and kept only for comparison with old
    papers.

Named test sets: :mod:`mtkit.metrics.testsets`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.metrics.bleu import BLEUScore
from sacrebleu.metrics.chrf import CHRFScore
from sacrebleu.metrics.ter import TERScore
from sacrebleu.significance import PairedTest, estimate_ci

from mtkit.errors import MtkitError, counted
from mtkit.metrics.tokenized import _sacremoses_version, compound_split_tok, lc_tok, looks_lc_tok

METRICS = ("bleu", "chrf", "ter")
LC_TOK_NAME = "BLEU-lc-tok"
COMPOUND_NAME = "BLEU-tok-compound"



@dataclass(frozen=True)
class MetricScore:
    """One corpus-level score.

    Attributes:
        metric: display name, e.g. ``BLEU``, ``chrF2``, ``chrF2++``, ``TER``, ``BLEU-lc-tok``.
        score: the score (0–100; lower is better for TER only).
        signature: sacrebleu's full signature, plus mtkit's preprocessing for tokenized BLEU.
    """

    metric: str
    score: float
    signature: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class BleuScore(MetricScore):
    """BLEU with its sufficient statistics (orders 1..4)."""

    counts: list[int]
    totals: list[int]
    precisions: list[float]
    bp: float
    sys_len: int
    ref_len: int


@dataclass(frozen=True)
class ChrfScore(MetricScore):
    char_order: int
    word_order: int
    beta: int


@dataclass(frozen=True)
class TerScore(MetricScore):
    num_edits: int
    ref_length: float


@dataclass(frozen=True)
class MeanScore(MetricScore):
    """A system score that is the mean of its segment scores (``segments``, in line order; None for a line
    that has none, left out of the mean): COMET (``signature`` naming the model and the versions), or the
    translating model's confidence. ``model``: what scored the segments."""

    model: str
    segments: list[float | None]


def mean_score(metric: str, segments: list[float | None], signature: str, model: str) -> MeanScore:
    values = [v for v in segments if v is not None]
    return MeanScore(metric=metric, score=sum(values) / len(values) if values else float("nan"),
                     signature=signature, model=model, segments=segments)


@dataclass(frozen=True)
class BootstrapScore:
    """A system's score under paired bootstrap resampling against the baseline.

    ``mean`` and ``ci95`` (half-width of the 95% interval) come from the bootstrap
    resamples; ``p_value`` is None for the baseline itself.
    """

    system: str
    metric: str
    score: float
    mean: float
    ci95: float
    p_value: float | None
    signature: str

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- scoring plan


@dataclass(frozen=True)
class MetricOptions:
    """How the metrics are computed (:func:`score`, :func:`paired_bootstrap`).

    Attributes:
        chrf_plus: chrF++ (word n-grams up to 2) instead of chrF.
        lowercase_tok: add ``BLEU-lc-tok`` (Multi30k-style lowercased tokenized BLEU); needs ``lang``.
        compound_split: add ``BLEU-tok-compound`` (legacy WMT14 en-de tokenized BLEU); needs ``lang``.
        lang: target language code: the Moses rules of tokenized BLEU, and sacreBLEU's tokenizer for
            zh/ja/ko (as ``sacrebleu -l xx-zh`` does; otherwise ``13a``, as ``sacrebleu`` without ``-l``).
        moses_lang: the Moses rules only, leaving sacreBLEU's tokenizer at its default (overrides ``lang``).
        refs_tokenized: for lc-tok, whether ``refs`` are already lc-tok (None: detect per stream).
        lowercase: case-insensitive BLEU and chrF (``sacrebleu -lc --chrf-lowercase``; TER is case-insensitive
            by default).
    """

    chrf_plus: bool = False
    lowercase_tok: bool = False
    compound_split: bool = False
    lang: str | None = None
    moses_lang: str | None = None
    refs_tokenized: bool | None = None
    lowercase: bool = False


@dataclass(frozen=True)
class _Job:
    """One metric to compute: the sacrebleu metric and how its inputs are prepared."""

    name: str | None  # display name override (None: sacrebleu's own)
    make: Callable[[], object]  # builds a fresh sacrebleu Metric
    prepare_hyps: Callable[[list[str]], list[str]]
    refs: list[list[str]]
    signature_suffix: str


def _identity(lines: list[str]) -> list[str]:
    return lines


def _check_shapes(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> None:
    if not refs:
        raise MtkitError("no reference given: pass at least one reference file")
    for k, stream in enumerate(refs, start=1):
        if len(stream) != len(hyps):
            raise MtkitError(f"reference {k} has {counted(len(stream), 'line')} but the hypotheses have {len(hyps)}")
    if not hyps:
        raise MtkitError("nothing to score: the hypotheses are empty")


def _plan(refs: list[list[str]], metrics: Sequence[str], options: MetricOptions) -> list[_Job]:
    chrf_plus, lowercase_tok, compound_split = options.chrf_plus, options.lowercase_tok, options.compound_split
    lang, moses_lang, lowercase = options.lang, options.moses_lang, options.lowercase

    if not metrics:
        raise MtkitError(f"no metric given: choose from {', '.join(METRICS)}")
    unknown = [m for m in metrics if m.lower() not in METRICS]
    if unknown:
        raise MtkitError(f"unknown metric {unknown[0]!r}: choose from {', '.join(METRICS)}")
    sacrebleu_lang = lang or ""
    tok_lang = moses_lang or lang  # Moses rules of the tokenized variants
    if (lowercase_tok or compound_split) and not tok_lang:
        raise MtkitError("tokenized BLEU needs the target language (for the Moses rules): pass --lang, e.g. --lang de")

    jobs: list[_Job] = []
    for m in dict.fromkeys(m.lower() for m in metrics):
        if m == "bleu":
            jobs.append(_Job(None, lambda: BLEU(trg_lang=sacrebleu_lang, lowercase=lowercase), _identity, refs, ""))
        elif m == "chrf":
            jobs.append(_Job(None, lambda: CHRF(word_order=2 if chrf_plus else 0, lowercase=lowercase),
                             _identity, refs, ""))
        else:
            jobs.append(_Job(None, TER, _identity, refs, ""))

    # The inputs are tokenized already; lowercase=True is a no-op on lc-tok text but puts case:lc in
    # the signature (compound-split BLEU is cased).
    lc_bleu = lambda: BLEU(tokenize="none", force=True, lowercase=True)  # noqa: E731
    cased_bleu = lambda: BLEU(tokenize="none", force=True)  # noqa: E731
    version = _sacremoses_version()
    if lowercase_tok:
        assert tok_lang is not None
        tok_refs, origins = [], []
        for stream in refs:
            given = (options.refs_tokenized if options.refs_tokenized is not None
                     else looks_lc_tok(stream, tok_lang))
            tok_refs.append([line.strip() for line in stream] if given else [lc_tok(x, tok_lang) for x in stream])
            origins.append("given" if given else "lc.norm.tok")
        suffix = f"|pre:lc.norm.tok.{tok_lang}|refs:{'+'.join(origins)}|sacremoses:{version}"
        jobs.append(_Job(LC_TOK_NAME, lc_bleu, lambda h: [lc_tok(x, tok_lang) for x in h], tok_refs, suffix))
    if compound_split:
        assert tok_lang is not None
        split_refs = [[compound_split_tok(x, tok_lang) for x in stream] for stream in refs]
        suffix = f"|pre:tok.{tok_lang}+compound-split|sacremoses:{version}"
        jobs.append(
            _Job(COMPOUND_NAME, cased_bleu, lambda h: [compound_split_tok(x, tok_lang) for x in h], split_refs, suffix)
        )
    return jobs


def _build(job: _Job):
    try:
        return job.make()
    except (ImportError, RuntimeError) as e:  # e.g. the MeCab tokenizer sacrebleu picks for ja/ko is not installed
        raise MtkitError(f"cannot set up {job.name or 'the metric'}: {' '.join(str(e).split())}") from None


def _to_result(name: str | None, sb_score, signature: str) -> MetricScore:
    metric = name or sb_score.name
    score = float(sb_score.score)
    if isinstance(sb_score, BLEUScore):
        return BleuScore(
            metric,
            score,
            signature,
            counts=[int(c) for c in sb_score.counts],
            totals=[int(t) for t in sb_score.totals],
            precisions=[float(p) for p in sb_score.precisions],
            bp=float(sb_score.bp),
            sys_len=int(sb_score.sys_len),
            ref_len=int(sb_score.ref_len),
        )
    if isinstance(sb_score, CHRFScore):
        return ChrfScore(metric, score, signature, sb_score.char_order, sb_score.word_order, sb_score.beta)
    if isinstance(sb_score, TERScore):
        return TerScore(metric, score, signature, int(sb_score.num_edits), float(sb_score.ref_length))
    return MetricScore(metric, score, signature)


# ---------------------------------------------------------------- public API


def score(
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    metrics: Sequence[str] = METRICS,
    options: MetricOptions | None = None,
) -> list[MetricScore]:
    """Score detokenized hypotheses against raw references.

    Args:
        hyps: N hypothesis lines (empty lines are fine).
        refs: reference streams, each of N lines (``refs[k][i]``: k-th reference of sentence i).
        metrics: any of ``bleu``, ``chrf``, ``ter``, in the order to report them.
        options: how they are computed (:class:`MetricOptions`: chrF++, tokenized BLEU, the language, case).

    Returns:
        One result per metric, in order, the tokenized BLEU variants last.
    """
    hyps = list(hyps)
    refs = [list(stream) for stream in refs]
    _check_shapes(hyps, refs)
    results = []
    for job in _plan(refs, metrics, options or MetricOptions()):
        metric = _build(job)
        sb_score = metric.corpus_score(job.prepare_hyps(hyps), job.refs)
        results.append(_to_result(job.name, sb_score, metric.get_signature().format() + job.signature_suffix))
    return results


def paired_bootstrap(
    systems: Sequence[tuple[str, Sequence[str]]],
    refs: Sequence[Sequence[str]],
    metrics: Sequence[str] = METRICS,
    options: MetricOptions | None = None,
    n_samples: int = 1000,
) -> list[list[BootstrapScore]]:
    """Paired bootstrap resampling (Koehn, 2004) with sacrebleu's ``PairedTest(test_type='bs')``; ``options``
    as :func:`score` takes them.

    The first system is the baseline; every other system gets a p-value for the
    difference to it. The RNG seed is sacrebleu's (``SACREBLEU_SEED``, default
    12345), so results are reproducible and the signature records it.

    Returns:
        One list per system (baseline first) of one :class:`BootstrapScore` per metric.
    """
    if len(systems) < 2:
        raise MtkitError("a paired test needs at least two hypothesis files (the first is the baseline)")
    names = [name for name, _ in systems]
    if len(set(names)) != len(names):
        raise MtkitError("the same hypothesis file was given twice; give each system once")
    refs = [list(stream) for stream in refs]
    for _, hyps in systems:
        _check_shapes(list(hyps), refs)

    table: list[list[BootstrapScore]] = [[] for _ in systems]
    for job in _plan(refs, metrics, options or MetricOptions()):
        metric = _build(job)
        named = [(name, job.prepare_hyps(list(hyps))) for name, hyps in systems]
        test = PairedTest(named, {"m": metric}, references=job.refs, test_type="bs", n_samples=n_samples)
        signatures, columns = test()
        (sb_name,) = [k for k in columns if k != "System"]
        signature = signatures[sb_name].format() + job.signature_suffix
        for i, result in enumerate(columns[sb_name]):
            table[i].append(
                BootstrapScore(
                    system=names[i],
                    metric=job.name or sb_name,
                    score=float(result.score),
                    mean=float(result.mean),
                    ci95=float(result.ci),
                    p_value=None if result.p_value is None else float(result.p_value),
                    signature=signature,
                )
            )
    return table


def paired_bootstrap_segments(systems: Sequence[tuple[str, Sequence[float]]], metric: str, signature: str,
                              n_samples: int = 1000) -> list[BootstrapScore]:
    """The paired bootstrap test of :func:`paired_bootstrap` for a metric whose system score is the mean of
    its segment scores (COMET): the same resamples (sacrebleu's seed, ``SACREBLEU_SEED`` or 12345), mean and
    95% interval (sacrebleu's ``estimate_ci``) and p-value of the difference to the first system, the
    baseline. One :class:`BootstrapScore` per system, baseline first."""
    seed = os.environ.get("SACREBLEU_SEED", "12345")
    rng = np.random.default_rng(None if seed.lower() == "none" else int(seed))
    scores = [np.asarray(segments, dtype=np.float64) for _, segments in systems]
    n = len(scores[0])
    if n == 0 or any(len(s) != n for s in scores):
        raise MtkitError("a paired test needs the same, non-zero number of segment scores for every system")
    idxs = rng.choice(n, size=(n_samples, n), replace=True)
    baseline = scores[0][idxs].mean(axis=1)
    signature = f"{signature}|bs:{n_samples}|seed:{seed.lower()}"
    rows = []
    for (name, _), system in zip(systems, scores):
        sampled = system[idxs].mean(axis=1)
        mean, ci = estimate_ci(sampled)
        p_value = None
        if rows:  # sacrebleu's paired_bs: how often a resampled difference exceeds the real one, centred
            differences = np.abs(sampled - baseline)
            stats = differences - differences.mean()
            real = abs(float(scores[0].mean()) - float(system.mean()))
            p_value = (int(np.sum(stats > real)) + 1) / (len(stats) + 1)
        rows.append(BootstrapScore(system=name, metric=metric, score=float(system.mean()), mean=float(mean),
                                   ci95=float(ci), p_value=p_value, signature=signature))
    return rows


def load_pairs_refs(pairs: Iterable[tuple[str, str]]) -> tuple[list[str], list[list[str]]]:
    """Split (source, target) pairs into sources and one reference stream.

    The hook for Hugging Face test splits: ``load_pairs_refs(iter_pairs(source_config, src, tgt))``
    with ``mtkit.data.sources.iter_pairs`` gives the inputs of ``score``.
    """
    srcs: list[str] = []
    refs: list[str] = []
    for src, tgt in pairs:
        srcs.append(src)
        refs.append(tgt)
    return srcs, [refs]

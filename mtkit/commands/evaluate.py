"""``mtkit evaluate``: score detokenized hypotheses against raw references, as a table or JSON;
or translate with a model first.

* ``--hyp H --ref R``: score H (``-``: stdin) against R, as the sacrebleu command line does
  (:mod:`mtkit.metrics.files`); several ``--ref``: several references per sentence; several ``--hyp``:
  a paired bootstrap test against the first.
* ``--model M --src S --ref R``: translate S with M (the checkpoint's decode settings,
  overridden by the options; ``--model`` repeated: an ensemble), then score the
  translations; ``--hyp-out`` also writes them to a file.
* ``--testset wmt14/full --langpair en-de``: sources and references from sacrebleu;
  with ``--model`` they are translated, else ``--hyp`` is scored against them.

Nothing is written unless asked for: translations and sacrebleu's references are
scored in memory (sacrebleu keeps its own cache of test sets), never written beside
the model. Hypotheses are always detokenized text and references always the raw text.

JSON schema (``--json``, ``schema_version`` 1; keys are never removed or renamed
within a schema version)::

    {
      "mtkit_version": str,
      "schema_version": 1,
      "hyp": str,                  # path of the (first) hypothesis file ("<stdin>" for -), or
                                   # the --model that translated them in memory
      "refs": [str, ...],          # reference paths, one per reference stream (for --testset:
                                   # "NAME:LANGPAIR" and the stream number); [] for COMET
                                   # quality estimation (a reference-free model, no --ref)
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
        {"metric": "COMET", "score": float,   # with --metrics …,comet, after the above: the mean of "segments"
         "signature": str,                    # model, class, encoder, mtkit, transformers and torch versions
         "model": str, "segments": [float]},  # one score per line, in order
        {"metric": "confidence", "score": float, "signature": str,  # with --model and --metrics …,confidence,
         "model": str, "segments": [float | null]}  # last: the model's mean token log-probability per line
                                                    # (null for an empty line, left out of the mean)
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
from dataclasses import dataclass, field
from pathlib import Path

from mtkit.api import ENGINES, LoadOptions, comet_scorer, load_models
from mtkit.config import DecodeOptions
from mtkit.engines.constraints import constraint_source
from mtkit.engines.quality import confidence
from mtkit.errors import MtkitError, counted
from mtkit.io import atomic_write_text, read_lines
from mtkit.metrics import BleuScore, BootstrapScore, MetricOptions, MetricScore, load_testset
from mtkit.metrics.files import Evaluation, read_named, score_files, score_lines
from mtkit.metrics.scores import METRICS, mean_score
from mtkit.text.phrases import check_line_counts, read_constraint_options
from mtkit.text.pipeline import translate_lines
from mtkit.version import __version__

SCHEMA_VERSION = 1
CONFIDENCE = "confidence:mean log-probability per token of the best hypothesis, EOS included (nats)"


def evaluate_files(hyp_paths: list[Path], ref_paths: list[Path], metrics: list[str], options: MetricOptions,
                   as_json: bool, n_samples: int = 1000) -> str:
    """Score hypothesis files against reference files (:func:`mtkit.metrics.files.score_files`); the table or
    JSON text to print."""
    return render(score_files(hyp_paths, ref_paths, metrics, options, n_samples), as_json)


def render(evaluation: Evaluation, as_json: bool) -> str:
    """The JSON document (schema above) or the table of an evaluation."""
    if as_json:
        return json.dumps(to_document(evaluation), indent=2, ensure_ascii=False)
    return _to_table(evaluation.hyps, evaluation.refs, evaluation.n_sentences, evaluation.scores, evaluation.paired)


def to_document(evaluation: Evaluation) -> dict:
    """The ``--json`` document of an evaluation, as data (schema in the module docstring)."""
    e = evaluation
    return _to_json(e.hyps, e.refs, e.n_sentences, e.scores, e.paired, e.n_samples)


@dataclass(frozen=True)
class EvaluateOptions:
    """Everything ``mtkit evaluate`` takes (the CLI's flags, one field each; see :func:`evaluate`)."""

    hyp: list[Path] = field(default_factory=list)
    ref: list[Path] = field(default_factory=list)
    model: list[Path] | None = None
    engine: str = "torch"  # what runs --model: torch, ctranslate2 or onnx (mtkit.api.ENGINES)
    src: Path | None = None
    testset: str | None = None
    langpair: str | None = None
    hyp_out: Path | None = None
    metrics: list[str] = field(default_factory=lambda: list(METRICS))
    chrf_plus: bool = False
    lc_tok: bool = False
    compound_split: bool = False
    lang: str | None = None
    as_json: bool = False
    decode: DecodeOptions = field(default_factory=DecodeOptions)  # --model's decoding flags (--beam, --mbr ...)
    device: str = "auto"
    lowercase: bool = False
    constraints: Path | None = None
    glossary: Path | None = None
    tgt_lang: str | None = None
    comet_model: str | None = None  # with the metric comet (None: mtkit.metrics.comet.DEFAULT_MODEL)

    @property
    def with_comet(self) -> bool:
        """Whether the metrics hold COMET."""
        return any(m.lower() == "comet" for m in self.metrics)

    @property
    def with_confidence(self) -> bool:
        """Whether the metrics hold the model's confidence."""
        return any(m.lower() == "confidence" for m in self.metrics)

    def check(self) -> None:
        """One error line, naming the flag, for the first setting out of its range or combination that cannot be
        (``--model``'s decoding options through :meth:`mtkit.config.DecodeOptions.check`), before anything is
        read or loaded."""
        if not self.metrics:  # `--metrics ''` or `--metrics ,`
            raise MtkitError("--metrics: no metric given; expected a comma-separated list of bleu, chrf, ter, comet, "
                             "confidence")
        unknown = [m for m in self.metrics if m.lower() not in (*METRICS, "comet", "confidence")]
        if unknown:
            raise MtkitError(f"--metrics: unknown metric {unknown[0]!r}; choose from {', '.join(METRICS)}, comet, "
                             "confidence")
        if self.with_confidence and self.model is None:
            raise MtkitError("the metric confidence is the translating model's own: it needs --model")
        if self.comet_model is not None and not self.with_comet:
            raise MtkitError("--comet-model needs the metric comet (--metrics bleu,chrf,comet)")
        if self.with_comet and self.model is None and self.testset is None and self.src is None:
            raise MtkitError("the metric comet needs the sources: give --src (or --testset)")
        if self.model is not None and self.hyp:
            raise MtkitError("give either --hyp or --model, not both")
        if self.engine not in ENGINES:
            raise MtkitError(f"--engine {self.engine}: expected one of {', '.join(ENGINES)}")
        if self.model is None and self.engine != "torch":
            raise MtkitError(f"--engine {self.engine} needs --model (it runs the model that translates)")
        if self.model is None and self.tgt_lang is not None:
            raise MtkitError("--tgt-lang needs --model (it picks the language the model translates into)")
        if self.model is None and (self.constraints is not None or self.glossary is not None):
            raise MtkitError(f"{'--constraints' if self.constraints is not None else '--glossary'} needs --model "
                             "(it constrains the model's translations)")
        if sum(str(p) == "-" for p in [*self.hyp, *self.ref]) > 1:
            raise MtkitError("only one of the --hyp/--ref files can be '-' (stdin)")
        if self.hyp_out is not None:
            if self.model is None:
                raise MtkitError("--hyp-out needs --model (it writes the model's translations)")
            if Path(self.hyp_out).is_dir():
                raise MtkitError(f"--hyp-out {self.hyp_out}: is a directory; give a file path")
        if self.testset is not None:
            if not self.langpair:
                raise MtkitError("--testset needs --langpair, e.g. --langpair en-de")
            if self.src is not None or self.ref:
                raise MtkitError("--testset brings its own sources and references; drop --src/--ref")
        else:
            # quality estimation: the model's confidence, or COMET with a model that takes no reference
            reference_free = all(m.lower() in ("comet", "confidence") for m in self.metrics)
            if self.model is not None and (self.src is None or not (self.ref or reference_free)):
                raise MtkitError("--model needs --src and --ref (or --testset and --langpair)")
            if not self.ref and not reference_free:
                raise MtkitError("nothing to score: give --hyp and --ref, or --model with --src and --ref, or "
                                 "--testset")
        if self.model is not None:
            self.decode.check()


def evaluate(options: EvaluateOptions) -> str:
    """Run the evaluation the options describe; return the text to print. ``constraints`` (JSON lines,
    one per source line) and ``glossary`` (TSV) constrain ``model``'s translations; ``tgt_lang`` is the
    target of a multilingual ``model`` (required when it has several)."""
    o = options
    lang, lowercase = o.lang, o.lowercase  # found out on the way
    o.check()
    if o.testset is not None:
        sources, references = load_testset(o.testset, o.langpair)
        refs = [(f"{o.testset}:{o.langpair}" + (f" ref{k}" if len(references) > 1 else ""), stream)
                for k, stream in enumerate(references)]
        lang = lang or o.langpair.split("-")[1]
    else:
        refs = read_named(o.ref)
        sources = list(read_lines(o.src)) if o.src is not None else None
        if lang is None and o.model is not None and o.ref:
            suffix = Path(o.ref[0]).suffix.lstrip(".")
            lang = o.tgt_lang or (suffix if len(suffix) == 2 else None)
    comet_model = None
    if o.with_comet:
        from mtkit.metrics.comet import DEFAULT_MODEL

        comet_model = o.comet_model or DEFAULT_MODEL
    comet = None
    if o.model is None:
        if comet_model is not None:  # loaded before anything is read: a model that cannot be had fails at once
            comet = comet_scorer(comet_model, o.device)
        if not o.hyp:
            raise MtkitError("nothing to score: give --hyp and --ref, or --model with --src and --ref, or --testset")
        hyps = read_named(o.hyp)
    else:
        src_lines = sources
        per_line, terms = read_constraint_options(o.constraints, o.glossary, o.engine)
        check_line_counts(per_line, "--constraints", o.constraints, len(src_lines))
        wanted = None
        if per_line is not None or terms is not None:
            wanted = constraint_source(per_line, terms, f"--constraints {o.constraints}")
        paths = list(o.model) if isinstance(o.model, (list, tuple)) else [o.model]
        # The COMET model first (before any translation), then a checkpoint's kept CTranslate2 export (as
        # translate takes it), then the engine.
        model = load_models(paths, LoadOptions(engine=o.engine, device=o.device, threads=0, target=o.tgt_lang,
                                               any_target=False, decode_options=o.decode,
                                               comet_model=comet_model))
        comet = model.comet
        translations = list(translate_lines(model.engine, src_lines, constraints=wanted))
        folds_case = model.lowercases
        hypotheses = [t.best.text for t in translations]
        confidences = [confidence(t) for t in translations]
        if folds_case and not lowercase:
            print("the model's vocabulary lowercases its output: BLEU and chrF are case-insensitive", file=sys.stderr)
            lowercase = True
        if o.hyp_out is not None:
            atomic_write_text(o.hyp_out, "".join(line + "\n" for line in hypotheses))
            print(f"hypotheses: {o.hyp_out}", file=sys.stderr)
        hyps = [(str(o.hyp_out) if o.hyp_out is not None else ", ".join(map(str, o.model)), hypotheses)]
    metrics = [m for m in o.metrics if m.lower() != "confidence"]
    if metrics:
        evaluation = score_lines(hyps, refs, metrics, MetricOptions(chrf_plus=o.chrf_plus, lowercase_tok=o.lc_tok,
                                                                    compound_split=o.compound_split, lang=lang,
                                                                    lowercase=lowercase),
                                 sources=sources, comet=comet)
    else:
        evaluation = Evaluation([label for label, _ in hyps], [label for label, _ in refs], len(hyps[0][1]), [])
    if o.with_confidence:
        evaluation.scores.append(mean_score("confidence", confidences, f"{CONFIDENCE}|mtkit:{__version__}",
                                            hyps[0][0]))
    return render(evaluation, o.as_json)


def _to_json(
    hyp_paths: list[str],
    ref_paths: list[str],
    n: int,
    results: list[MetricScore],
    paired: list[list[BootstrapScore]] | None,
    n_samples: int,
) -> dict:
    doc: dict = {
        "mtkit_version": __version__,
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
    return doc


def _digits(metric: str) -> int:
    """Decimals a score is shown with: COMET's (around 0.8) and the confidence's four, sacreBLEU's (0-100) two."""
    return 4 if metric in ("COMET", "confidence") else 2


def _to_table(
    hyp_paths: list[str],
    ref_paths: list[str],
    n: int,
    results: list[MetricScore],
    paired: list[list[BootstrapScore]] | None,
) -> str:
    lines = [f"refs: {', '.join(map(str, ref_paths)) or 'none (quality estimation)'}  ({counted(n, 'sentence')})"]
    if paired is None:
        lines.append(f"hyp:  {hyp_paths[0]}")
        width = max(len(r.metric) for r in results)
        for r in results:
            detail = ""
            if isinstance(r, BleuScore):
                precisions = "/".join(f"{p:.1f}" for p in r.precisions)
                ratio = r.sys_len / r.ref_len if r.ref_len else 0.0
                detail = f"  {precisions} (BP {r.bp:.3f}, ratio {ratio:.3f}, hyp_len {r.sys_len}, ref_len {r.ref_len})"
            lines.append(f"{r.metric:<{width}}  {r.score:6.{_digits(r.metric)}f}{detail}")
        signatures = [(r.metric, r.signature) for r in results]
    else:
        metric_names = [s.metric for s in paired[0]]
        header = ["system"] + [f"{m} (mean ± 95% CI)" for m in metric_names]
        rows = [header]
        for path, row in zip(hyp_paths, paired):
            cells = [str(path)]
            for s in row:
                p = "" if s.p_value is None else f" p={s.p_value:.4f}{'*' if s.p_value < 0.05 else ''}"
                d = _digits(s.metric)
                cells.append(f"{s.score:.{d}f} ({s.mean:.{d}f} ± {s.ci95:.{d}f}){p}")
            rows.append(cells)
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.append(f"paired bootstrap against the baseline {hyp_paths[0]}; * p < 0.05")
        signatures = [(s.metric, s.signature) for s in paired[0]]
    lines.append("signatures:")
    lines += [f"  {metric}: {signature}" for metric, signature in signatures]
    return "\n".join(lines)

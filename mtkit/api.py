"""mtkit's Python API: load a model, translate and score with it, evaluate translations.

    >>> import mtkit
    >>> model = mtkit.load("runs/en-de")                      # a run, a checkpoint, or an exported folder
    >>> result = model.translate("A man is riding a bike.", beam=4)
    >>> result.text, result.logprob                           # the best hypothesis and its log P (nats)
    >>> [h.text for h in model.translate(["One.", "Two."], beam=4, nbest=2)[0].hypotheses]
    >>> model.score(["A dog."], ["Ein Hund."])[0].logprob     # forced decoding (torch engine)
    >>> mtkit.evaluate(["Ein Hund."], [["Ein Hund."]])[0].score   # sacreBLEU, with its signature

Every call takes its own options (keywords, checked as the CLI's flags are: ``beam``, ``nbest``,
``alpha``, ``sampling`` …, ``target`` for a multilingual model, ``glossary``, ``constraints``); the
model is never changed by a call, so one model serves any number of threads at once, as its engine
does. What the CLI says on stderr (what was loaded, the thread count, the torch engine's warnings) goes
to the ``mtkit`` logger. ``import mtkit`` loads no torch; :func:`load` loads it for the torch engine only.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mtkit import langid
from mtkit.checkpoints.io import is_hugging_face_folder, load_model, precheck
from mtkit.config import DecodeConfig, DecodeOptions
from mtkit.data.languages import same_pairs
from mtkit.documents import DOCUMENT_FORMATS, Limits, Texts, translate_bytes, translate_file
from mtkit.engines.capabilities import CAPABILITIES, either, include_refusal
from mtkit.engines.constraints import MAX_LINE_PHRASES, Constraints, constraint_source
from mtkit.engines.device import resolve_device
from mtkit.engines.engine import Engine, Translation
from mtkit.engines.factory import (  # the factory is this module's helper: nothing else imports it
    ENGINES,
    LoadOptions,
    build_translator,
    forced_scorer,
    is_exported_model,
    is_onnx_export,
    say_loaded,
    torch_engine,
)
from mtkit.engines.quality import load_qe_model
from mtkit.errors import MtkitError
from mtkit.export.cache import check_quantization, ctranslate2_model
from mtkit.importers import write_run
from mtkit.metrics.scores import MetricOptions, score
from mtkit.text.glossary import Glossary
from mtkit.text.lines import clean_output
from mtkit.text.pipeline import GuardCounts, sentence_reports, translate_lines

__all__ = ["ENGINES", "DECODE_OPTIONS", "LoadOptions", "Model", "Result", "Hypothesis", "TranslationPipeline",
           "load", "load_models", "from_model", "comet_scorer", "evaluate", "detect", "pipeline"]

# The decoding options a call may set (DecodeOptions' fields, but forced_eos; the checks and messages are the
# CLI's, :meth:`mtkit.config.DecodeOptions.check`, with keywords for flags).
DECODE_OPTIONS = ("beam", "nbest", "alpha", "length_penalty", "max_len_a", "max_len_b", "min_len", "max_input_len",
                  "sampling", "temperature", "top_k", "top_p", "epsilon", "no_repeat_ngram_size", "batch_tokens", "mbr",
                  "mbr_candidates", "mbr_comet_model", "alignments", "alignment_layer", "alignment_threshold", "split",
                  "guard", "shortlist")


@dataclass(frozen=True)
class Hypothesis:
    """One translation of a line.

    Attributes:
        text: the detokenized translation.
        score: what search ranks by: the log-probability divided by the length penalty.
        logprob: log P(translation and its EOS | source), natural log.
        tokens: the target's SentencePiece pieces.
        alignment: with ``alignments="hard"`` or ``"soft"``, (source word, target word) pairs, 0-based, words
            split at whitespace (docs/alignments.md); else None.
    """

    text: str
    score: float
    logprob: float
    tokens: list[str]
    alignment: list[tuple[int, int]] | None = None


@dataclass(frozen=True)
class Result:
    """The translation of one line: its ``hypotheses``, best first (``nbest`` of them when asked; an empty
    line has one, empty), the include phrases (constraints, glossary terms) the best one lacks, and with
    sentence splitting or the integrity guard on, ``sentences``: each sentence's ``source`` and ``text`` and the
    guard's ``repaired``, ``missing`` and ``loop`` (:mod:`mtkit.text.pipeline`)."""

    source: str
    hypotheses: list[Hypothesis]
    unmet: list[str] = dataclasses.field(default_factory=list)
    sentences: list[dict] = dataclasses.field(default_factory=list)

    @property
    def text(self) -> str:
        return self.hypotheses[0].text

    @property
    def score(self) -> float:
        return self.hypotheses[0].score

    @property
    def logprob(self) -> float:
        return self.hypotheses[0].logprob


def _python_names(error: MtkitError) -> MtkitError:
    """The CLI's message with keyword names for flags: ``--nbest`` -> ``nbest``."""
    return MtkitError(re.sub(r"--([a-z][a-z0-9-]*)", lambda m: m.group(1).replace("-", "_"), str(error)))


class Model:
    """A loaded model (see :func:`load`): :meth:`translate`, :meth:`score`. Never changed by a call: it owns
    its engine, forced decoding's scorer and its COMET models (quality estimation, ``evaluate``'s metric),
    built when it is loaded (the scorer of a translating model on its first use, once, under a lock: what
    any call sees is the same)."""

    def __init__(self, engine: Engine | None, path: Path | None, kind: str, *, loaded: list | None = None,
                 settings: LoadOptions | None = None, scorer: Any = None, qe: Any = None, comet: Any = None) -> None:
        self.engine = engine
        self.path = path
        self.kind = kind  # "torch", "ctranslate2" or "onnx"
        self.settings = settings or LoadOptions()
        self.checkpoints = list(loaded) if loaded is not None else None  # the torch engine's LoadedModels
        self.qe = qe  # a reference-free CometScorer (LoadOptions.qe_model), or None
        self.comet = comet  # a CometScorer (LoadOptions.comet_model), or None
        self._device = str(getattr(engine, "device", None) or getattr(scorer, "device", None) or "cpu")
        self._scorer = scorer
        self._scorer_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"mtkit.Model({str(self.path)!r}, engine={self.kind!r})"

    @property
    def decode(self) -> DecodeConfig:
        """The model's own decoding settings (what a call without options uses)."""
        return self._engine().decode

    @property
    def lowercases(self) -> bool:
        """Whether the model's target vocabulary lowercases (``data.spm.lowercase``)."""
        return self._engine().vocab.lowercases("tgt")

    def _engine(self) -> Engine:
        if self.engine is None:
            raise MtkitError("this model was loaded to score (task 'score'): load it to translate")
        return self.engine

    @property
    def scorer(self):
        """Forced decoding (:class:`mtkit.engines.pair_scoring.PairScorer`; the torch engine): built with the
        model (``task="score"``), else derived once from its checkpoints on first use."""
        if self._scorer is None:
            if self.checkpoints is None:
                raise MtkitError("score needs the torch engine (a checkpoint or run directory)")
            with self._scorer_lock:
                if self._scorer is None:
                    self._scorer = forced_scorer(self.checkpoints, self._device, self.settings.precision,
                                                 self._engine().decode.batch_tokens)
        return self._scorer

    def options(self, **options: Any) -> DecodeConfig:
        """The model's decoding settings with ``options`` set, checked as the CLI's flags are."""
        unknown = sorted(set(options) - set(DECODE_OPTIONS))
        if unknown:
            raise MtkitError(f"unknown option {unknown[0]!r}; expected one of {', '.join(DECODE_OPTIONS)}")
        given = DecodeOptions(**options)  # None: the model's own setting
        try:
            given.check()
            return given.apply(self.decode)
        except MtkitError as e:
            raise _python_names(e) from None

    def translate(self, lines: str | Sequence[str], *, target: str | None = None,
                  glossary: Mapping[str, str] | str | Path | None = None,
                  constraints: Sequence[Mapping[str, Sequence[str]] | None] | None = None,
                  **options: Any) -> Result | list[Result]:
        """Translate a line (a :class:`Result`) or a list of lines (a list of them, in order).

        Args:
            target: the target language of a multilingual model (None: its only one).
            glossary: source term -> target term (a mapping, or a TSV file as ``--glossary`` reads):
                where a line holds a source term, the translation must hold its target term.
            constraints: one ``{"include": [...], "exclude": [...]}`` (or None) per line.
            options: decoding settings for this call (:data:`DECODE_OPTIONS`: ``beam=4``, ``nbest=2``,
                ``alpha=0.6``, ``sampling=True`` …); the model's own for the rest.
        """
        single = isinstance(lines, str)
        items = [lines] if single else list(lines)
        if not all(isinstance(line, str) for line in items):
            raise MtkitError("lines: expected a string or a list of strings")
        decode = self.options(**options)
        source = self._constraints(items, glossary, constraints, decode)
        results = [self._result(t, decode)
                   for t in translate_lines(self._engine(), items, buffer_size=max(1, len(items)), constraints=source,
                                            options=decode, target=target)]
        return results[0] if single else results

    def _constraints(self, items: list[str], glossary, constraints, decode: DecodeConfig):
        if glossary is None and constraints is None:
            return None
        if decode.sampling:
            raise MtkitError(f"{'constraints' if constraints is not None else 'glossary'} needs beam search: "
                             "drop sampling")
        terms = None
        if isinstance(glossary, (str, Path)):
            terms = Glossary.read(Path(glossary), "glossary")
        elif glossary is not None:
            terms = Glossary((s, t, f"glossary[{s!r}]") for s, t in dict(glossary).items())
        per_line = None
        if constraints is not None:
            per_line = list(constraints)
            if len(per_line) != len(items):
                raise MtkitError(f"constraints: {len(per_line)} given for {len(items)} lines; give one per line")
            per_line = [Constraints.from_json(dict(c), f"constraints[{i}]", MAX_LINE_PHRASES) if c else None
                        for i, c in enumerate(per_line)]
        refusal = include_refusal(self.kind)
        if refusal is not None and (terms is not None or any(c and c.include for c in per_line or [])):
            raise MtkitError(f"{'glossary' if terms is not None else 'constraints'}: {refusal}")
        return constraint_source(per_line, terms, "constraints")

    @staticmethod
    def _result(t: Translation, decode: DecodeConfig) -> Result:
        hypotheses = [Hypothesis(clean_output(c.text), c.score, c.logprob, list(c.pieces), c.alignment)
                      for c in t.candidates[: max(1, decode.nbest)]]
        reports = sentence_reports(t) if decode.split == "sentences" or decode.guard else []
        return Result(t.source, hypotheses, list(t.unmet), reports)

    def document_texts(self, *, target: str | None = None, glossary: Mapping[str, str] | str | Path | None = None,
                       counts: GuardCounts | None = None, progress: Any = None, **options: Any) -> Texts:
        """What a document's format hands its text to (:class:`mtkit.documents.Texts`): this model's translations
        with hard word alignments (which put formatting back), ``glossary`` and ``options`` as :meth:`translate`
        takes them; ``counts``: the integrity guard's tally, added to; ``progress``: called with each batch's
        number of fragments."""
        engine = self._engine()
        aligned = CAPABILITIES[self.kind].alignments
        decode = self.options(**options)
        if aligned and decode.alignments == "off":
            decode = dataclasses.replace(decode, alignments="hard")
        source = self._constraints([], glossary, None, decode)

        def translate(sentences: list[str]) -> list[tuple[str, list]]:
            return [(clean_output(t.best.text), t.best.alignment or [])
                    for t in translate_lines(engine, sentences, buffer_size=max(1, len(sentences)), options=decode,
                                             constraints=source, target=target, counts=counts)]

        return Texts(translate, aligned=aligned, progress=progress)

    def translate_document(self, data: bytes, format: str, *, name: str = "document", target: str | None = None,
                           glossary: Mapping[str, str] | str | Path | None = None, limits: Limits | None = None,
                           **options: Any) -> bytes:
        """The document ``data`` (``format``: one of :data:`mtkit.documents.DOCUMENT_FORMATS`) translated, its
        structure and formatting kept (:mod:`mtkit.documents`); ``name`` names it in errors."""
        if format not in DOCUMENT_FORMATS:
            raise MtkitError(f"format {format!r}: expected one of {', '.join(DOCUMENT_FORMATS)}")
        texts = self.document_texts(target=target, glossary=glossary, **options)
        return translate_bytes(data, format, texts, name, limits or Limits())

    def translate_file(self, source: str | Path, out: str | Path, *, format: str | None = None,
                       target: str | None = None, glossary: Mapping[str, str] | str | Path | None = None,
                       limits: Limits | None = None, **options: Any) -> str:
        """Translate the document ``source`` into ``out`` (written whole or not at all), the format taken from
        ``source``'s extension or ``format`` (.docx .pptx .odt .odp .epub .srt .vtt .md .html .txt); returns it."""
        texts = self.document_texts(target=target, glossary=glossary, **options)
        return translate_file(source, out, texts, format, limits or Limits())

    def score(self, sources: Sequence[str], targets: Sequence[str], *, target: str | None = None) -> list:
        """log P(target | source) of each pair by forced decoding: a list of
        :class:`mtkit.engines.pair_scoring.PairScore` (``logprob``, ``mean``, ``tokens``), in order (torch engine)."""
        if self.checkpoints is None and self._scorer is None:  # (engines without forced scoring keep no checkpoints)
            raise MtkitError(f"score needs the {either('forced_scoring')} engine (a checkpoint or run directory)")
        sources, targets = list(sources), list(targets)
        if len(sources) != len(targets):
            raise MtkitError(f"score: {len(sources)} sources but {len(targets)} targets")
        return list(self.scorer.score(zip(sources, targets), chunk_size=max(1, len(sources)), target=target))


_LOAD_KEYWORDS = ("engine", "device", "precision", "threads", "target", "quantization")


def load(path: str | Path, **settings: Any) -> Model:
    """Load a model to translate with.

    Args:
        path: an mtkit run directory or checkpoint (the torch engine), a folder written by ``mtkit
            export ctranslate2`` (the CTranslate2 engine) or ``mtkit export onnx`` (ONNX Runtime), or a Marian
            model in the Hugging Face layout (a folder ``mtkit export hf`` wrote, an OPUS-MT model), imported on
            load as ``mtkit import marian`` imports it (the torch engine), as :func:`pipeline` does.
        settings: keywords, as :class:`LoadOptions` names them:
        engine: ``torch``, ``ctranslate2`` or ``onnx`` (None: the one ``path`` is for); ``ctranslate2`` on a run
            directory or checkpoint exports it on first use and keeps the export beside it
            (:mod:`mtkit.export.cache`).
        quantization: with ``engine="ctranslate2"`` on a run directory or checkpoint, its export's weights
            (``int8``, ``int16``, ``float16`` …; None: float32).
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        precision: ``fp32``, ``bf16`` or ``fp16`` (CUDA).
        threads: CPU threads (None: torch's count is left as the process has it; 0: one per CPU that other
            work leaves free, or ``OMP_NUM_THREADS``; N: N).
        target: the target language calls translate into by default (a multilingual model's).
    """
    unknown = sorted(set(settings) - set(_LOAD_KEYWORDS))
    if unknown:
        raise MtkitError(f"unknown setting {unknown[0]!r}; expected one of {', '.join(_LOAD_KEYWORDS)}")
    return _load(Path(path), LoadOptions(**settings))


def _load(path: Path, o: LoadOptions) -> Model:
    """:func:`load` with its settings: the path checked, a Hugging Face folder imported, errors naming keywords."""
    if not path.exists():
        raise MtkitError(f"{path}: no such checkpoint, run directory or exported model")
    if is_hugging_face_folder(path):
        if o.engine not in (None, "torch") or o.quantization is not None:
            raise MtkitError(f"{path}: a Hugging Face model folder loads with the torch engine; for "
                             f"{o.engine or 'ctranslate2'}, import it first (mtkit import marian {path} -o RUN) "
                             "and load RUN")
        return _load_marian(str(path), o)
    engine = o.engine
    if engine is None:
        engine = "ctranslate2" if is_exported_model(path) else "onnx" if is_onnx_export(path) else "torch"
    if engine not in ENGINES:
        raise MtkitError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")
    if o.threads is not None and o.threads < 0:
        raise MtkitError(f"threads: must be >= 0 (0: one per CPU other work leaves free), got {o.threads}")
    try:
        if engine != "ctranslate2" and o.quantization is not None:
            check_quantization(engine, o.quantization)
        return load_models([path], dataclasses.replace(o, engine=engine, any_target=o.target is None))
    except MtkitError as e:
        raise _python_names(e) from None


def load_models(paths: Sequence[str | Path], options: LoadOptions) -> Model:
    """The commands', the server's and training's door: ``paths`` (one model, or an ensemble of checkpoints)
    loaded as ``options`` say, checked as the CLI checks them (errors name its flags); what was loaded, and the
    thread count, said to the ``mtkit`` logger. Torch's thread count changes only when asked
    (:attr:`LoadOptions.threads`, :attr:`LoadOptions.thread_policy`)."""
    o = options
    paths = [Path(p) for p in paths]
    engine = o.engine or "torch"
    qe = comet = None
    if o.qe_model is not None:  # loaded first: a model that cannot be had fails before any translation
        if isinstance(o.qe_model, str):
            qe = load_qe_model(o.qe_model, o.device)
        else:
            qe = o.qe_model
    if o.comet_model is not None:
        comet = comet_scorer(o.comet_model, o.device)
    if o.task == "score":
        return _scoring_model(paths, o, qe, comet)
    if engine == "ctranslate2" and len(paths) == 1:  # a checkpoint or run directory: its kept export
        check_quantization(engine, o.quantization)
        paths = [ctranslate2_model(paths[0], o.quantization)]
    found: dict = {}

    def inspect(loaded: list) -> None:
        found["loaded"] = loaded
        if o.check is not None:
            o.check(loaded)

    translator = build_translator(paths, dataclasses.replace(o, engine=engine), inspect)
    return Model(translator, paths[0] if len(paths) == 1 else None, engine, loaded=found.get("loaded"), settings=o,
                 qe=qe, comet=comet)


def _scoring_model(paths: list[Path], o: LoadOptions, qe: Any, comet: Any) -> Model:
    """A model for forced decoding only (``task="score"``): the checkpoints and their scorer, no search engine."""
    for path in paths:
        precheck(path)  # before torch loads
    device = resolve_device(o.device)
    if o.precision == "fp16" and not device.startswith("cuda"):
        raise MtkitError("--precision fp16 needs a CUDA device; use bf16 on CPU")
    loaded = [load_model(p, device) for p in paths]
    scorer = forced_scorer(loaded, device, o.precision, o.batch_tokens)
    same_pairs([m.config for m in loaded])
    if not (o.any_target and o.target is None):
        scorer.vocab_for(o.target)  # a wrong target is an error before any line is read
    say_loaded(loaded)
    return Model(None, paths[0] if len(paths) == 1 else None, "torch", loaded=loaded, settings=o, scorer=scorer,
                 qe=qe, comet=comet)


def from_model(model: Any, vocab: Any, decode: DecodeConfig, device: str = "cpu") -> Model:
    """A model in memory (training's, for validation: its ``Transformer`` and the run's vocabulary, which
    tags sources as the call needs) behind the torch engine, with ``decode``'s settings; says nothing."""
    engine = torch_engine([SimpleNamespace(model=model, vocab=vocab)], decode, str(device), warn=False)
    return Model(engine, None, "torch", settings=LoadOptions(device=str(device)))


def comet_scorer(name: str, device: str = "auto"):
    """A COMET model (:class:`mtkit.metrics.comet.CometScorer`; a hub name or a folder) on ``device``."""
    from mtkit.metrics.comet import CometScorer

    return CometScorer(name, device)


def _load_marian(source: str, o: LoadOptions) -> Model:
    """A Marian model in the Hugging Face layout (a folder, or a hub name), imported as ``mtkit import marian``
    imports it (nothing of the folder runs: its JSON, SentencePiece models and weights are read and checked)
    into a temporary run directory, and loaded from there with the torch engine."""
    from mtkit.importers.marian import marian_folder, read_marian

    imported = read_marian(marian_folder(source))
    with tempfile.TemporaryDirectory(prefix="mtkit-import-") as tmp:
        loaded = _load(write_run(imported, Path(tmp) / "run"), dataclasses.replace(o, engine="torch"))
    loaded.path = Path(source)
    return loaded


def evaluate(hypotheses: Sequence[str], references: Sequence[Sequence[str]] | Sequence[str],
             metrics: Sequence[str] = ("bleu", "chrf", "ter"), **options: Any) -> list:
    """sacreBLEU scores of detokenized ``hypotheses`` against raw ``references`` (one list per reference
    stream, or one list of lines: a single reference each): a list of
    :class:`mtkit.metrics.scores.MetricScore` (``metric``, ``score``, ``signature``), one per metric.
    ``options``: the fields of :class:`mtkit.metrics.scores.MetricOptions` (``chrf_plus``, ``lowercase_tok``,
    ``lang`` …)."""
    refs = list(references)
    if refs and isinstance(refs[0], str):
        refs = [refs]
    return score(list(hypotheses), refs, list(metrics), MetricOptions(**options))


def detect(texts: str | Sequence[str], candidates: Sequence[str] | None = None) -> list[tuple[str, float]] | list:
    """The language of a text (or of each of a list), as ``mtkit detect`` and the server's ``/detect`` find it
    (lingua, :mod:`mtkit.langid`; ``mtkit[serve]``): (ISO 639-1 code, confidence in [0, 1]) pairs, best first,
    among ``candidates`` (None: :data:`mtkit.langid.COMMON`); a text without letters gets an empty list. Each text
    is judged on its first :data:`mtkit.langid.PREFIX_CHARS` characters.

        >>> mtkit.detect("Ein Hund rennt durch den Schnee.")[0]      # ('de', 0.97...)
    """
    single = isinstance(texts, str)
    items = [texts] if single else list(texts)
    if not all(isinstance(text, str) for text in items):
        raise MtkitError("texts: expected a string or a list of strings")
    found = langid.detect(items, langid.COMMON if candidates is None else langid.candidates_of(candidates))
    return found[0] if single else found


class TranslationPipeline:
    """What ``transformers.pipeline("translation", model=...)`` gave until transformers 5 removed it:
    called with a string or a list of strings, it answers ``[{"translation_text": ...}]``, one dict per
    input (a list of ``num_return_sequences`` dicts per input when that is above 1). Its outputs are
    ``generate``'s: each input is one sentence and no integrity guard searches again (``mtkit.load(...).translate``
    splits sentences and guards by default, :mod:`mtkit.text.pipeline`)."""

    def __init__(self, model: Model) -> None:
        self.model = model

    def __repr__(self) -> str:
        return f"mtkit.TranslationPipeline({self.model!r})"

    def __call__(self, inputs: str | Sequence[str], *, batch_size: int | None = None, max_length: int | None = None,
                 num_beams: int | None = None, num_return_sequences: int = 1, **unused: Any) -> list:
        """Translate ``inputs``.

        Args:
            batch_size: lines translated together (None: all of them; mtkit batches by tokens within).
            max_length: as generate's: the decoder's length with its start token, so at most
                ``max_length - 1`` tokens and EOS (None: the model's own limit).
            num_beams: the beam size (1: greedy; None: the model's).
            num_return_sequences: hypotheses per input, best first (at most ``num_beams``).
            unused: generate's other keywords are refused by name (so a setting never silently differs).
        """
        if unused:
            raise MtkitError(f"unsupported keyword {sorted(unused)[0]!r}; mtkit's pipeline takes batch_size, "
                             "max_length, num_beams and num_return_sequences")
        single = isinstance(inputs, str)
        lines = [inputs] if single else list(inputs)
        options = DecodeOptions(beam=num_beams, nbest=num_return_sequences, split="none", guard=False)
        if max_length is not None:
            if max_length < 2:
                raise MtkitError(f"max_length: must be at least 2 (the start token and one more), got {max_length}")
            options = options.replace(max_len_a=0.0, max_len_b=max_length - 2)
        size = max(1, batch_size or len(lines) or 1)
        results: list[Result] = []
        for start in range(0, len(lines), size):
            results += self.model.translate(lines[start:start + size], **options.given())
        answers = [[{"translation_text": h.text} for h in self._padded(r.hypotheses, num_return_sequences)]
                   for r in results]
        if num_return_sequences == 1:
            return [a[0] for a in answers]
        return answers[0] if single else answers

    @staticmethod
    def _padded(hypotheses: list[Hypothesis], n: int) -> list[Hypothesis]:
        """Exactly ``n`` hypotheses (an input with fewer distinct ones repeats its last, as n-best lists do)."""
        return (hypotheses + hypotheses[-1:] * n)[:n]


def pipeline(task: str = "translation", model: str | Path | None = None, device: int | str | None = None,
             threads: int | None = None) -> TranslationPipeline:
    """A drop-in for ``transformers.pipeline("translation", model=...)``, which transformers 5 removed.

    Args:
        task: ``translation`` (or ``translation_xx_to_yy``, as transformers named it).
        model: an mtkit run directory or checkpoint, a folder written by ``mtkit export ctranslate2``, or a
            Marian / OPUS-MT model in the Hugging Face layout (a folder, or a hub name such as
            ``Helsinki-NLP/opus-mt-en-de``, downloaded through ``huggingface_hub``), imported on load as
            ``mtkit import marian`` imports it.
        device: transformers' ``-1`` (CPU) or a CUDA index, or mtkit's ``auto`` / ``cpu`` / ``cuda:N``.
        threads: CPU threads (None: torch's count is left as it is; 0: one per CPU that other work leaves free).
    """
    if not re.fullmatch(r"translation(_[A-Za-z-]+_to_[A-Za-z-]+)?", task):
        raise MtkitError(f"task {task!r}: mtkit's pipeline translates (task 'translation')")
    if model is None:
        raise MtkitError("model: give an mtkit run, an exported CTranslate2 folder or a Marian model")
    if device is None:
        device = "auto"
    elif isinstance(device, int):
        device = "cpu" if device < 0 else f"cuda:{device}"
    path = Path(model)
    if not path.exists():  # a hub name
        return TranslationPipeline(_load_marian(str(model), LoadOptions(device=device, threads=threads)))
    return TranslationPipeline(load(path, device=device, threads=threads))

"""The engines' common pipeline: lines in, one :class:`Translation` per line out, in input order.

An engine (:class:`mtkit.engines.torch_engine.TorchEngine`,
:class:`mtkit.engines.ctranslate2_engine.Ctranslate2Engine`) supplies
:meth:`Engine.search_batch`; :class:`Engine`:

* reads its input lazily, ``buffer_size`` lines at a time (never the whole input),
  or what a pipe has delivered so far when it has no more ready (a None in the lines,
  see :func:`mtkit.text.lines.read_ready_lines`);
* encodes a chunk, sorts it by length, cuts token-budget batches
  (``decode.batch_tokens`` padded source tokens per batch; beam rows come on top),
  and yields the results in input order;
* yields exactly one :class:`Translation` per input line: an empty (or all-blank)
  line gives an empty translation without running the model, and an input longer
  than ``decode.max_input_len`` tokens (or than the model's position table) is
  truncated with a warning (the ``mtkit`` logger: stderr, in the CLI) naming its line number, never dropped;
* with ``constraints`` (:mod:`mtkit.engines.constraints`), gives the lines that have some to the
  engine's :meth:`Engine.search_constrained_batch`, and warns, naming the line, when a
  best translation lacks an ``include`` phrase (it did not fit in the maximum output length); an
  include phrase the model cannot write (a character outside its vocabulary) is not forced, is
  unmet on every line that has it (``Translation.unwritable`` says why) and is warned about once;
* with ``decode.alignments`` (``hard`` or ``soft``), gives every candidate its word alignment
  (:mod:`mtkit.data.word_alignment`) from one teacher-forced pass of the engine's
  :meth:`Engine.attention_batch` after the search, batched as the search is; :meth:`Engine.align` aligns
  translations given from elsewhere;
* refuses a line holding a lone surrogate (not Unicode text; SentencePiece cannot encode it) with
  a one-line error naming the line.

No torch at load time: the CTranslate2 engine never loads it (CTranslate2 runs several
times slower once torch's OpenMP runtime is loaded and used in the same process).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from mtkit.config import EOS_ID, DecodeConfig
from mtkit.data.languages import for_target
from mtkit.data.vocab import check_text
from mtkit.data.word_alignment import check_layer, default_layer, word_alignment
from mtkit.engines.capabilities import Capabilities, no_alignments, shortlist_refusal
from mtkit.engines.constraints import ConstraintSource, PieceConstraints, PieceIndex, encode_constraints, unmet
from mtkit.engines.mbr import Utilities, mbr_order, search_decoding
from mtkit.errors import MtkitError, counted

logger = logging.getLogger(__name__)


@dataclass
class Candidate:
    """One hypothesis: target ids (no BOS/EOS), its text and pieces, ``score`` (what search ranks by:
    ``logprob / lp(n + 1)``, ``lp`` the call's length penalty, ``n`` the hypothesis's tokens) and
    ``logprob``, log P(hypothesis and its EOS | source) in nats, as search found it."""

    ids: list[int]
    text: str
    pieces: list[str]
    score: float
    logprob: float
    alignment: list[tuple[int, int]] | None = None  # (source word, target word) pairs, with decode.alignments
    sentences: int = 1  # sentences joined into this one (mtkit.text.pipeline): each with its EOS in ``logprob``

    @property
    def mean_logprob(self) -> float:
        """The mean log-probability per target token (each sentence's EOS included): the per-sentence confidence."""
        return self.logprob / (len(self.ids) + self.sentences)


@dataclass
class Translation:
    """The result for input line ``index`` (0-based): ``candidates``, best first (at least one)."""

    index: int
    source: str
    src_ids: list[int]  # as fed to the model (truncated, ending in EOS); empty for an empty line
    candidates: list[Candidate] = field(default_factory=list)
    unmet: list[str] = field(default_factory=list)  # include phrases the best candidate lacks (as written)
    # include phrases (as given, also in ``unmet``) that the model cannot write, so never forced -> why
    unwritable: dict[str, str] = field(default_factory=dict)
    # A line of several sentences (mtkit.text.pipeline): each sentence's own translation, in order; empty for one.
    parts: list[Translation] = field(default_factory=list)
    # The integrity guard's findings, one per sentence (mtkit.text.pipeline.Checked); empty when it is off.
    checks: list[Any] = field(default_factory=list)

    @property
    def best(self) -> Candidate:
        return self.candidates[0]


@dataclass(frozen=True)
class Call:
    """What one :meth:`Engine.translate` call decodes with, passed to the engine's search:
    the decoding settings and the vocabulary of the call's target (a multilingual model's
    :class:`mtkit.data.languages.TaggedVocab`, which leads sources, or the decoder, with the tag)."""

    decode: DecodeConfig
    vocab: Any
    generator: Any = None  # sampling's random generator, one per call (the torch engine's)
    # Asked between batches and (mtkit's engine) before every search step; True stops the call with
    # :class:`Stopped` (a server's deadline, or a request whose client has gone). None: never.
    should_stop: Callable[[], bool] | None = None
    # The 1-based input line number that messages give item ``i`` (0-based) of the call; None: ``i + 1``
    # (a caller that splits lines into sentences names the lines).
    numbering: Callable[[int], int] | None = None

    def number(self, index: int) -> int:
        """The line number messages name for item ``index`` (0-based) of the call."""
        return index + 1 if self.numbering is None else self.numbering(index)

    def check_stop(self) -> None:
        if self.should_stop is not None and self.should_stop():
            raise Stopped("the translation was stopped (its deadline passed or nobody waits for it)")


class Stopped(Exception):
    """A :meth:`Engine.translate` call stopped by its ``should_stop``, between two search steps
    or two batches: its lines are not translated."""


@dataclass
class _Warnings:
    """What one call has warned about already (each warning once per call)."""

    max_len: bool = False
    unwritable: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class EngineOptions:
    """How an engine computes, fixed when it is built (the torch and CTranslate2 engines').

    Args:
        device: ``cpu``, ``cuda`` or ``cuda:N``.
        precision: ``fp32``, or ``bf16``/``fp16`` (the torch engine's autocast; CTranslate2's compute type).
        seed: the sampling seed (the same input and batch give the same samples; torch engine).
        warn: say warnings (a truncated line, an unmet phrase, a new thread count) on the ``mtkit`` logger;
            False for an engine whose warnings nobody reads (validation's).
    """

    device: str = "cpu"
    precision: str = "fp32"
    seed: int = 1
    warn: bool = True


def chunks(lines: Iterable[str | None], buffer_size: int) -> Iterator[list[str]]:
    """``lines`` in chunks of ``buffer_size`` (at least 1), a None ending a chunk early (no more input is ready)."""
    buffer_size = max(1, buffer_size)
    chunk: list[str] = []
    for line in lines:
        if line is not None:
            chunk.append(line)
        if chunk and (line is None or len(chunk) >= buffer_size):
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class Engine:
    """Lines in, :class:`Translation` objects out, in input order; engines supply :meth:`search_batch`.

    Everything fixed is given at construction and never changed after: one engine serves any number
    of threads at once, each :meth:`translate` call with its own settings and target language. What it
    warns about goes to the ``mtkit.engines.engine`` logger (:meth:`say`).

    Args:
        vocab: a :class:`mtkit.data.vocab.Vocab` (``encode_src_batch``, ``decode_tgt``, ``tgt_pieces``).
        decode: the default decoding settings (a call may give others); checked ones, as the config, the
            factory's flags and the server's requests make them (:func:`mtkit.config.check_decode`).
        max_positions: the model's position table size, bounding input and output lengths.
        languages: a multilingual model's pairs (:class:`mtkit.data.languages.Pair`) and, for a model of
            one pair, that pair (``(src, tgt)`` or None): which targets a call may ask for.
        tag_side: where a multilingual model's tag goes (``source`` or ``target``, ``data.tag_side``).
        target: the target language a call without one translates into (a multilingual model's).
        threads: a :class:`mtkit.engines.threads.ThreadPolicy` fitted before each batch, in the thread that
            decodes it (the count changes as other work comes and goes; said as a warning is); None: the
            count stays as it is.
    """

    capabilities: Capabilities | None = None  # what an engine of its kind can do (mtkit.engines.capabilities)
    warn = True  # whether :meth:`say` says anything (EngineOptions.warn)

    def __init__(self, vocab, decode: DecodeConfig, max_positions: int | None = None,
                 languages: tuple[list, tuple[str, str] | None] = ([], None), tag_side: str = "source",
                 target: str | None = None, threads=None) -> None:
        self.vocab = vocab
        self.decode = decode
        self.languages = (list(languages[0]), languages[1])
        self.tag_side = tag_side
        self.target = target
        self.max_positions = max_positions
        self.threads = threads
        self.max_out_len = None if max_positions is None else max_positions - 1
        self._pieces: PieceIndex | None = None  # the target pieces' index, built on the first exclude phrase
        self._pieces_lock = threading.Lock()
        self.decoder_layers: int | None = None  # for alignments; None: this engine gives none
        self.guided: tuple[int, int] | None = None  # the guided-alignment (layer, head) of a model trained with one
        self.utilities = Utilities()  # MBR's COMET utilities, loaded on first use and owned here

    def say(self, message: str) -> None:
        """A warning (or a new thread count), on the ``mtkit`` logger, unless this engine was built not to warn."""
        if self.warn:
            logger.info(message)

    @property
    def gives_alignments(self) -> bool:
        """Whether this engine gives word alignments: its kind can (:attr:`capabilities`) and its model does (a
        CTranslate2 export declares its alignment head)."""
        kind_can = self.capabilities is None or self.capabilities.alignments  # (a stand-in declares none)
        return kind_can and self.decoder_layers is not None

    def pieces(self) -> PieceIndex:
        """The :class:`mtkit.engines.constraints.PieceIndex` of the target pieces (the same for every
        target: a tag changes the sources, not the pieces), built once, on first use."""
        with self._pieces_lock:
            if self._pieces is None:
                self._pieces = PieceIndex(self.vocab)
            return self._pieces

    def max_src_len(self, decode: DecodeConfig) -> int:
        """Source tokens (EOS included) a line is truncated to."""
        return decode.max_input_len if self.max_positions is None else min(decode.max_input_len, self.max_positions)

    def vocab_for(self, target: str | None, flag: str = "--tgt-lang"):
        """The vocabulary that encodes sources for ``target`` (:func:`mtkit.data.languages.for_target`): this
        engine's own for a model of one pair; a one-line error naming ``flag`` for a target it lacks."""
        pairs, single = self.languages
        if not pairs and target is None:
            return self.vocab
        return for_target(self.vocab, pairs, single, target, flag, self.tag_side)

    def call(self, options: DecodeConfig | None = None, target: str | None = None) -> Call:
        """The :class:`Call` of ``options`` (default: the engine's settings) into ``target`` (default: the
        engine's)."""
        decode = self.decode if options is None else options
        refused = shortlist_refusal(self.capabilities.name) if decode.shortlist and self.capabilities else None
        if refused:
            raise MtkitError(refused)
        return Call(decode, self.vocab_for(self.target if target is None else target))

    # ------------------------------------------------------------------ engine

    def search_batch(self, batch: list[list[int]], call: Call) -> list[list[tuple[list[int], float, float]]]:
        """Source ids (each ending in EOS) -> per sentence, (target ids, score, log-probability) triples,
        best first (see :class:`Candidate`)."""
        raise NotImplementedError

    def search_constrained_batch(self, batch: list[list[int]], constraints: list[PieceConstraints | None],
                                 call: Call) -> list[list[tuple[list[int], float, float]]]:
        """As :meth:`search_batch`, each sentence with its constraints (None: none)."""
        raise MtkitError(f"{type(self).__name__} cannot translate with constraints")

    def attention_batch(self, sources: list[list[int]], outputs: list[list[int]], call: Call, layer: int,
                        head: int | None) -> list:
        """The cross-attention of decoder ``layer`` (0-based), ``head`` or the mean of its heads (None), of each
        source (ids ending in EOS) over its output (ids without BOS/EOS): per pair a (len(output), len(source))
        array, row ``t`` the decoder position that predicted output piece ``t``."""
        raise MtkitError(f"{type(self).__name__} gives no alignments")

    def alignment_source(self, d: DecodeConfig) -> tuple[int, int | None]:
        """The (layer, head) whose attention aligns (head None: the mean of the layer's heads): the layer
        ``d.alignment_layer`` asks for, else the guided-alignment head, else the penultimate layer."""
        if self.decoder_layers is None:
            raise MtkitError(f"{getattr(self, 'description', type(self).__name__)}: gives no word alignments "
                             f"({no_alignments()})")
        if d.alignment_layer is not None:
            return check_layer(d.alignment_layer, self.decoder_layers), None
        if self.guided is not None:
            return self.guided
        return default_layer(self.decoder_layers), None

    def align(self, lines: Sequence[str], targets: Sequence[str], options: DecodeConfig | None = None,
              target: str | None = None) -> list[list[tuple[int, int]]]:
        """The word alignment of each line with a translation of it given in ``targets`` (a reference, or another
        system's output), as ``options`` (default: the engine's; hard unless they say soft) align an output;
        target words are those of the translation as the model's SentencePiece writes it back."""
        if len(lines) != len(targets):
            raise MtkitError(f"{counted(len(lines), 'line')} but {counted(len(targets), 'translation')} to align "
                             "them with")
        call = self.call(options, target)
        if call.decode.alignments == "off":
            call = dataclasses.replace(call, decode=dataclasses.replace(call.decode, alignments="hard"))
        lines, targets = list(lines), list(targets)
        src = self._encode(lines, 0, call, _Warnings())
        outputs = [call.vocab.encode_tgt(t)[: self.max_out_len] for t in targets]  # beyond the positions: unaligned
        candidates = [[Candidate(ids, text, [], 0.0, 0.0)] for ids, text in zip(outputs, targets, strict=True)]
        self._align(lines, src, candidates, call)
        return [c[0].alignment or [] for c in candidates]

    def _align(self, lines: list[str], src: list[list[int]], candidates: list[list[Candidate]], call: Call) -> None:
        """Set each candidate's word ``alignment`` (:mod:`mtkit.data.word_alignment`), batched as search is."""
        d = call.decode
        layer, head = self.alignment_source(d)
        pairs = [(i, c) for i, cands in enumerate(candidates) if src[i] for c in cands]
        for c in (c for cands in candidates for c in cands):
            c.alignment = []
        if not pairs:
            return
        src_words = {i: call.vocab.src_words(lines[i])[: len(src[i]) - 1] + [-1] for i in {i for i, _ in pairs}}
        rows = [src[i] for i, _ in pairs]
        for batch in self.batches(rows, d.batch_tokens):
            call.check_stop()
            todo = [pairs[k] for k in batch if pairs[k][1].ids]
            if not todo:
                continue
            found = self.attention_batch([src[i] for i, _ in todo], [c.ids for _, c in todo], call, layer, head)
            for (i, c), attention in zip(todo, found, strict=True):
                c.alignment = word_alignment(attention, src_words[i], call.vocab.tgt_words(c.ids), d.alignments,
                                             d.alignment_threshold)

    # ---------------------------------------------------------------- pipeline

    def translate(self, lines: Iterable[str | None], buffer_size: int = 1000,
                  constraints: ConstraintSource | None = None, options: DecodeConfig | None = None,
                  target: str | None = None, should_stop: Callable[[], bool] | None = None,
                  numbering: Callable[[int], int] | None = None) -> Iterator[Translation]:
        """Translate ``lines`` (text without newlines), reading ``buffer_size`` lines at a time.

        Yields one :class:`Translation` per line, in input order, a chunk at a time;
        with ``buffer_size=1`` each line is yielded as soon as it is translated. A None
        in ``lines`` (see :func:`read_ready_lines`) ends the chunk early. ``constraints``
        gives each line's constraints, called in input order with (0-based index, line).
        ``options``: this call's decoding settings (default: the engine's); ``target``: the target
        language of a multilingual model (None: its only one, or a one-line error). ``should_stop``:
        asked between batches and search steps; when it answers True the call raises :class:`Stopped`.
        ``numbering``: the line number that warnings and errors give item ``i`` (0-based; None: ``i + 1``).
        """
        call = dataclasses.replace(self.call(options, target), should_stop=should_stop, numbering=numbering)
        warned = _Warnings()
        start = 0
        for chunk in chunks(lines, buffer_size):
            yield from self._translate_chunk(chunk, start, constraints, call, warned)
            start += len(chunk)

    def translate_text(self, lines: Sequence[str], constraints: ConstraintSource | None = None,
                       options: DecodeConfig | None = None, target: str | None = None) -> list[str]:
        """Convenience: the best translation of each line."""
        return [t.best.text for t in self.translate(lines, constraints=constraints, options=options, target=target)]

    def _encode(self, lines: list[str], start: int, call: Call, warned: _Warnings) -> list[list[int]]:
        for i, line in enumerate(lines):
            check_text(line, f"line {call.number(start + i)}")
        encoded = call.vocab.encode_src_batch(lines)
        max_src_len = self.max_src_len(call.decode)
        out = []
        for i, ids in enumerate(encoded):
            if not ids:
                out.append([])
                continue
            if len(ids) + 1 > max_src_len:
                self.say(f"warning: line {call.number(start + i)}: {len(ids) + 1} source tokens (with EOS), "
                         f"truncated to {max_src_len} (decode.max_input_len or the model's max_positions)")
                ids = ids[: max_src_len - 1]
            out.append(list(ids) + [EOS_ID])
            self._check_max_len(len(ids) + 1, call.number(start + i), call.decode, warned)
        return out

    def _check_max_len(self, src_len: int, number: int, d: DecodeConfig, warned: _Warnings) -> None:
        """Warn, once, when the maximum output length a·S + b leaves a line a single token."""
        if warned.max_len or int(d.max_len_a * src_len + d.max_len_b) >= 1:
            return
        warned.max_len = True
        self.say(f"warning: line {number}: the maximum output length max_len_a·S + max_len_b = "
                 f"{d.max_len_a:g}·{src_len} + {d.max_len_b} is below 1, so its output is cut to one token "
                 "(see --max-len-a/--max-len-b); other such lines are not reported")

    def batches(self, src: list[list[int]], batch_tokens: int | None = None) -> list[list[int]]:
        """Indices of the non-empty sentences in length-sorted batches of at most ``batch_tokens``
        (default ``decode.batch_tokens``) padded source tokens (at least one sentence each)."""
        budget = self.decode.batch_tokens if batch_tokens is None else batch_tokens
        order = sorted((i for i, ids in enumerate(src) if ids), key=lambda i: -len(src[i]))
        batches, current, width = [], [], 0
        for i in order:
            new_width = max(width, len(src[i]))
            if current and new_width * (len(current) + 1) > budget:
                batches.append(current)
                current, new_width = [], len(src[i])
            current.append(i)
            width = new_width
        if current:
            batches.append(current)
        return batches

    def _translate_chunk(self, lines: list[str], start: int, source: ConstraintSource | None, call: Call,
                         warned: _Warnings) -> Iterator[Translation]:
        src = self._encode(lines, start, call, warned)
        wanted = [None] * len(lines) if source is None else [
            encode_constraints(source(start + i, line), call.vocab, self.pieces) for i, line in enumerate(lines)]
        results: list[list[tuple[list[int], float, float]]] = [[([], 0.0, 0.0)] for _ in lines]
        mbr = call.decode.mbr != "off"
        search = dataclasses.replace(call, decode=search_decoding(call.decode)) if mbr else call
        for batch in self.batches(src, call.decode.batch_tokens):
            call.check_stop()
            said = self.threads.fit() if self.threads is not None else None
            if said is not None:
                self.say(said)
            if any(wanted[i] for i in batch):
                found = self.search_constrained_batch([src[i] for i in batch], [wanted[i] for i in batch], search)
            else:
                found = self.search_batch([src[i] for i in batch], search)
            for i, hyps in zip(batch, found, strict=True):
                results[i] = hyps or [([], 0.0, 0.0)]
        vocab = call.vocab
        chosen = []
        for i, line in enumerate(lines):
            candidates = [
                Candidate(ids, vocab.decode_tgt(ids), vocab.tgt_pieces(ids), score, logprob)
                for ids, score, logprob in results[i]
            ]
            if mbr:  # by expected utility; those that hold the include phrases still first
                ranked = mbr_order(candidates, call.decode, line, self.utilities)
                if wanted[i] is not None:
                    ranked.sort(key=lambda c, w=wanted[i]: bool(unmet(w, c.text)))
                candidates = ranked[: call.decode.nbest]
            chosen.append(candidates)
        if call.decode.alignments != "off":
            self._align(lines, src, chosen, call)
        for i, (line, candidates) in enumerate(zip(lines, chosen, strict=True)):
            missing = unmet(wanted[i], candidates[0].text)
            if missing:
                self._warn_unmet(call.number(start + i), missing, wanted[i], len(src[i]), call.decode)
            unwritable = dict(wanted[i].unwritable) if wanted[i] is not None else {}
            for phrase, why in unwritable.items():
                if phrase not in warned.unwritable:
                    warned.unwritable.add(phrase)
                    self.say(f"warning: line {call.number(start + i)}: include phrase {phrase!r}: {why} "
                             "(later lines with it are not reported)")
            yield Translation(start + i, line, src[i], candidates, missing + list(unwritable), unwritable)

    def _warn_unmet(self, number: int, missing: list[str], wanted: PieceConstraints, src_len: int,
                    d: DecodeConfig) -> None:
        limit = max(1, int(d.max_len_a * src_len + d.max_len_b))
        limit = limit if self.max_out_len is None else max(1, min(limit, self.max_out_len))
        why = (f"{wanted.include_pieces} constraint pieces, more than the maximum output length of {limit}"
               if wanted.include_pieces > limit
               else f"not met within the maximum output length of {counted(limit, 'piece')}")
        if src_len == 0:
            why = "an empty line is not translated"
        self.say(f"warning: line {number}: the translation lacks {', '.join(map(repr, missing))} ({why})")

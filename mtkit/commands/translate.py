"""``mtkit translate``: translate text files or stdin, one output line per input line.

Input is read as bytes and decoded per line, so every input line gives its output
line(s) whatever it holds; a line that is not UTF-8 is an error naming the input and
the line (as ``prepare`` and ``evaluate`` have it), never a silent U+FFFD. Translations go to
stdout (or, atomically, to ``--output``); warnings, the checkpoint loaded and the
progress bar go to stderr. See :mod:`mtkit.text.lines` for the output formats.

Stdin is read as it arrives: whenever it has no more input ready, the lines read
so far are translated and the output flushed, so a program that writes one line
into a pipe and waits gets its answer, while a file or a pipe that keeps up still
gives chunks of ``--buffer-size`` lines. A reader that leaves early (``| head``)
ends the command quietly.

Everything that can be checked is checked before the model loads (flags, input
files, the output path), and the rest right after (``--attention-layer``), so a
mistake never costs a translation run. Errors name the flag, not the config key.

No torch at import time: this module is loaded when the CLI starts, and the
``ctranslate2`` engine never loads torch at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import regex

from mtkit.api import ENGINES, LoadOptions, load_models
from mtkit.config import PRECISIONS, DecodeConfig, DecodeOptions
from mtkit.data.word_alignment import pharaoh
from mtkit.documents import DOCUMENT_FORMATS, EXTENSIONS, Limits, is_binary, precheck, translate_bytes
from mtkit.engines.capabilities import CAPABILITIES, either, engines_without
from mtkit.engines.constraints import constraint_source
from mtkit.engines.quality import with_quality
from mtkit.errors import Interrupted, MtkitError, counted, shown
from mtkit.export.cache import check_quantization
from mtkit.io import (
    STDIN_NAME,
    atomic_path,
    discard_stdout,
    open_binary,
    output_target,
    remove_dead_temporaries,
    sentence_progress,
    standard_input,
    standard_output,
)
from mtkit.text.lines import OUTPUT_FORMATS, clean_output, format_translation, read_ready_lines, read_text_lines
from mtkit.text.markup import MARKUPS, PROTECT_TIMEOUT, MarkupError, split_markup, split_protected, translate_split
from mtkit.text.phrases import check_line_counts, read_constraint_options
from mtkit.text.pipeline import GuardCounts, sentence_reports, translate_lines

DOCUMENT_ONLY = tuple(f for f in DOCUMENT_FORMATS if f not in MARKUPS)  # --format docx ... (html, xml: a line each)
DOCUMENT_LIMITS = Limits()

DEFAULT_BUFFER_SIZE = 1000

def _count_lines(names: list[str]) -> int | None:
    """The lines of the input files as :func:`mtkit.text.lines.read_text_lines` counts them; None when one
    is stdin or not a regular file (a pipe can be read only once)."""
    if any(name == "-" or not Path(name).is_file() for name in names):
        return None
    total = 0
    for name in names:
        with open_binary(name) as f:
            last = b"\n"
            for block in iter(lambda: f.read(1 << 20), b""):
                total += block.count(b"\n")
                last = block[-1:]
            total += last != b"\n"
    return total


def _check_writable(path: Path | None, flag: str) -> None:
    """Refuse, before the model loads, an output that is a directory, a block device or a socket."""
    if path is not None and path.is_dir():
        raise MtkitError(f"{flag} {path}: is a directory; give a file path")
    if path is not None:
        try:
            output_target(path)
        except MtkitError as e:
            raise MtkitError(f"{flag} {e}") from None


def _stdin_lines(before_wait: Callable[[], None]) -> Iterator[str | None]:
    stream = standard_input()
    try:
        fd = sys.stdin.fileno()
        select.select([fd], [], [], 0)
    except (AttributeError, OSError, ValueError):  # no real descriptor (embedded, tests), or no select on it
        yield from read_text_lines(stream)
        return
    yield from read_ready_lines(fd, before_wait)


def _input_lines(inputs: list[str], before_wait: Callable[[], None]) -> Iterator[str | None]:
    for name in inputs:
        if name == "-":
            yield from _stdin_lines(before_wait)
        else:
            with open_binary(name, stream=True) as f:
                yield from read_text_lines(f, name)


@contextlib.contextmanager
def _sigterm_raises(message: str) -> Iterator[None]:
    """SIGTERM (``timeout``, ``kill``, a scheduler) as :class:`Interrupted` (exit 143) instead of an
    instant death, so that what the command is writing is cleaned up (``--output``'s temporary)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Interrupted(message, signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _output_stream(output: Path | None) -> Iterator[IO[bytes]]:
    if output is None:
        out = standard_output()
        yield out
        out.flush()
        return
    # owned: a SIGKILLed run's temporary carries its PID, so that the next run removes it
    with _sigterm_raises(f"interrupted (SIGTERM); {output} is left as it was"), \
            atomic_path(output, owned=True) as tmp, open(tmp, "wb") as f:
        yield f


def _input_name(inputs: list[str]) -> str:
    """How an error names the input: the file, stdin's name, or ``input`` for several."""
    return STDIN_NAME if inputs == ["-"] else inputs[0] if len(inputs) == 1 else "input"


def _say_guard(decode: DecodeConfig, counts: GuardCounts, interactive: bool) -> None:
    """The integrity guard's counts on stderr, once the input is done (not in an interactive session)."""
    if decode.guard and not interactive and counts.sentences:
        print(counts.summary(), file=sys.stderr, flush=True)


def _translate_markup(translator, lines: Iterator[str | None], name: str, out: IO[bytes], buffer_size: int,
                      progress, o: TranslateOptions, counts: GuardCounts) -> int:
    """``--format html|xml``: each line a fragment, translated with its markup carried by the alignments
    (:mod:`mtkit.text.markup`), ``buffer_size`` lines at a time; ``--protect`` (with ``markup`` text): each
    line's placeholders carried the same way. An engine without alignments (ONNX): every tag cuts sentences, the
    text between them is translated. ``name``: the input, as errors name it. Returns the lines done."""
    markup, protect, aligning = o.markup, o.protect_pattern(), o.aligns

    def translate(sentences: list[str]) -> list[tuple[str, list]]:
        return [(clean_output(t.best.text), t.best.alignment or []) for t in translate_lines(translator, sentences,
                                                                                              counts=counts)]

    def split(line: str, number: int):
        if protect is not None:
            try:
                return split_protected(line, protect, PROTECT_TIMEOUT)
            except TimeoutError:
                raise MtkitError(f"{name}: line {number}: --protect {shown(protect.pattern)} took more than "
                                 f"{PROTECT_TIMEOUT:g} s on this line (a pattern that backtracks without end, "
                                 "such as '(a|aa)+$'): write it without nested repetition") from None
        try:
            return split_markup(line, markup, inline=aligning)
        except MarkupError as e:
            raise MtkitError(f"{name}: line {number}: {e} (--format {markup})") from None

    done = 0
    chunk: list[str] = []

    def flush() -> None:
        nonlocal done
        parsed = translate_split([split(line, done + k + 1) for k, line in enumerate(chunk)], translate)
        out.write("".join(line + "\n" for line in parsed).encode("utf-8"))
        out.flush()
        done += len(chunk)
        if progress is not None:
            progress.update(len(chunk))
        chunk.clear()

    for line in lines:
        if line is not None:
            chunk.append(line)
        if chunk and (line is None or len(chunk) >= buffer_size):
            flush()
    if chunk:
        flush()
    return done


@contextlib.contextmanager
def _alignments_stream(path: Path | None) -> Iterator[IO[bytes] | None]:
    """``--alignments-out``, written atomically (None: not asked)."""
    if path is None:
        yield None
        return
    remove_dead_temporaries(path)
    with atomic_path(path, owned=True) as tmp, open(tmp, "wb") as f:
        yield f


@dataclass(frozen=True)
class TranslateOptions:
    """Everything ``mtkit translate`` takes besides its models and inputs (the CLI's flags, one field
    each; see :func:`translate`), checked once (:meth:`check`) before anything loads."""

    output: Path | None = None
    decode: DecodeOptions = field(default_factory=DecodeOptions)  # the decoding flags (--beam, --nbest ...)
    decode_settings: DecodeConfig | None = None  # what they are set on; None: the (first) model's own
    output_format: str | None = None
    device: str = "cpu"
    precision: str = "fp32"
    engine: str = "torch"
    buffer_size: int | None = None
    attention_png: Path | None = None
    attention_layer: int | None = None
    threads: int = 0
    constraints: Path | None = None
    glossary: Path | None = None
    tgt_lang: str | None = None
    quantization: str | None = None
    qe: bool = False  # each translation's quality estimate (mtkit.engines.quality): a column, or a json key
    qe_model: str | None = None  # a reference-free COMET model for it (implies qe); None: the model's confidence
    alignments_out: Path | None = None  # the best translations' word alignments go here, a line per input line
    protect: str | None = None  # a regular expression: its matches (placeholders) carried through by the alignment
    document: str | None = None  # the input is one document of this format (mtkit.documents): set by translate()

    @property
    def markup(self) -> str | None:
        """The markup each line is (``html``, ``xml``; ``text`` with ``--protect``), or None: plain lines."""
        if self.protect is not None:
            return "text"
        return self.output_format if self.output_format in MARKUPS else None

    @property
    def wants_qe(self) -> bool:
        """Whether each translation's quality estimate is asked for (``--qe``, or ``--qe-model``)."""
        return self.qe or self.qe_model is not None

    @property
    def aligns(self) -> bool:
        """Whether the engine gives word alignments (:mod:`mtkit.engines.capabilities`; an unknown engine: True,
        and refused by :meth:`check`)."""
        return self.engine not in CAPABILITIES or CAPABILITIES[self.engine].alignments

    @property
    def buffer_lines(self) -> int:
        """``--buffer-size``, or its default."""
        return DEFAULT_BUFFER_SIZE if self.buffer_size is None else self.buffer_size

    def protect_pattern(self):
        """``--protect`` compiled (``regex``: its time limit bounds a pattern that backtracks without end; ``re``
        has none), or None."""
        if self.protect is None:
            return None
        try:
            return regex.compile(self.protect)
        except regex.error as e:
            raise MtkitError(f"--protect {shown(self.protect)}: not a regular expression ({e})") from None

    def decoding(self) -> DecodeOptions:
        """The decoding options with what the output implies: hard word alignments where markup or placeholders
        are put back by them (the ONNX engine gives none: it translates between tags only) and for
        ``--alignments-out``."""
        placed = self.markup is not None or self.document is not None  # tags, placeholders or a document's runs
        implied = (placed and self.aligns) or self.alignments_out is not None
        if implied and self.decode.alignments in (None, "off"):
            return self.decode.replace(alignments="hard")
        return self.decode

    def check(self) -> None:
        """One error line, naming the flag, for the first setting out of its range or combination that cannot be
        (the decoding options through :meth:`DecodeOptions.check`), in a fixed order: the format, the markup, the
        engine and its settings, then the decoding options and what they go with."""
        output_format, markup = self.output_format, self.markup
        if output_format is not None and output_format not in OUTPUT_FORMATS + MARKUPS + DOCUMENT_ONLY:
            raise MtkitError(f"--format {output_format}: expected one of "
                             f"{', '.join(OUTPUT_FORMATS + MARKUPS + DOCUMENT_ONLY)}")
        if self.document is not None:
            self._check_document()
        if self.protect is not None:
            if output_format not in (None, "text"):
                raise MtkitError(f"--protect takes placeholders out of plain text (--format text), not --format "
                                 f"{output_format}")
            self.protect_pattern()
        if markup is not None:
            # The alignment places the tags or placeholders; the output has no room for it (--alignments-out neither).
            for flag, given in (("--alignments", self.decode.alignments == "hard"),
                                ("--alignment-threshold", self.decode.alignments == "soft"),
                                ("--alignments-out", self.alignments_out is not None), ("--qe", self.wants_qe),
                                ("--attention-png", self.attention_png is not None),
                                ("--nbest", (self.decode.nbest or 1) > 1)):
                if given:
                    what = ("--protect carries placeholders" if self.protect is not None
                            else f"--format {markup} translates markup")
                    raise MtkitError(f"{what}, a line of it per input line: drop {flag}")
            if self.protect is not None and not self.aligns:
                raise MtkitError(f"--protect needs word alignments: --engine {either('alignments')} "
                                 f"({'; '.join(f'{c.title} gives none' for c in engines_without('alignments'))})")
        if self.engine not in ENGINES:
            raise MtkitError(f"--engine {self.engine}: expected one of {', '.join(ENGINES)}")
        if self.precision not in PRECISIONS:
            raise MtkitError(f"--precision {self.precision}: expected one of {', '.join(PRECISIONS)}")
        if self.quantization is not None:
            check_quantization(self.engine, self.quantization)
        if self.buffer_lines < 1:
            raise MtkitError(f"--buffer-size: must be >= 1, got {self.buffer_lines}")
        if self.threads < 0:
            raise MtkitError(f"--threads: must be >= 0 (0: one per CPU other work leaves free), got {self.threads}")
        if self.attention_layer is not None and self.attention_png is None:
            raise MtkitError("--attention-layer needs --attention-png")
        decode = self.decoding()
        decode.check()
        aligning = decode.alignments not in (None, "off")
        if decode.alignment_layer is not None and not aligning:
            raise MtkitError("--alignment-layer needs --alignments (or --alignment-threshold, --alignments-out)")
        if aligning and output_format in ("tokens", "scores") and markup is None:
            raise MtkitError(f"--alignments: word alignments go with --format text, nbest or json (or to "
                             f"--alignments-out), not with --format {output_format}")
        if aligning and not self.aligns:
            raise MtkitError(f"--alignments needs --engine {either('alignments')} "
                             f"({'; '.join(c.no_alignments_why for c in engines_without('alignments'))})")
        if self.wants_qe and output_format not in (None, "text", "json"):
            raise MtkitError(f"--qe adds a column to --format text or a key to json, not to --format {output_format}")
        if (decode.nbest or 1) > 1 and output_format not in (None, "nbest", "json"):
            raise MtkitError(f"--nbest {decode.nbest} lists hypotheses with --format nbest or json; "
                             f"--format {output_format} prints the best one only")
        if not CAPABILITIES[self.engine].attention_maps and self.attention_png is not None:
            raise MtkitError(f"--attention-png needs --engine {either('attention_maps')}")


    def _check_document(self) -> None:
        """A document comes back whole, in its own format: nothing that adds to the output or asks per line."""
        for flag, given in (("--nbest", (self.decode.nbest or 1) > 1),
                            ("--alignments", self.decode.alignments not in (None, "off")),
                            ("--alignments-out", self.alignments_out is not None), ("--qe", self.wants_qe),
                            ("--attention-png", self.attention_png is not None),
                            ("--protect", self.protect is not None), ("--constraints", self.constraints is not None)):
            if given:
                raise MtkitError(f"a {self.document} document is translated whole into its own format: drop {flag} "
                                 "(--glossary applies to documents)")


def document_format(inputs: list[str], given: str | None) -> str | None:
    """The document format the inputs are translated as (:mod:`mtkit.documents`), or None (lines): ``--format``
    one of the document formats, or one named file whose extension is a document's (.txt and ``--format
    html|xml`` stay lines: a fragment a line)."""
    if given in DOCUMENT_ONLY:
        return given
    if given is not None:
        return None
    named = [name for name in inputs if name != "-" and Path(name).suffix.lower() in EXTENSIONS
             and EXTENSIONS[Path(name).suffix.lower()] != "txt"]
    if not named:
        return None
    if len(inputs) > 1:
        raise MtkitError(f"{named[0]}: a document is translated on its own: give one input with -o OUT")
    return EXTENSIONS[Path(named[0]).suffix.lower()]


def _read_document(name: str, o: TranslateOptions) -> bytes:
    """The document's bytes (a file, or stdin), refused past :data:`DOCUMENT_LIMITS` before more is read and
    checked (:func:`mtkit.documents.precheck`) before the model loads."""
    if o.output is None and is_binary(o.document) and sys.stdout.isatty():
        raise MtkitError(f"{name}: a {o.document} document is binary: write it to a file with -o OUT (or a pipe)")
    limit = DOCUMENT_LIMITS.max_bytes
    shown_name = STDIN_NAME if name == "-" else name
    try:
        if name == "-":
            data = _read_bounded(standard_input(), limit)
        else:
            size = os.stat(name).st_size
            if size > limit:
                raise MtkitError(f"{name}: {size:,} bytes, more than the {limit:,} a document may have")
            with open(name, "rb") as f:
                data = _read_bounded(f, limit)
    except OSError as e:
        raise MtkitError(f"{shown_name}: {e.strerror or e}") from None
    if data is None:
        raise MtkitError(f"{shown_name}: more than the {limit:,} bytes a document may have")
    precheck(data, o.document, shown_name, DOCUMENT_LIMITS)
    return data


def _read_bounded(f: IO[bytes], limit: int) -> bytes | None:
    """All of ``f`` in chunks (``read(limit)`` would allocate ``limit`` bytes at once), or None past ``limit``."""
    chunks, total = [], 0
    while chunk := f.read(1 << 20):
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            return None
    return b"".join(chunks)


def _translate_document(model, name: str, data: bytes, o: TranslateOptions) -> None:
    """One document in, the same document out (:mod:`mtkit.documents`): to ``--output`` (a temporary file, renamed)
    or stdout; the integrity guard's counts on stderr."""
    counts = GuardCounts()
    progress = sentence_progress()
    if progress is not None:
        progress.unit = "par"
    try:
        texts = model.document_texts(target=o.tgt_lang, glossary=o.glossary, counts=counts,
                                     progress=None if progress is None else progress.update)
        result = translate_bytes(data, o.document, texts, STDIN_NAME if name == "-" else name, DOCUMENT_LIMITS)
    finally:
        if progress is not None:
            progress.close()
    with _output_stream(o.output) as out:
        out.write(result)
    _say_guard(model.engine.decode, counts, False)


def _check_files(inputs: list[str], o: TranslateOptions):
    """The inputs, the constraint files and the outputs, checked before the model loads: the constraints read
    (:func:`mtkit.text.phrases.read_constraint_options`), and closed standard streams refused."""
    for name in inputs:  # a named pipe (`<(...)`) is fine: only missing paths and directories are not
        if name != "-" and (not Path(name).exists() or Path(name).is_dir()):
            raise MtkitError(f"{name}: {'is a directory, expected a file' if Path(name).is_dir() else 'no such file'}")
    per_line, terms = read_constraint_options(o.constraints, o.glossary, o.engine, bool(o.decode.sampling))
    if per_line is not None:
        check_line_counts(per_line, "--constraints", o.constraints, _count_lines(inputs))
    _check_writable(o.output, "--output")
    _check_writable(o.attention_png, "--attention-png")
    _check_writable(o.alignments_out, "--alignments-out")
    if o.alignments_out is not None and o.output is not None and o.alignments_out.resolve() == o.output.resolve():
        raise MtkitError(f"--alignments-out {o.alignments_out}: the same file as --output")
    if o.output is not None:
        remove_dead_temporaries(o.output)  # of an earlier run killed with SIGKILL
    if "-" in inputs:
        standard_input()  # closed: one line now, before the model loads
    if o.output is None:
        standard_output()
    return per_line, terms


def translate(model_path: Path | list[Path], inputs: list[str] | None = None,
              options: TranslateOptions | None = None) -> None:
    """Translate ``inputs`` (files, ``-`` for stdin; default stdin) with one checkpoint, an
    ensemble of checkpoints, or (``engine='ctranslate2'``) an exported CTranslate2 directory.

    ``constraints`` (JSON lines, one object per input line) and ``glossary`` (TSV) give phrases a
    translation must (``include``, glossary terms) or must not (``exclude``) contain
    (:mod:`mtkit.engines.constraints`); CTranslate2 takes only ``exclude``.

    Args:
        model_path: a checkpoint or run directory, a list of them (an ensemble), or the
            directory written by ``mtkit export ctranslate2``.
        inputs: files, ``-`` for stdin (default).
        options: the rest (:class:`TranslateOptions`), one field each:
        output: the file to write (temporary + rename); None: stdout.
        decode: the decoding options (:class:`mtkit.config.DecodeOptions`: the flags), set on
            ``decode_settings``; errors name the flags.
        decode_settings: the decoding settings; None takes the (first) checkpoint's ``decode`` section
            (for CTranslate2: the one exported with the model).
        output_format: ``text`` | ``tokens`` | ``scores`` | ``nbest``; None: ``nbest`` when
            ``decode.nbest`` > 1, else ``text``.
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.
        precision: ``fp32`` | ``bf16`` | ``fp16`` (autocast for torch; the compute type for
            CTranslate2, where ``fp32`` means the type the model was exported with).
        buffer_size: lines read, sorted and batched together (default 1000; fewer when stdin
            has no more ready); 1 writes each translation as soon as it is ready.
        attention_png: write the cross-attention heatmap of the first non-empty input line there
            (torch engine; the first model of an ensemble); ``attention_layer`` picks one layer.
        threads: CPU threads for the engine (0: one per CPU other work leaves free, :mod:`mtkit.engines.threads`).
        tgt_lang: the target language of a multilingual model (required when it has several).
    """
    o = options or TranslateOptions()
    inputs = list(inputs) if inputs else ["-"]
    document = document_format(inputs, o.output_format)
    if document is not None:
        o = dataclasses.replace(o, document=document, output_format=None)
    o.check()
    output_format, markup, qe = o.output_format, o.markup, o.wants_qe
    paths = list(model_path) if isinstance(model_path, (list, tuple)) else [model_path]
    per_line, terms = _check_files(inputs, o)
    document_data = _read_document(inputs[0], o) if o.document is not None else b""
    interactive = "-" in inputs and sys.stdin.isatty()
    buffer_size = 1 if interactive else o.buffer_lines

    def check_attention_layer(loaded: list) -> None:
        layers = loaded[0].model.cfg.decoder_layers
        if o.attention_layer is not None and not -layers <= o.attention_layer < layers:
            raise MtkitError(f"--attention-layer {o.attention_layer}: the model has {layers} decoder layers "
                             f"(0 to {layers - 1}, or -{layers} to -1 from the end)")

    # The QE model first (one that cannot be had fails before any translation), then a checkpoint's kept
    # CTranslate2 export (--engine ctranslate2), then the engine; torch's threads as --threads asks.
    model = load_models(paths, LoadOptions(engine=o.engine, device=o.device, precision=o.precision,
                                           threads=o.threads, target=o.tgt_lang, any_target=False,
                                           quantization=o.quantization, decode=o.decode_settings,
                                           decode_options=o.decoding(), check=check_attention_layer,
                                           qe_model=o.qe_model))
    translator, scorer = model.engine, model.qe
    first_model = translator.models[0] if o.engine == "torch" else None

    nbest = translator.decode.nbest
    if output_format is None:
        output_format = "nbest" if nbest > 1 else "text"
    if qe and output_format == "nbest":
        raise MtkitError(f"--qe adds a column to --format text or a key to json; --nbest {nbest} lists hypotheses "
                         "with --format nbest: add --format json")
    if o.document is not None:
        _translate_document(model, inputs[0], document_data, o)
        return
    attention_done = o.attention_png is None
    progress = sentence_progress(enabled=not interactive)
    wanted = None
    if per_line is not None or terms is not None:
        wanted = constraint_source(per_line, terms, f"--constraints {o.constraints}")
    done = words = 0
    counts = GuardCounts()
    reporting = translator.decode.split == "sentences" or translator.decode.guard
    started = time.perf_counter()
    if markup is not None:
        try:
            with _output_stream(o.output) as out:
                done = _translate_markup(translator, _input_lines(inputs, out.flush), _input_name(inputs), out,
                                         buffer_size, progress, o, counts)
            _say_guard(translator.decode, counts, interactive)
        except BrokenPipeError:
            if o.output is None:
                discard_stdout()
            raise
        finally:
            if progress is not None:
                progress.close()
        return
    try:
        with _output_stream(o.output) as out, _alignments_stream(o.alignments_out) as aligned:
            translations = translate_lines(translator, _input_lines(inputs, out.flush), buffer_size=buffer_size,
                                           constraints=wanted, counts=counts)
            if qe:  # COMET-QE scores in groups, one at a time where stdin is read as it comes
                rated = with_quality(translations, scorer, group=1 if "-" in inputs or buffer_size == 1 else 16)
            else:
                rated = ((t, None) for t in translations)
            for t, quality in rated:
                done += 1
                words += len(t.best.text.split())
                reports = sentence_reports(t) if reporting else None
                lines = format_translation(t, output_format, nbest, qe, quality, alignments=aligned is None,
                                           sentences=reports)
                out.write("".join(line + "\n" for line in lines).encode("utf-8"))
                if aligned is not None:
                    aligned.write((pharaoh(t.best.alignment or []) + "\n").encode("utf-8"))
                if buffer_size == 1:
                    out.flush()
                    if aligned is not None:
                        aligned.flush()
                if progress is not None:
                    progress.update(1)
                if not attention_done and t.src_ids:
                    from mtkit.visualize import attention_png as draw

                    first = t.parts[0] if t.parts else t  # a line of several sentences: its first one's
                    draw(first_model, translator.vocab, first.src_ids, first.best.ids, o.attention_png,
                         o.attention_layer)
                    attention_done = True
            check_line_counts(per_line, "--constraints", o.constraints, done)  # stdin: known only now
        if not interactive and done:  # as fairseq-generate ends: what was translated, how fast (loading apart)
            seconds = max(time.perf_counter() - started, 1e-9)
            print(f"translated {counted(done, 'line')} in {seconds:.3f} s: {done / seconds:.1f} lines/s, "
                  f"{words / seconds:.0f} target words/s", file=sys.stderr, flush=True)
        _say_guard(translator.decode, counts, interactive)
    except BrokenPipeError:
        if o.output is None:
            discard_stdout()  # the CLI then exits 0
        raise
    finally:
        if progress is not None:
            progress.close()

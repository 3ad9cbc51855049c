"""``mtkit translate``: translate text files or stdin, one output line per input line.

Input is read as bytes and decoded per line (invalid UTF-8 becomes U+FFFD), so
every input line gives its output line(s) whatever it holds. Translations go to
stdout (or, atomically, to ``--output``); warnings, the checkpoint loaded and the
progress bar go to stderr. See :mod:`mtkit.translate` for the output formats.

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
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from mtkit.config import MAX_ALPHA, MAX_LEN_A, PRECISIONS, TEMPERATURE_RANGE, DecodeConfig, check_finite
from mtkit.errors import MtkitError
from mtkit.io import discard_stdout, sentence_progress

ENGINES = ("torch", "ctranslate2")
DEFAULT_BUFFER_SIZE = 1000

# The config's ranges of the decoding flags (mtkit.config), checked here too so that a
# mistyped flag fails before any model loads; each key's rules in order, the first broken one named.
_LOW, _HIGH = TEMPERATURE_RANGE
_FLAG_RANGES: dict[str, list[tuple[Callable[[float], bool], str]]] = {
    "beam": [(lambda v: v >= 1, ">= 1")],
    "nbest": [(lambda v: v >= 1, ">= 1")],
    "alpha": [(lambda v: v >= 0, ">= 0"), (lambda v: v <= MAX_ALPHA, f"in [0, {MAX_ALPHA:g}]")],
    "temperature": [(lambda v: v > 0, "> 0"), (lambda v: _LOW <= v <= _HIGH, f"in [{_LOW:g}, {_HIGH:g}]")],
    "top_k": [(lambda v: v >= 0, ">= 0 (0: off)")],
    "top_p": [(lambda v: 0 < v <= 1, "in (0, 1]")],
    "max_len_a": [(lambda v: v >= 0, ">= 0"), (lambda v: v <= MAX_LEN_A, f"in [0, {MAX_LEN_A:g}]")],
    "batch_tokens": [(lambda v: v >= 1, ">= 1")],
    "no_repeat_ngram_size": [(lambda v: v >= 0, ">= 0 (0: off)")],
}
_SAMPLING_ONLY = ("temperature", "top_k", "top_p")


def flag_name(key: str) -> str:
    """The command-line flag of a decode key: ``top_p`` -> ``--top-p``."""
    return "--" + key.replace("_", "-")


def check_decode_flags(overrides: dict) -> None:
    """Raise :class:`MtkitError`, naming the flag, for a decoding flag out of its range."""
    for key, value in overrides.items():
        if isinstance(value, float):
            check_finite(flag_name(key), value)
        for ok, rule in _FLAG_RANGES.get(key, []):
            if not ok(value):
                raise MtkitError(f"{flag_name(key)}: must be {rule}, got {value!r}")
    nbest, beam = overrides.get("nbest", 1), overrides.get("beam")
    if beam is not None and nbest > beam and not overrides.get("sampling"):  # as the config says it
        raise MtkitError(f"--nbest: must be between 1 and --beam ({beam}), got {nbest}")


def apply_decode_flags(decode: DecodeConfig, overrides: dict) -> DecodeConfig:
    """``decode`` with the decoding flags set, through the config's own checks.

    An error about a key that came from a flag names the flag (``--nbest: must be between 1
    and --beam (4), got 5``), not the config key (``decode.nbest``); options that only shape
    sampling need sampling on.
    """
    from mtkit.config import override_section

    try:
        decode = override_section(decode, "decode", overrides)
    except MtkitError as e:
        message = re.sub(r"\bdecode\.(\w+)",
                         lambda m: flag_name(m.group(1)) if m.group(1) in overrides else m.group(0), str(e))
        raise MtkitError(message) from None
    sampling_only = [key for key in _SAMPLING_ONLY if key in overrides]
    if sampling_only and not decode.sampling:
        raise MtkitError(f"{flag_name(sampling_only[0])} needs --sampling (it shapes sampling; search ignores it)")
    return decode


def say_loaded(loaded: list) -> None:
    """Say on stderr which checkpoints a command runs: ``loaded PATH (step N)``; once their settings
    have passed the checks, so that an error stays the only line."""
    from mtkit.runtime.checkpoint import describe

    for model in loaded:
        print(f"loaded {describe(model)}", file=sys.stderr, flush=True)


def read_constraint_options(constraints: Path | None, glossary: Path | None, engine: str = "torch",
                            sampling: bool = False):
    """The ``--constraints`` file (a checked list of :class:`Constraints`, one per input line) and the
    ``--glossary`` (a :class:`Glossary`), None for those not given; an error, before any model loads,
    for what the engine or the decoding cannot do (include phrases on CTranslate2, sampling)."""
    if constraints is None and glossary is None:
        return None, None
    from mtkit.runtime.constraints import read_constraints
    from mtkit.runtime.glossary import Glossary

    per_line = read_constraints(constraints) if constraints is not None else None
    terms = Glossary.read(glossary) if glossary is not None else None
    if sampling:
        raise MtkitError(f"{'--constraints' if constraints is not None else '--glossary'} needs beam search: "
                         "drop --sampling")
    if engine == "ctranslate2":
        from mtkit.runtime.ctranslate2_engine import INCLUDE_UNSUPPORTED

        include = next((n for n, c in enumerate(per_line or [], 1) if c.include), None)
        if terms is not None or include is not None:
            where = "--glossary" if terms is not None else f"--constraints {constraints}: line {include}"
            raise MtkitError(f"{where}: {INCLUDE_UNSUPPORTED}")
    return per_line, terms


def _count_lines(names: list[str]) -> int | None:
    """The lines of the input files as :func:`mtkit.translate.read_text_lines` counts them; None when one
    is stdin or not a regular file (a pipe can be read only once)."""
    from mtkit.io import open_binary

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


def check_line_counts(per_line: list | None, flag: str, path: Path | None, lines: int | None) -> None:
    """A constraints file must have one line per input line (``lines``; None: not known yet)."""
    if per_line is not None and lines is not None and len(per_line) != lines:
        raise MtkitError(f"{flag} {path}: has {len(per_line)} lines, the input {lines}; "
                         "give one JSON object per input line ({} for none)")


def _check_writable(path: Path | None, flag: str) -> None:
    if path is not None and path.is_dir():
        raise MtkitError(f"{flag} {path}: is a directory; give a file path")


def _stdin_lines(before_wait: Callable[[], None]) -> Iterator[str | None]:
    from mtkit.translate import read_ready_lines, read_text_lines

    try:
        fd = sys.stdin.fileno()
        import select

        select.select([fd], [], [], 0)
    except (AttributeError, OSError, ValueError):  # no real descriptor (embedded, tests), or no select on it
        yield from read_text_lines(sys.stdin.buffer)
        return
    yield from read_ready_lines(fd, before_wait)


def _input_lines(inputs: list[str], before_wait: Callable[[], None]) -> Iterator[str | None]:
    from mtkit.io import open_binary
    from mtkit.translate import read_text_lines

    for name in inputs:
        if name == "-":
            yield from _stdin_lines(before_wait)
        else:
            with open_binary(name) as f:
                yield from read_text_lines(f)


@contextlib.contextmanager
def _sigterm_raises(message: str) -> Iterator[None]:
    """SIGTERM (``timeout``, ``kill``, a scheduler) as :class:`Interrupted` (exit 143) instead of an
    instant death, so that what the command is writing is cleaned up (``--output``'s temporary)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        from mtkit.errors import Interrupted

        raise Interrupted(message, signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _output_stream(output: Path | None) -> Iterator[IO[bytes]]:
    if output is None:
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    from mtkit.io import atomic_path

    # owned: a SIGKILLed run's temporary carries its PID, so that the next run removes it
    with _sigterm_raises(f"interrupted (SIGTERM); {output} is left as it was"), \
            atomic_path(output, owned=True) as tmp, open(tmp, "wb") as f:
        yield f


def build_translator(paths: list[Path], engine: str = "torch", device: str = "auto", precision: str = "fp32",
                     threads: int = 0, overrides: dict | None = None, decode: DecodeConfig | None = None,
                     inspect: Callable[[list], None] | None = None, tgt_lang: str | None = None,
                     any_target: bool = False, parallel: int = 1):
    """The engine that ``translate`` (and ``serve``) runs: a torch :class:`Translator` on checkpoints (an
    ensemble for several), or a CTranslate2 one on an exported directory; says on stderr what it loaded.

    Args:
        decode: the decoding settings; None takes the (first) checkpoint's (or the exported ones).
        overrides: decode keys from command-line flags, set on top of ``decode``; errors name the flags.
        inspect: called with the loaded checkpoints (LoadedModels) before anything is said: a caller's own
            checks, or what it reads of them (their configs).
        tgt_lang: the target language of a multilingual model (``--tgt-lang``): the engine's default target,
            whose tag then leads each source (or the decoder).
        any_target: leave the target open (``serve``, which gives it per call).
        parallel: batches translated at the same time from several threads (CTranslate2's ``inter_threads``;
            the torch engine needs nothing for it).
    """
    overrides = dict(overrides or {})
    if engine == "ctranslate2":
        if len(paths) != 1:
            raise MtkitError("--engine ctranslate2 takes one exported model directory, not an ensemble")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
            raise MtkitError(f"--device {device}: expected auto, cpu, cuda or cuda:N")
        from mtkit.runtime.ctranslate2_engine import Ctranslate2Translator, exported_decode

        decode = apply_decode_flags(decode or exported_decode(paths[0]), overrides)
        translator = Ctranslate2Translator(paths[0], decode, device=device, precision=precision,
                                           intra_threads=threads, inter_threads=parallel, target=tgt_lang)
        if not any_target:
            translator.vocab_for(tgt_lang)  # a target the model lacks is an error now, not at the first line
        print(f"loaded {translator.description}", file=sys.stderr, flush=True)
        return translator
    from mtkit.runtime.device import resolve_device

    device = resolve_device(device)
    if precision == "fp16" and not device.startswith("cuda"):
        raise MtkitError("--precision fp16 needs a CUDA device; use bf16 on CPU")
    if threads > 0:
        import torch

        torch.set_num_threads(threads)
    from mtkit.runtime.checkpoint import load_model

    loaded = [load_model(p, device) for p in paths]
    if inspect is not None:
        inspect(loaded)
    from mtkit.data.languages import same_pairs, single_pair
    from mtkit.runtime.torch_engine import Translator

    decode = apply_decode_flags(decode or loaded[0].config.decode, overrides)
    translator = Translator(loaded, decode, device=device, precision=precision,
                            languages=(same_pairs([m.config for m in loaded]), single_pair(loaded[0].config.data)),
                            tag_side=loaded[0].config.data.tag_side, target=tgt_lang)
    if not any_target:
        translator.vocab_for(tgt_lang)
    say_loaded(loaded)
    return translator


def translate(
    model_path: Path | list[Path],
    inputs: list[str] | None = None,
    output: Path | None = None,
    decode: DecodeConfig | None = None,
    output_format: str | None = None,
    device: str = "cpu",
    precision: str = "fp32",
    engine: str = "torch",
    buffer_size: int | None = None,
    attention_png: Path | None = None,
    attention_layer: int | None = None,
    threads: int = 0,
    decode_overrides: dict | None = None,
    constraints: Path | None = None,
    glossary: Path | None = None,
    tgt_lang: str | None = None,
) -> None:
    """Translate ``inputs`` (files, ``-`` for stdin; default stdin) with one checkpoint, an
    ensemble of checkpoints, or (``engine='ctranslate2'``) an exported CTranslate2 directory.

    ``constraints`` (JSON lines, one object per input line) and ``glossary`` (TSV) give phrases a
    translation must (``include``, glossary terms) or must not (``exclude``) contain
    (:mod:`mtkit.runtime.constraints`); CTranslate2 takes only ``exclude``.

    Args:
        model_path: a checkpoint or run directory, a list of them (an ensemble), or the
            directory written by ``mtkit export ctranslate2``.
        decode: the decoding settings; None takes the (first) checkpoint's ``decode`` section
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
        threads: CPU threads for the engine (0: the engine's default).
        decode_overrides: decode keys from command-line flags, set on top of ``decode``; errors
            name the flags.
        tgt_lang: the target language of a multilingual model (required when it has several).
    """
    from mtkit.translate import OUTPUT_FORMATS, format_translation

    overrides = dict(decode_overrides or {})
    if output_format is not None and output_format not in OUTPUT_FORMATS:
        raise MtkitError(f"--format {output_format}: expected one of {', '.join(OUTPUT_FORMATS)}")
    if engine not in ENGINES:
        raise MtkitError(f"--engine {engine}: expected one of {', '.join(ENGINES)}")
    if precision not in PRECISIONS:
        raise MtkitError(f"--precision {precision}: expected one of {', '.join(PRECISIONS)}")
    if buffer_size is None:
        buffer_size = DEFAULT_BUFFER_SIZE
    if buffer_size < 1:
        raise MtkitError(f"--buffer-size: must be >= 1, got {buffer_size}")
    if threads < 0:
        raise MtkitError(f"--threads: must be >= 0 (0: the engine's default), got {threads}")
    if attention_layer is not None and attention_png is None:
        raise MtkitError("--attention-layer needs --attention-png")
    check_decode_flags(overrides)
    if overrides.get("nbest", 1) > 1 and output_format not in (None, "nbest"):
        raise MtkitError(f"--nbest {overrides['nbest']} lists hypotheses with --format nbest; "
                         f"--format {output_format} prints the best one only")
    paths = list(model_path) if isinstance(model_path, (list, tuple)) else [model_path]
    inputs = list(inputs) if inputs else ["-"]
    for name in inputs:  # a named pipe (`<(...)`) is fine: only missing paths and directories are not
        if name != "-" and (not Path(name).exists() or Path(name).is_dir()):
            raise MtkitError(f"{name}: {'is a directory, expected a file' if Path(name).is_dir() else 'no such file'}")
    per_line, terms = read_constraint_options(constraints, glossary, engine, bool(overrides.get("sampling")))
    if per_line is not None:
        check_line_counts(per_line, "--constraints", constraints, _count_lines(inputs))
    _check_writable(output, "--output")
    _check_writable(attention_png, "--attention-png")
    if output is not None:
        from mtkit.io import remove_dead_temporaries

        remove_dead_temporaries(output)  # of an earlier run killed with SIGKILL
    interactive = "-" in inputs and sys.stdin.isatty()
    if interactive:
        buffer_size = 1

    if engine == "ctranslate2" and attention_png is not None:
        raise MtkitError("--attention-png needs --engine torch")

    def check_attention_layer(loaded: list) -> None:
        layers = loaded[0].model.cfg.decoder_layers
        if attention_layer is not None and not -layers <= attention_layer < layers:
            raise MtkitError(f"--attention-layer {attention_layer}: the model has {layers} decoder layers "
                             f"(0 to {layers - 1}, or -{layers} to -1 from the end)")

    translator = build_translator(paths, engine, device, precision, threads, overrides, decode, check_attention_layer,
                                  tgt_lang=tgt_lang)
    first_model = translator.models[0] if engine == "torch" else None

    nbest = translator.decode.nbest
    if output_format is None:
        output_format = "nbest" if nbest > 1 else "text"
    attention_done = attention_png is None
    progress = sentence_progress(enabled=not interactive)
    wanted = None
    if per_line is not None or terms is not None:
        from mtkit.runtime.constraints import constraint_source

        wanted = constraint_source(per_line, terms, f"--constraints {constraints}")
    done = 0
    try:
        with _output_stream(output) as out:
            for t in translator.translate(_input_lines(inputs, out.flush), buffer_size=buffer_size, constraints=wanted):
                done += 1
                out.write("".join(line + "\n" for line in format_translation(t, output_format, nbest)).encode("utf-8"))
                if buffer_size == 1:
                    out.flush()
                if progress is not None:
                    progress.update(1)
                if not attention_done and t.src_ids:
                    from mtkit.visualize import attention_png as draw

                    draw(first_model, translator.vocab, t.src_ids, t.best.ids, attention_png, attention_layer)
                    attention_done = True
            check_line_counts(per_line, "--constraints", constraints, done)  # stdin: known only now
    except BrokenPipeError:
        if output is None:
            discard_stdout()  # the CLI then exits 0
        raise
    finally:
        if progress is not None:
            progress.close()

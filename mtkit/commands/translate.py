"""``mtkit translate``: translate text files or stdin, one output line per input line.

Input is read as bytes and decoded per line (invalid UTF-8 becomes U+FFFD), so
every input line gives its output line(s) whatever it holds. Translations go to
stdout (or, atomically, to ``--output``); warnings and the progress bar go to
stderr. See :mod:`mtkit.translate` for the output formats.

No torch at import time: this module is loaded when the CLI starts, and the
``ctranslate2`` engine never loads torch at all.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import IO, Iterator

from mtkit.config import DecodeConfig
from mtkit.errors import MtkitError

ENGINES = ("torch", "ctranslate2")


def _input_lines(inputs: list[str]) -> Iterator[str]:
    from mtkit.io import open_binary
    from mtkit.translate import read_text_lines

    for name in inputs:
        if name == "-":
            yield from read_text_lines(sys.stdin.buffer)
        else:
            with open_binary(name) as f:
                yield from read_text_lines(f)


@contextlib.contextmanager
def _output_stream(output: Path | None) -> Iterator[IO[bytes]]:
    if output is None:
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    from mtkit.io import atomic_path

    with atomic_path(output) as tmp, open(tmp, "wb") as f:
        yield f


def _resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def translate(
    model_path: Path | list[Path],
    inputs: list[str] | None = None,
    output: Path | None = None,
    decode: DecodeConfig | None = None,
    output_format: str = "text",
    device: str = "cpu",
    precision: str = "fp32",
    engine: str = "torch",
    buffer_size: int = 1000,
    attention_png: Path | None = None,
    attention_layer: int | None = None,
    threads: int = 0,
    decode_overrides: dict | None = None,
) -> None:
    """Translate ``inputs`` (files, ``-`` for stdin; default stdin) with one checkpoint, an
    ensemble of checkpoints, or (``engine='ctranslate2'``) an exported CTranslate2 directory.

    Args:
        model_path: a checkpoint or run directory, a list of them (an ensemble), or the
            directory written by ``mtkit export ctranslate2``.
        decode: the decoding settings; None takes the (first) checkpoint's ``decode`` section
            (for CTranslate2: the defaults).
        output_format: ``text`` | ``tokens`` | ``scores`` | ``nbest``.
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.
        precision: ``fp32`` | ``bf16`` | ``fp16`` (autocast for torch; the compute type for
            CTranslate2, where ``fp32`` means the type the model was exported with).
        buffer_size: lines read, sorted and batched together; 1 (also the default when stdin
            is a terminal) writes each translation as soon as it is ready.
        attention_png: write the cross-attention heatmap of the first non-empty input line there
            (torch engine; the first model of an ensemble); ``attention_layer`` picks one layer.
        threads: CPU threads for the engine (0: the engine's default).
        decode_overrides: single decode keys (from the command line) set on top of ``decode``.
    """
    from mtkit.config import override_section

    from mtkit.translate import OUTPUT_FORMATS, format_translation

    if output_format not in OUTPUT_FORMATS:
        raise MtkitError(f"unknown output format {output_format!r}; expected one of {', '.join(OUTPUT_FORMATS)}")
    if engine not in ENGINES:
        raise MtkitError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    paths = list(model_path) if isinstance(model_path, (list, tuple)) else [model_path]
    inputs = list(inputs) if inputs else ["-"]
    interactive = "-" in inputs and sys.stdin.isatty()
    if interactive:
        buffer_size = 1

    if engine == "ctranslate2":
        if len(paths) != 1:
            raise MtkitError("--engine ctranslate2 takes one exported model directory, not an ensemble")
        if attention_png is not None:
            raise MtkitError("--attention-png needs --engine torch")
        from mtkit.export.ctranslate2 import Ctranslate2Translator

        decode = override_section(decode or DecodeConfig(), "decode", decode_overrides or {})
        translator = Ctranslate2Translator(paths[0], decode, device=device, precision=precision,
                                           intra_threads=threads)
        first_model = None
    else:
        from mtkit.training.checkpoint import load_model

        if threads > 0:
            import torch

            torch.set_num_threads(threads)
        device = _resolve_device(device)
        loaded = [load_model(p, device) for p in paths]
        from mtkit.translate import Translator

        decode = override_section(decode or loaded[0].config.decode, "decode", decode_overrides or {})
        translator = Translator(loaded, decode, device=device, precision=precision)
        first_model = loaded[0].model

    nbest = translator.decode.nbest
    attention_done = attention_png is None
    progress = None
    if sys.stderr.isatty() and not interactive:
        from tqdm import tqdm

        progress = tqdm(unit="sent", file=sys.stderr, dynamic_ncols=True, smoothing=0.1)
    try:
        with _output_stream(output) as out:
            for t in translator.translate(_input_lines(inputs), buffer_size=buffer_size):
                out.write("".join(line + "\n" for line in format_translation(t, output_format, nbest)).encode("utf-8"))
                if interactive or buffer_size == 1:
                    out.flush()
                if progress is not None:
                    progress.update(1)
                if not attention_done and t.src_ids:
                    from mtkit.visualize import attention_png as draw

                    draw(first_model, translator.vocab, t.src_ids, t.best.ids, attention_png, attention_layer)
                    attention_done = True
    finally:
        if progress is not None:
            progress.close()

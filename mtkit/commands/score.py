"""``mtkit score``: the log-probability of given translations under a model (forced decoding).

Reads line-aligned ``--src`` and ``--tgt`` files (one of them may be ``-``, stdin; ``.gz``
is read transparently) in lockstep, ``CHUNK_LINES`` pairs at a time, and writes one line per
pair to stdout, in input order, always (see :mod:`mtkit.engines.pair_scoring` for what is scored):

    text  ``LOGPROB<TAB>MEAN<TAB>TOKENS``: the sum of the natural-log probabilities of the
          target's pieces and EOS, their mean, and their number, both floats with 4 decimals
          (``nan`` for a pair longer than the model's position table)
    json  ``{"line": N, "logprob": float, "mean": float, "tokens": int}``, N the 1-based line
          number, the floats at full precision (null for such a pair)

Everything that can be checked is checked before the model loads: the flags, that the files
exist, and, when both are regular files, that they have as many lines (a first pass that
counts them). Through stdin or a pipe, a difference in line counts is found when the shorter
input ends: the pairs before it have been scored and printed, then the error.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mtkit.api import LoadOptions, load_models
from mtkit.config import PRECISIONS, DecodeOptions
from mtkit.errors import MtkitError, counted
from mtkit.io import count_lines, discard_stdout, open_binary, sentence_progress, standard_input, standard_output
from mtkit.text.lines import read_text_lines

FORMATS = ("text", "json")
CHUNK_LINES = 1000
STDIN = "<stdin>"


def _label(name: str) -> str:
    return STDIN if name == "-" else name


def _lines(name: str) -> Iterator[str]:
    if name == "-":
        yield from read_text_lines(standard_input(), STDIN)
        return
    with open_binary(name, stream=True) as f:
        yield from read_text_lines(f, name)


def _mismatch(src: str, n_src: int, tgt: str, n_tgt: int) -> MtkitError:
    return MtkitError(f"line counts differ: --src {_label(src)} has {counted(n_src, 'line')}, "
                      f"--tgt {_label(tgt)} has {n_tgt}")


def paired_lines(src: str, tgt: str) -> Iterator[tuple[str, str]]:
    """(source line, target line) pairs of two line-aligned inputs, read in lockstep; when one ends
    before the other, the rest of the other is counted (not kept) for a :class:`MtkitError`."""
    done = object()
    src_lines, tgt_lines = _lines(src), _lines(tgt)
    for n, (s, t) in enumerate(itertools.zip_longest(src_lines, tgt_lines, fillvalue=done)):
        if s is done:
            raise _mismatch(src, n, tgt, n + 1 + sum(1 for _ in tgt_lines))
        if t is done:
            raise _mismatch(src, n + 1 + sum(1 for _ in src_lines), tgt, n)
        yield s, t


def format_score(score, output_format: str) -> str:
    """One output line (without newline) of a :class:`mtkit.engines.pair_scoring.PairScore`."""
    if output_format == "json":
        finite = math.isfinite(score.logprob)
        return json.dumps({"line": score.index + 1, "logprob": score.logprob if finite else None,
                           "mean": score.mean if finite else None, "tokens": score.tokens})
    return f"{score.logprob:.4f}\t{score.mean:.4f}\t{score.tokens}"


@dataclass(frozen=True)
class ScoreOptions:
    """Everything ``mtkit score`` takes besides its models and its two inputs (the CLI's flags, one field each).

    Args:
        output_format: ``text`` | ``json`` (see the module docstring).
        batch_tokens: padded tokens per batch (None: the checkpoint's ``decode.batch_tokens``).
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        precision: ``fp32`` | ``bf16`` | ``fp16`` (autocast; the log-softmax is fp32).
        tgt_lang: the target language of a multilingual model, whose tag leads each source (required
            when it has several targets).
    """

    output_format: str = "text"
    batch_tokens: int | None = None
    device: str = "auto"
    precision: str = "fp32"
    tgt_lang: str | None = None

    def check(self) -> None:
        """One error line, naming the flag, for the first setting out of its range."""
        if self.output_format not in FORMATS:
            raise MtkitError(f"--format {self.output_format}: expected one of {', '.join(FORMATS)}")
        if self.precision not in PRECISIONS:
            raise MtkitError(f"--precision {self.precision}: expected one of {', '.join(PRECISIONS)}")
        if self.batch_tokens is not None:
            DecodeOptions(batch_tokens=self.batch_tokens).check()  # the decoding batches' rule


def score(model_path: Path | list[Path], src: str, tgt: str, options: ScoreOptions | None = None) -> None:
    """Print the log-probability of each line of ``tgt`` given the same line of ``src``.

    Args:
        model_path: a checkpoint or run directory, or a list of them (an ensemble: the
            log-softmax of the mean of the members' log-probabilities, as translate's).
        src, tgt: line-aligned files; ``-`` (for one of them) is stdin.
        options: the flags (:class:`ScoreOptions`).
    """
    o = options or ScoreOptions()
    o.check()
    if src == "-" and tgt == "-":
        raise MtkitError("--src and --tgt are both '-': at most one of them can be stdin")
    for flag, name in (("--src", src), ("--tgt", tgt)):
        if name != "-" and (not Path(name).exists() or Path(name).is_dir()):
            problem = "is a directory, expected a file" if Path(name).is_dir() else "no such file"
            raise MtkitError(f"{flag} {name}: {problem}")
    if "-" in (src, tgt):
        standard_input()  # closed: one line now, before the model loads
    standard_output()
    if "-" not in (src, tgt) and Path(src).is_file() and Path(tgt).is_file():  # no pipe: cheap to count first
        n_src, n_tgt = count_lines(src), count_lines(tgt)
        if n_src != n_tgt:
            raise _mismatch(src, n_src, tgt, n_tgt)

    paths = list(model_path) if isinstance(model_path, (list, tuple)) else [model_path]
    # Forced decoding only (no search engine; torch's threads as the process has them).
    model = load_models(paths, LoadOptions(engine="torch", device=o.device, precision=o.precision,
                                           target=o.tgt_lang, any_target=False, task="score",
                                           batch_tokens=o.batch_tokens))
    scorer = model.scorer

    progress = sentence_progress()
    out = standard_output()
    try:
        for result in scorer.score(paired_lines(src, tgt), chunk_size=CHUNK_LINES, target=o.tgt_lang):
            out.write((format_score(result, o.output_format) + "\n").encode("utf-8"))
            if progress is not None:
                progress.update(1)
        out.flush()
    except BrokenPipeError:
        discard_stdout()  # the CLI then exits 0
        raise
    finally:
        if progress is not None:
            progress.close()

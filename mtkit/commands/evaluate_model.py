"""``mtkit evaluate`` in all its forms: score files, or translate with a model first.

* ``--hyp H --ref R``: score H (``-``: stdin) against R (see :mod:`mtkit.commands.evaluate`).
* ``--model M --src S --ref R``: translate S with M (the checkpoint's decode settings,
  overridden by the options; ``--model`` repeated: an ensemble), then score the
  translations; ``--hyp-out`` also writes them to a file.
* ``--testset wmt14/full --langpair en-de``: sources and references from sacrebleu;
  with ``--model`` they are translated, else ``--hyp`` is scored against them.

Nothing is written unless asked for: translations and sacrebleu's references are
scored in memory (sacrebleu keeps its own cache of test sets), never written beside
the model. Hypotheses are always detokenized text and references always the raw text.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mtkit.errors import MtkitError


def translate_lines(model_path: Path | list[Path], lines: list[str], decode_overrides: dict,
                    device: str = "auto", flags: bool = False) -> tuple[list[str], bool]:
    """Detokenized translations of ``lines`` (one per line) with a checkpoint or run directory (or a
    list of them: an ensemble, decoding with the first one's settings), and whether the model's
    target vocabulary lowercases (``data.spm.lowercase``). Says on stderr which checkpoints it loaded.

    Args:
        decode_overrides: decode keys set on top of the checkpoint's ``decode`` section.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        flags: the overrides come from command-line flags (``--beam``): errors name the flags.
    """
    from mtkit.commands.translate import apply_decode_flags, check_decode_flags, resolve_device, say_loaded
    from mtkit.config import override_section
    from mtkit.training.checkpoint import load_model
    from mtkit.translate import Translator

    if flags:
        check_decode_flags(decode_overrides)
    device = resolve_device(device)
    paths = list(model_path) if isinstance(model_path, (list, tuple)) else [model_path]
    loaded = [load_model(p, device) for p in paths]
    base = loaded[0].config.decode
    decode = apply_decode_flags(base, decode_overrides) if flags else override_section(base, "decode", decode_overrides)
    translator = Translator(loaded, decode, device=device)
    say_loaded(loaded)
    return translator.translate_text(lines), loaded[0].vocab.lowercases("tgt")


def evaluate(
    hyp: list[Path],
    ref: list[Path],
    model: list[Path] | None,
    src: Path | None,
    testset: str | None,
    langpair: str | None,
    hyp_out: Path | None,
    metrics: list[str],
    chrf_plus: bool,
    lc_tok: bool,
    compound_split: bool,
    lang: str | None,
    as_json: bool,
    decode_overrides: dict,
    device: str = "auto",
    lowercase: bool = False,
) -> str:
    """Run the evaluation the options describe; return the text to print."""
    from mtkit.commands.evaluate import evaluate_lines, read_named
    from mtkit.io import atomic_write_text, read_lines

    if model is not None and hyp:
        raise MtkitError("give either --hyp or --model, not both")
    if sum(str(p) == "-" for p in [*hyp, *ref]) > 1:
        raise MtkitError("only one of the --hyp/--ref files can be '-' (stdin)")
    if hyp_out is not None:
        if model is None:
            raise MtkitError("--hyp-out needs --model (it writes the model's translations)")
        if Path(hyp_out).is_dir():
            raise MtkitError(f"--hyp-out {hyp_out}: is a directory; give a file path")
    if testset is not None:
        from mtkit.metrics import load_testset

        if not langpair:
            raise MtkitError("--testset needs --langpair, e.g. --langpair en-de")
        if src is not None or ref:
            raise MtkitError("--testset brings its own sources and references; drop --src/--ref")
        sources, references = load_testset(testset, langpair)
        refs = [(f"{testset}:{langpair}" + (f" ref{k}" if len(references) > 1 else ""), stream)
                for k, stream in enumerate(references)]
        lang = lang or langpair.split("-")[1]
    else:
        if model is not None and (src is None or not ref):
            raise MtkitError("--model needs --src and --ref (or --testset and --langpair)")
        if not ref:
            raise MtkitError("nothing to score: give --hyp and --ref, or --model with --src and --ref, or --testset")
        refs = read_named(ref)
        if lang is None and model is not None:
            suffix = Path(ref[0]).suffix.lstrip(".")
            lang = suffix if len(suffix) == 2 else None
    if model is None:
        if not hyp:
            raise MtkitError("nothing to score: give --hyp and --ref, or --model with --src and --ref, or --testset")
        hyps = read_named(hyp)
    else:
        src_lines = sources if testset is not None else list(read_lines(src))
        hypotheses, folds_case = translate_lines(model, src_lines, decode_overrides, device, flags=True)
        if folds_case and not lowercase:
            print("the model's vocabulary lowercases its output: BLEU and chrF are case-insensitive", file=sys.stderr)
            lowercase = True
        if hyp_out is not None:
            atomic_write_text(hyp_out, "".join(line + "\n" for line in hypotheses))
            print(f"hypotheses: {hyp_out}", file=sys.stderr)
        hyps = [(str(hyp_out) if hyp_out is not None else ", ".join(map(str, model)), hypotheses)]
    return evaluate_lines(hyps, refs, metrics, chrf_plus, lc_tok, as_json, compound_split=compound_split, lang=lang,
                          lowercase=lowercase)

"""``mtkit evaluate`` in all its forms: score files, or translate with a model first.

* ``--hyp H --ref R``: score H against R (see :mod:`mtkit.commands.evaluate`).
* ``--model M --src S --ref R``: translate S with M (the checkpoint's decode settings,
  overridden by the options; ``--model`` repeated: an ensemble), write the hypotheses to
  ``--hyp-out``, then score them.
* ``--testset wmt14/full --langpair en-de``: sources and references from sacrebleu;
  with ``--model`` they are translated, else ``--hyp`` is scored against them.

Hypotheses are always detokenized text and references always the raw text.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mtkit.errors import MtkitError


def translate_lines(model_path: Path | list[Path], lines: list[str], decode_overrides: dict,
                    device: str = "auto") -> tuple[list[str], bool]:
    """Detokenized translations of ``lines`` (one per line) with a checkpoint or run directory (or a
    list of them: an ensemble, decoding with the first one's settings), and whether the model's
    target vocabulary lowercases (``data.spm.lowercase``)."""
    import torch

    from mtkit.config import override_section

    from mtkit.training.checkpoint import load_model
    from mtkit.translate import Translator

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    paths = list(model_path) if isinstance(model_path, (list, tuple)) else [model_path]
    loaded = [load_model(p, device) for p in paths]
    decode = override_section(loaded[0].config.decode, "decode", decode_overrides)
    return Translator(loaded, decode, device=device).translate_text(lines), loaded[0].vocab.lowercases("tgt")


def default_hyp_out(model: Path, name: str) -> Path:
    """Hypotheses go beside the scores: RUN/eval/NAME.hyp for a run directory, else beside the checkpoint."""
    model = Path(model)
    folder = model / "eval" if model.is_dir() else model.parent / "eval"
    return folder / f"{name}.hyp"


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
    from mtkit.commands.evaluate import evaluate_files
    from mtkit.io import atomic_write_text, read_lines

    if testset is not None:
        from mtkit.metrics import load_testset

        if not langpair:
            raise MtkitError("--testset needs --langpair, e.g. --langpair en-de")
        if src is not None or ref:
            raise MtkitError("--testset brings its own sources and references; drop --src/--ref")
        sources, references = load_testset(testset, langpair)
        name = f"{testset.replace('/', '_')}.{langpair}"
        folder = (default_hyp_out(model[0], name).parent if model is not None else Path(hyp[0]).parent) if (model or hyp) else Path(".")
        ref = []
        for k, stream in enumerate(references):
            path = folder / f"{name}.ref{k}.{langpair.split('-')[1]}"
            atomic_write_text(path, "".join(line + "\n" for line in stream))
            ref.append(path)
        if model is not None:
            src_lines = sources
            lang = lang or langpair.split("-")[1]
    elif model is not None:
        if src is None or not ref:
            raise MtkitError("--model needs --src and --ref (or --testset and --langpair)")
        src_lines = list(read_lines(src))
        name = Path(src).name
    if model is not None:
        if hyp:
            raise MtkitError("give either --hyp or --model, not both")
        out = hyp_out or default_hyp_out(model[0], name)
        hypotheses, folds_case = translate_lines(model, src_lines, decode_overrides, device)
        if folds_case and not lowercase:
            print("the model's vocabulary lowercases its output: BLEU and chrF are case-insensitive", file=sys.stderr)
            lowercase = True
        atomic_write_text(out, "".join(line + "\n" for line in hypotheses))
        print(f"hypotheses: {out}", file=sys.stderr)
        hyp = [out]
        if lang is None and ref:
            suffix = Path(ref[0]).suffix.lstrip(".")
            lang = suffix if len(suffix) == 2 else None
    if not hyp or not ref:
        raise MtkitError("nothing to score: give --hyp and --ref, or --model with --src and --ref, or --testset")
    return evaluate_files(hyp, ref, metrics, chrf_plus, lc_tok, as_json, compound_split=compound_split, lang=lang,
                          lowercase=lowercase)

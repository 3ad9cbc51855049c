"""Training curves: loss and validation BLEU against step, drawn from ``metrics.jsonl``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from mtkit.errors import MtkitError
from mtkit.io import atomic_path

logger = logging.getLogger(__name__)


def read_metrics(path: Path) -> list[dict]:
    """The records of ``metrics.jsonl``, one JSON object per line.

    A process killed while appending leaves a cut-short last line: it is dropped with a
    warning on stderr. A bad line before the last one is not a torn append; it is an error.
    Lines whose step or metrics are not numbers (edited by hand, another program's) are
    dropped, with one warning for all of them.
    """
    path = Path(path)
    if not path.is_file():
        raise MtkitError(f"{path}: no such metrics file")
    lines = [(n, line) for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if line.strip()]
    records = []
    not_numbers = []
    for i, (number, line) in enumerate(lines):
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError
        except (ValueError, RecursionError):  # RecursionError: a line nested 100,000 deep
            if i == len(lines) - 1:
                logger.warning(f"warning: {path}: line {number} is cut short (a crash while writing it?); ignored")
                break
            raise MtkitError(f"{path}: line {number}: not a JSON object") from None
        if any(_plotted(key) and not _is_number(value) for key, value in record.items()):
            not_numbers.append(number)
            continue
        records.append(record)
    if not_numbers:
        shown = ", ".join(map(str, not_numbers[:5])) + (", ..." if len(not_numbers) > 5 else "")
        logger.warning(f"warning: {path}: {len(not_numbers)} line(s) ({shown}) hold a step or metric that is not "
                       "a number; ignored")
    return records


def _plotted(key: str) -> bool:
    """A key whose value is drawn or compared: the step and the losses and scores."""
    return key in ("step", "loss", "valid_loss", "valid_bleu") or key.startswith(("valid_loss/", "valid_bleu/"))


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _pairs(records: list[dict], prefix: str) -> list[str]:
    """The pairs a multilingual run logged under ``prefix`` (``valid_loss/en-de`` -> ``en-de``), in order."""
    return list(dict.fromkeys(k[len(prefix):] for r in records for k in r if k.startswith(prefix)))


def draw_curves(metrics_path: Path, png_path: Path) -> Path:
    """Write a PNG with training/validation loss and validation BLEU against the update step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(Path(metrics_path))
    train = [r for r in records if "loss" in r]
    valid = [r for r in records if "valid_loss" in r]
    bleu = [r for r in records if "valid_bleu" in r]
    fig, axes = plt.subplots(1, 2 if bleu else 1, figsize=(11 if bleu else 6, 4), squeeze=False)
    ax = axes[0][0]
    if train:
        ax.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss")
    if valid:
        ax.plot([r["step"] for r in valid], [r["valid_loss"] for r in valid], "o-", label="valid loss")
    for pair in _pairs(valid, "valid_loss/"):  # a multilingual run: each pair's, beside their mean above
        rows = [r for r in valid if f"valid_loss/{pair}" in r]
        ax.plot([r["step"] for r in rows], [r[f"valid_loss/{pair}"] for r in rows], ".--", label=f"valid loss {pair}")
    ax.set_xlabel("update step")
    ax.set_ylabel("label-smoothed loss per token")
    ax.grid(alpha=0.3)
    ax.legend()
    if bleu:
        ax = axes[0][1]
        pairs = _pairs(bleu, "valid_bleu/")
        ax.plot([r["step"] for r in bleu], [r["valid_bleu"] for r in bleu], "o-", color="tab:green",
                label="mean over the pairs" if pairs else None)
        for pair in pairs:
            rows = [r for r in bleu if f"valid_bleu/{pair}" in r]
            ax.plot([r["step"] for r in rows], [r[f"valid_bleu/{pair}"] for r in rows], ".--", label=pair)
        ax.set_xlabel("update step")
        ax.set_ylabel("validation BLEU (sacreBLEU)")
        ax.grid(alpha=0.3)
        if pairs:
            ax.legend()
    fig.tight_layout()
    with atomic_path(png_path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return Path(png_path)

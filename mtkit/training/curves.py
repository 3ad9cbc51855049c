"""Training curves: loss and validation BLEU against step, drawn from ``metrics.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path

from mtkit.errors import MtkitError
from mtkit.io import atomic_path


def read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        raise MtkitError(f"{path}: no such metrics file")
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                raise MtkitError(f"{path}: line {number}: not valid JSON") from None
    return records


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
    ax.set_xlabel("update step")
    ax.set_ylabel("label-smoothed loss per token")
    ax.grid(alpha=0.3)
    ax.legend()
    if bleu:
        ax = axes[0][1]
        ax.plot([r["step"] for r in bleu], [r["valid_bleu"] for r in bleu], "o-", color="tab:green")
        ax.set_xlabel("update step")
        ax.set_ylabel("validation BLEU (sacreBLEU)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(png_path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return Path(png_path)

"""Cross-attention heatmaps: which source pieces each target piece attended to.

matplotlib is imported only when a picture is drawn (with the Agg backend, so no
display is needed).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from mtkit.config import BOS_ID, EOS_ID
from mtkit.data.languages import decoder_start
from mtkit.io import atomic_path


def cross_attention(model, src_ids: Sequence[int], tgt_ids: Sequence[int], start: int | None = None):
    """The cross-attention weights of one sentence pair, a numpy array (L, h, T+1, S).

    ``src_ids`` end in EOS; ``tgt_ids`` are the output without BOS/EOS. Row ``t``
    is the decoder position that predicted output token ``t`` (the last row, EOS). ``start``: the
    decoder's first input (None: BOS; a target-side tag).
    """
    device = next(model.parameters()).device
    src = torch.tensor([list(src_ids)], dtype=torch.long, device=device)  # (1, S)
    tgt = torch.tensor([[BOS_ID if start is None else start, *tgt_ids]], dtype=torch.long, device=device)  # (1, T+1)
    with torch.inference_mode():
        maps = model.cross_attention(src, tgt)  # (L, 1, h, T+1, S)
    return maps[:, 0].float().cpu().numpy()


def save_attention_png(weights, src_pieces: Sequence[str], tgt_pieces: Sequence[str], path: str | Path,
                       layer: int | None = None, title: str | None = None) -> Path:
    """Draw a heatmap of ``weights`` (L, h, T, S) to the PNG ``path``.

    Args:
        layer: average the heads of this decoder layer (0-based; negative counts from
            the end); None averages every layer and head.
        src_pieces, tgt_pieces: the S column and T row labels.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if layer is None:
        grid = weights.mean(axis=(0, 1))  # (T, S)
        which = "all layers and heads"
    else:
        if not -weights.shape[0] <= layer < weights.shape[0]:
            raise ValueError(f"layer {layer} out of range for {weights.shape[0]} decoder layers")
        grid = weights[layer].mean(axis=0)
        which = f"layer {layer % weights.shape[0]}, mean of {weights.shape[1]} heads"
    T, S = grid.shape
    fig, ax = plt.subplots(figsize=(max(4.0, 0.35 * S + 2), max(3.0, 0.35 * T + 1.5)))
    image = ax.imshow(grid, cmap="viridis", aspect="auto", vmin=0.0)
    ax.set_xticks(range(S), labels=list(src_pieces)[:S], rotation=90, fontsize=8)
    ax.set_yticks(range(T), labels=list(tgt_pieces)[:T], fontsize=8)
    ax.set_xlabel("source")
    ax.set_ylabel("target")
    ax.set_title(title or f"cross-attention ({which})", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.04)
    fig.tight_layout()
    path = Path(path)

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return path


def attention_png(model, vocab, src_ids: Sequence[int], tgt_ids: Sequence[int], path: str | Path,
                  layer: int | None = None) -> Path:
    """The heatmap of one translated sentence (source ids with EOS, output ids without)."""
    weights = cross_attention(model, src_ids, tgt_ids, decoder_start(vocab))
    src_labels = vocab.src_pieces(src_ids)
    tgt_labels = vocab.tgt_pieces(tgt_ids) + [vocab.tgt_pieces([EOS_ID])[0]]
    return save_attention_png(weights, src_labels, tgt_labels, path, layer)

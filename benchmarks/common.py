"""Shared pieces of the training-speed benchmarks (benchmarks/model.py, benchmarks/train.py).

* the shapes compared (tiny, small, base) and their mtkit / MarianMT configs;
* synthetic batches with a realistic length distribution, cut by mtkit's own token
  batching, and naive fixed-size sentence batches (as Hugging Face users make them);
* model FLOPs of one training step, and a matmul peak measured in the same run (for MFU);
* an interleaved timer: every runner does one step in turn, round after round, and the
  median step time is kept, so that load from other processes hits all runners alike.

How FLOPs are counted (one forward+backward = 3 × the forward's 2·m·k·n per matmul):
  * weight matmuls: 6 × (matmul parameters applied to a token) × real (non-padding) tokens,
    source tokens for the encoder and the decoder's cross-attention K/V projections,
    target tokens for the rest of the decoder and the vocabulary projection;
    embeddings lookups, biases and LayerNorm parameters are not matmuls and not counted;
  * attention: per layer and sentence, QKᵀ and A·V are 2·2·L_q·L_k·d_model FLOPs forward
    each pair, with the real lengths; encoder and cross attention count L_q·L_k in full,
    causal self-attention half of T² (the part the causal mask keeps); × 3 for the backward.
Padding is not counted: work on padding is waste, and MFU shows it.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mtkit.config import PAD_ID, ModelConfig, config_from_dict
from mtkit.host_memory import keep_freed_memory
from mtkit.training.batching import Batch, collate, make_batches

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MULTI30K = REPO.parent / "shared/data/multi30k"

# name -> (ModelConfig keyword arguments, vocabulary size)
SHAPES: dict[str, tuple[dict, int]] = {
    "tiny": (dict(preset="transformer-tiny"), 8000),
    "small": (dict(d_model=256, h=4, d_ff=1024, encoder_layers=3, decoder_layers=3, dropout=0.1), 8000),
    "base": (dict(preset="transformer-base"), 32000),
}


def model_config(shape: str) -> ModelConfig:
    return config_from_dict({"model": SHAPES[shape][0]}).model


def vocab_size(shape: str) -> int:
    return SHAPES[shape][1]


def setup_threads(threads: int) -> None:
    # Which policy is fastest depends on the engine and the batch size (benchmarks/README.md): say which ran.
    print(f"# OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}", flush=True)
    torch.set_num_threads(threads)
    keep_freed_memory()  # as the mtkit CLI does; it applies to every runner of the process alike


def machine() -> str:
    name = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores visible, torch {torch.__version__}"


# --------------------------------------------------------------------- batches


class ListStore:
    """A tiny in-memory parallel store (what mtkit's batching needs)."""

    def __init__(self, srcs: list[np.ndarray], tgts: list[np.ndarray]) -> None:
        self.srcs, self.tgts = srcs, tgts
        self.src_lengths = np.array([len(s) for s in srcs])
        self.tgt_lengths = np.array([len(t) for t in tgts])

    def __len__(self) -> int:
        return len(self.srcs)

    def src(self, i: int) -> np.ndarray:
        return self.srcs[i]

    def tgt(self, i: int) -> np.ndarray:
        return self.tgts[i]


def synthetic_store(n: int, vocab: int, seed: int = 0) -> ListStore:
    """``n`` random sentence pairs with Multi30k-like lengths: source 10-30 tokens
    (mean about 16), target about 1.1 × the source, ids drawn from the non-special range."""
    rng = np.random.default_rng(seed)
    src_len = np.clip(np.rint(rng.gamma(9.0, 1.8, n)), 10, 30).astype(int)
    tgt_len = np.clip(np.rint(src_len * rng.normal(1.1, 0.15, n)), 8, 34).astype(int)
    srcs = [rng.integers(4, vocab, s) for s in src_len]
    tgts = [rng.integers(4, vocab, t) for t in tgt_len]
    return ListStore(srcs, tgts)


def token_batches(store, max_tokens: int, n: int, seed: int = 1) -> list[Batch]:
    """``n`` of mtkit's token-budget batches (length-bucketed, in shuffled order), leaving out
    the odd small batch at a length boundary so that every batch is close to full."""
    batches = make_batches(store.src_lengths, store.tgt_lengths, max_tokens, seed)
    order = np.random.default_rng(seed).permutation(len(batches))
    width = np.maximum(store.src_lengths, store.tgt_lengths) + 1
    full = [i for i in order if width[batches[i]].max() * len(batches[i]) >= 0.85 * max_tokens]
    return [collate(store, batches[i]) for i in full[:n]]


def naive_batch_size(store, batches: list[Batch]) -> int:
    """Sentences per naive batch that give the same real target tokens per batch as ``batches``."""
    mean_tgt = float(np.mean(store.tgt_lengths)) + 1
    return max(1, round(np.mean([b.n_tgt_tokens for b in batches]) / mean_tgt))


def sentence_batches(store, batch_size: int, n: int, seed: int = 1) -> list[Batch]:
    """``n`` naive batches of ``batch_size`` random sentences, padded to the longest."""
    order = np.random.default_rng(seed).permutation(len(store))
    return [collate(store, order[i * batch_size : (i + 1) * batch_size]) for i in range(n)]


def real_tokens(batches: list[Batch]) -> tuple[int, int]:
    """(source, target) non-padding tokens over the batches (source counts EOS, target EOS)."""
    return sum(int((b.src != PAD_ID).sum()) for b in batches), sum(b.n_tgt_tokens for b in batches)


def padding_fraction(batches: list[Batch]) -> float:
    cells = sum(b.src.numel() + b.tgt_out.numel() for b in batches)
    return 1.0 - sum(real_tokens(batches)) / cells


# ----------------------------------------------------------------------- FLOPs


def step_flops(cfg: ModelConfig, vocab: int, batch: Batch) -> float:
    """Model FLOPs of one forward+backward over ``batch`` (see the module docstring)."""
    d, f = cfg.d_model, cfg.d_ff
    src_len = (batch.src != PAD_ID).sum(1).double()  # (B,)
    tgt_len = (batch.tgt_out != PAD_ID).sum(1).double()  # (B,)
    S, T = float(src_len.sum()), float(tgt_len.sum())
    enc = cfg.encoder_layers * (4 * d * d + 2 * d * f) * S
    dec = cfg.decoder_layers * ((6 * d * d + 2 * d * f) * T + 2 * d * d * S)
    proj = d * vocab * T
    attn_fwd = 4 * d * (
        cfg.encoder_layers * float((src_len**2).sum())
        + cfg.decoder_layers * (float((tgt_len**2).sum()) / 2 + float((src_len * tgt_len).sum()))
    )
    return 6 * (enc + dec + proj) + 3 * attn_fwd


class PeakProbe:
    """A matmul burst timed as one more runner in the interleaved rounds, so that the peak
    it measures sees the same load from other processes as the model steps around it."""

    def __init__(self, dtype: torch.dtype, sizes: list[tuple[int, int, int]], reps: int = 3) -> None:
        self.pairs = [(torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)) for m, k, n in sizes]
        self.reps = reps
        self.results: list[float] = []

    def __call__(self, _batch=None) -> None:
        best = 0.0
        for a, b in self.pairs:
            a @ b
            start = time.perf_counter()
            for _ in range(self.reps):
                a @ b
            best = max(best, 2 * a.size(0) * a.size(1) * b.size(1) * self.reps / (time.perf_counter() - start))
        self.results.append(best)

    def peak(self) -> float:
        """Median over the rounds of the best FLOP/s of a burst (warm-up bursts included)."""
        return statistics.median(self.results)


def peak_sizes(cfg: ModelConfig, vocab: int, tokens: int) -> list[tuple[int, int, int]]:
    """The model's own big weight-matmul sizes at ``tokens`` rows."""
    d, f = cfg.d_model, cfg.d_ff
    return [(tokens, d, f), (tokens, f, d), (tokens, d, min(vocab, 8192))]


# ---------------------------------------------------------------------- timing


@dataclass
class Runner:
    name: str
    step: Callable[[Batch], None]
    batches: list[Batch]
    records: list[tuple[float, Batch]]  # (seconds, batch) of each timed step


def interleaved(runners: list[Runner], warmup: int, steps: int, log: Callable[[str], None] | None = None) -> None:
    """Time ``steps`` steps of every runner after ``warmup`` untimed ones, one runner after the
    other in each round (so that other processes' load is shared out fairly)."""
    for r in range(warmup + steps):
        for runner in runners:
            batch = runner.batches[r % len(runner.batches)]
            start = time.perf_counter()
            runner.step(batch)
            if r >= warmup:
                runner.records.append((time.perf_counter() - start, batch))
        if log:
            log(f"round {r + 1}/{warmup + steps} done")


def tokens_per_s(runner: Runner) -> float:
    """Target tokens per second: the median over the timed steps of real target tokens / seconds."""
    return statistics.median(b.n_tgt_tokens / t for t, b in runner.records)


def flops_per_s(cfg: ModelConfig, vocab: int, runner: Runner) -> float:
    """Model FLOPs per second (median over the timed steps)."""
    return statistics.median(step_flops(cfg, vocab, b) / t for t, b in runner.records)


def make_runner(name: str, step: Callable[[Batch], None], batches: list[Batch]) -> Runner:
    return Runner(name, step, batches, [])


def print_table(header: list[str], rows: list[list], file=None) -> None:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells[0], widths))), file=file)
    print(line, file=file)
    for row in cells[1:]:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))), file=file)


# ------------------------------------------------------------------- the models


def build_mtkit(shape: str, seed: int = 0):
    from mtkit.model import Transformer

    torch.manual_seed(seed)
    return Transformer(model_config(shape), vocab_size(shape), vocab_size(shape), pad_id=PAD_ID)


def build_marian(shape: str, seed: int = 0):
    """A randomly initialized MarianMTModel of the same dimensions as mtkit's ``shape``
    (post-norm, ReLU, scaled embeddings, sinusoidal positions, one shared embedding matrix)."""
    from transformers import MarianConfig, MarianMTModel

    cfg = model_config(shape)
    mc = MarianConfig(
        vocab_size=vocab_size(shape), d_model=cfg.d_model,
        encoder_layers=cfg.encoder_layers, decoder_layers=cfg.decoder_layers,
        encoder_attention_heads=cfg.h, decoder_attention_heads=cfg.h,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
        dropout=cfg.dropout, attention_dropout=cfg.attention_dropout, activation_dropout=cfg.activation_dropout,
        activation_function="relu", scale_embedding=True, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, max_position_embeddings=cfg.max_positions,
        pad_token_id=PAD_ID, decoder_start_token_id=2, eos_token_id=3, forced_eos_token_id=3,
    )
    torch.manual_seed(seed)
    return MarianMTModel(mc)


def marian_loss(model, batch: Batch, epsilon: float = 0.1) -> torch.Tensor:
    """Summed label-smoothed CE over MarianMT's logits, the way a Hugging Face user writes it."""
    logits = model(input_ids=batch.src, attention_mask=batch.src != PAD_ID, decoder_input_ids=batch.tgt_in).logits
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), batch.tgt_out.reshape(-1),
        ignore_index=PAD_ID, label_smoothing=epsilon, reduction="sum",
    )


def precision_context(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")

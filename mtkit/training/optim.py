"""Adam (§5.3: β1 = 0.9, β2 = 0.98, ε = 1e-9) and the learning-rate schedules."""

from __future__ import annotations

import math

import torch

from mtkit.config import TrainConfig


def build_optimizer(params, cfg: TrainConfig, device_type: str) -> torch.optim.Optimizer:
    """AdamW (decoupled weight decay; with weight_decay 0 it is the paper's Adam), fused where torch has it."""
    kwargs = dict(lr=learning_rate(1, cfg, 512), betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):  # no fused kernel for this device or dtype
        return torch.optim.AdamW(params, foreach=True, **kwargs)


def learning_rate(step: int, cfg: TrainConfig, d_model: int) -> float:
    """The learning rate for update ``step`` (counting from 1).

    noam (§5.3, Eq. 3): lr_scale · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5).
    inverse_sqrt (fairseq): linear warm-up to ``lr`` over ``warmup`` steps, then lr · sqrt(warmup / step).
    linear (fairseq's polynomial_decay with power 1): the same warm-up, then a straight line
    from ``lr`` down to 0 at ``max_steps``: for a fixed budget of updates, ending at 0
    anneals the weights, where inverse_sqrt stops at lr · sqrt(warmup / max_steps).

    ``warmup`` 0 means no warm-up, the peak rate at step 1: noam and inverse_sqrt then
    decay as step^-0.5 from there (as with warmup 1), instead of dividing by zero.
    """
    step = max(step, 1)
    if cfg.lr_schedule == "noam":
        return cfg.lr_scale * d_model**-0.5 * min(step**-0.5, step * max(cfg.warmup, 1) ** -1.5)
    if step < cfg.warmup:
        return cfg.lr * step / cfg.warmup
    if cfg.lr_schedule == "linear":
        # The config requires max_steps > warmup, so the span is never 0.
        return cfg.lr * max(0.0, (cfg.max_steps - step) / max(cfg.max_steps - cfg.warmup, 1))
    return cfg.lr * math.sqrt(max(cfg.warmup, 1) / step)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr

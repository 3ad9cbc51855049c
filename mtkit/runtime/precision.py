"""Mixed precision in one place: the ``precision`` setting builds the autocast context and the scaler."""

from __future__ import annotations

import contextlib

import torch

from mtkit.config import PRECISIONS
from mtkit.errors import MtkitError


def check_precision(precision: str, device_type: str, key: str = "train.precision") -> None:
    """Refuse an unknown precision, and fp16 off CUDA (bf16 is the CPU's half precision); ``key``
    names the setting in the message."""
    if precision not in PRECISIONS:
        raise MtkitError(f"{key}: unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    if precision == "fp16" and device_type != "cuda":
        raise MtkitError(f"{key}=fp16 needs a CUDA device; use bf16 on CPU")


def autocast(precision: str, device_type: str):
    """The forward-pass context for ``precision`` (fp32: none; bf16/fp16: torch.autocast)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device_type, dtype=dtype)


def grad_scaler(precision: str, device_type: str) -> torch.amp.GradScaler:
    """A loss scaler, enabled only for fp16 (bf16 has fp32's range and needs none).

    Overflowing steps are skipped by the scaler, so inf/NaN never reaches the weights.
    """
    return torch.amp.GradScaler(device_type, enabled=precision == "fp16")


def allow_tf32() -> None:
    """TF32 matmuls on Ampere and newer GPUs (no effect elsewhere)."""
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

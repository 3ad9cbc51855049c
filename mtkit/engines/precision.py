"""Mixed precision in one place: the ``precision`` setting builds the autocast context and the scaler."""

from __future__ import annotations

import contextlib

import torch

from mtkit.config import PRECISIONS
from mtkit.errors import MtkitError

# Where fp16 runs. Inference: CUDA only (bf16 is the CPU's half precision, and fp16 matmuls on a CPU
# are slow). Training: also the CPU, where recent torch runs float16 autocast and the loss scaler
# (torch.amp.GradScaler("cpu")) as on CUDA: slow, but the same code path, so it is tested without a GPU.
FP16_DEVICES = {"inference": ("cuda",), "training": ("cuda", "cpu")}


def check_precision(precision: str, device_type: str, key: str = "train.precision", use: str = "inference") -> None:
    """Refuse an unknown precision, and fp16 where it does not run (:data:`FP16_DEVICES` for ``use``,
    ``inference`` or ``training``); ``key`` names the setting in the message."""
    if precision not in PRECISIONS:
        raise MtkitError(f"{key}: unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    devices = FP16_DEVICES[use]
    if precision == "fp16" and device_type not in devices:
        where = "a CUDA device" if devices == ("cuda",) else " or ".join(devices)
        raise MtkitError(f"{key}=fp16 needs {where}; use bf16 on CPU" if "cpu" not in devices
                         else f"{key}=fp16 needs {where}, not {device_type}")


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

"""Device selection in one place: ``auto`` becomes ``cuda:LOCAL_RANK`` or ``cpu``; a device that
is not there is a one-line error naming the flag or setting that asked for it."""

from __future__ import annotations

import re

from mtkit.errors import MtkitError

DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def _shown(name: str, setting: str) -> str:
    """``--device cuda`` for a flag, ``train.device=cuda`` for a config key."""
    return f"{setting} {name}" if setting.startswith("-") else f"{setting}={name}"


def device_type(name: str) -> str:
    """The kind of device a setting asks for (``cuda``, ``mps`` or ``cpu``), before it is checked:
    ``auto`` is ``cuda`` when torch sees a CUDA device."""
    if name.startswith("cuda"):
        return "cuda"
    if name in ("cpu", "mps"):
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_device(name: str, local_rank: int = 0, setting: str = "--device",
                   cuda_devices: int | None = None) -> str:
    """The device to run on: ``cpu``, ``mps``, ``cuda:N`` or ``cuda`` (as asked).

    Args:
        name: ``auto``, ``cpu``, ``mps``, ``cuda`` or ``cuda:N``.
        local_rank: the process's rank on this machine: ``auto`` picks its GPU, ``cuda:LOCAL_RANK``.
        setting: what asked (``--device``, ``train.device``), for the error message.
        cuda_devices: how many CUDA devices the engine sees (CTranslate2 counts its own, without
            torch); None asks torch.

    Raises:
        MtkitError: an unknown device, or one this machine does not have.
    """
    shown = _shown(name, setting)
    if not DEVICE_PATTERN.fullmatch(name) or (name == "mps" and cuda_devices is not None):
        raise MtkitError(f"{shown}: expected auto, cpu, cuda or cuda:N" + (" (or mps)" if cuda_devices is None else ""))
    if name == "cpu":
        return name
    if cuda_devices is None:
        import torch

        if name == "mps":
            if not torch.backends.mps.is_available():
                raise MtkitError(f"{shown}: this torch has no usable MPS device; "
                                 f"use {_shown('cpu', setting)} (or auto)")
            return name
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        engine = f"this torch ({torch.__version__})"
    else:
        count, engine = cuda_devices, "CTranslate2"
    if name == "auto":
        return f"cuda:{local_rank}" if count > 0 else "cpu"
    if count == 0:
        raise MtkitError(f"{shown}: {engine} has no usable CUDA device; use {_shown('cpu', setting)} (or auto)")
    index = int(name.split(":")[1]) if ":" in name else 0
    if index >= count:
        raise MtkitError(f"{shown}: there are {count} CUDA device(s), numbered from 0")
    return name

"""Start ``train.processes`` local training ranks through torchrun (PyTorch DDP).

``mtkit train`` and ``mtkit run`` call :func:`launch_local` when the config asks for
more than one process and the current process was not itself started by torchrun.
It runs ``python -m torch.distributed.run --standalone --nproc_per_node N -m mtkit
train`` on the resolved config (written to a temporary YAML file), so the ranks are
torchrun's and the training code is the same as under a hand-typed torchrun command.

On CPU each rank gets an equal share of the cores as its intra-op threads: several
single-threaded ranks keep small models busier than one process whose threads
split every small matmul (benchmarks/README.md, "DDP ranks against threads").
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from mtkit.config import Config, save_config
from mtkit.errors import MtkitError


def under_torchrun() -> bool:
    """Whether this process is already one rank of a torchrun launch."""
    return "WORLD_SIZE" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def rank_environment(config: Config) -> dict[str, str]:
    """The environment of the ranks: threads per rank on CPU (OMP_NUM_THREADS), unless already set."""
    env = dict(os.environ)
    if "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, usable_cores() // config.train.processes))
    return env


def check_devices(config: Config) -> None:
    """One GPU per rank: refuse more CUDA ranks than visible GPUs before starting any."""
    import torch

    device = config.train.device
    wants_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if wants_cuda and config.train.processes > torch.cuda.device_count():
        raise MtkitError(f"train.processes={config.train.processes} needs one GPU per process, "
                         f"but {torch.cuda.device_count()} are visible")


def launch_local(config: Config, data_dir: Path, run_dir: Path, resume: bool | None = None) -> None:
    """Train ``config`` in ``config.train.processes`` torchrun ranks on this machine; wait for them."""
    check_devices(config)
    with tempfile.TemporaryDirectory(prefix="mtkit-launch-") as tmp:
        recipe = Path(tmp) / "config.yaml"
        save_config(config, recipe)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={config.train.processes}",
               "-m", "mtkit", "train", str(recipe), "--data", str(data_dir), "--run-dir", str(run_dir)]
        if resume is not None:
            cmd.append("--resume" if resume else "--no-resume")
        code = subprocess.call(cmd, env=rank_environment(config))
    if code != 0:
        raise MtkitError(f"training in {config.train.processes} processes failed (torchrun exit code {code}); "
                         "the ranks' messages are above")

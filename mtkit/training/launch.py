"""Start ``train.processes`` local training ranks through torchrun (PyTorch DDP).

``mtkit train`` and ``mtkit run`` call :func:`launch_local` when the config asks for
more than one process and the current process was not itself started by torchrun.
It does what ``torchrun --standalone --nproc_per_node N -m mtkit train`` does, through
torchrun's own launcher API, on the resolved config (written to a temporary YAML file),
so the training code is the same as under a hand-typed torchrun command.

On CPU each rank gets an equal share of the cores as its intra-op threads: several
single-threaded ranks keep small models busier than one process whose threads
split every small matmul (benchmarks/README.md, "DDP ranks against threads").
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from pathlib import Path

from mtkit.config import Config, save_config
from mtkit.errors import Interrupted, MtkitError


def under_torchrun() -> bool:
    """Whether this process is already one rank of a torchrun launch."""
    return "WORLD_SIZE" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def rank_threads(config: Config) -> str:
    """OMP_NUM_THREADS for each rank: the user's setting, else an equal share of the cores."""
    return os.environ.get("OMP_NUM_THREADS") or str(max(1, usable_cores() // config.train.processes))


def wants_cuda(config: Config) -> bool:
    """Whether the recipe trains on GPUs (``train.device`` cuda, or auto with CUDA available)."""
    from mtkit.runtime.device import device_type

    return device_type(config.train.device) == "cuda"


def train_args(recipe: Path, data_dir: Path, run_dir: Path, resume: bool | None = None) -> list[str]:
    """The arguments, after the Python interpreter, of the process that trains ``recipe`` (a saved
    config): ``-m mtkit train RECIPE --data DATA --run-dir RUN [--resume | --no-resume]``. Every
    process mtkit starts to train (torchrun's ranks, an ensemble's members) is started with these."""
    args = ["-m", "mtkit", "train", str(recipe), "--data", str(data_dir), "--run-dir", str(run_dir)]
    if resume is not None:
        args.append("--resume" if resume else "--no-resume")
    return args


def check_devices(config: Config) -> None:
    """One GPU per rank: refuse more CUDA ranks than visible GPUs before starting any."""
    import torch

    if wants_cuda(config) and config.train.processes > torch.cuda.device_count():
        raise MtkitError(f"train.processes={config.train.processes} needs one GPU per process, "
                         f"but {torch.cuda.device_count()} are visible")


def launch_local(config: Config, data_dir: Path, run_dir: Path, resume: bool | None = None) -> None:
    """Train ``config`` in ``config.train.processes`` torchrun ranks on this machine; wait for them.

    torchrun's own launcher (``elastic_launch``, what ``torchrun --standalone`` runs) starts
    ``python -m mtkit train`` in each rank; the ranks print their own messages, and a failed
    rank becomes one error line here instead of torchrun's report."""
    import logging
    import uuid

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from mtkit.training.trainer import check_prepared

    check_prepared(data_dir)  # the likeliest mistake, reported once rather than by every rank
    check_devices(config)
    n = config.train.processes
    launch = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=n, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.5)
    saved_threads = os.environ.get("OMP_NUM_THREADS")
    elastic_log = logging.getLogger("torch.distributed.elastic")
    saved_level = elastic_log.level
    with tempfile.TemporaryDirectory(prefix="mtkit-launch-") as tmp:
        recipe = Path(tmp) / "config.yaml"
        save_config(config, recipe)
        args = train_args(recipe, data_dir, run_dir, resume)
        os.environ["OMP_NUM_THREADS"] = rank_threads(config)  # the ranks inherit this environment
        elastic_log.setLevel(logging.CRITICAL)  # its failure report repeats what the ranks said
        try:
            elastic_launch(launch, sys.executable)(*args)
        except SignalException as e:  # the launcher passed the signal on to the ranks
            raise Interrupted("", e.sigval.value) from None  # rank 0 said where it saved
        except ChildFailedError as e:
            codes = sorted({f.exitcode for f in e.failures.values()})
            if set(codes) <= {128 + signal.SIGINT, 128 + signal.SIGTERM}:
                raise Interrupted("the ranks were interrupted and saved their step; run the same command to resume",
                                  codes[-1] - 128) from None
            raise MtkitError(f"training in {n} processes failed (exit code {', '.join(map(str, codes))}); "
                             "the ranks' messages are above") from None
        finally:
            elastic_log.setLevel(saved_level)
            if saved_threads is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = saved_threads

"""Multi-process training through torchrun and PyTorch DDP (nccl on GPU, gloo on CPU).

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; without them training runs in one
process. There is no home-made communication: DDP averages the gradients, and a
scalar all-reduce gives the global token count used to normalize the loss.

The ranks may be on several machines that share no file system: rank 0 alone reads and
writes the run directory, and hands what the others need (whether and where to resume,
the checkpoint itself, its errors) to them with :func:`from_main`.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import signal
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device_type: str, timeout_minutes: float = 30.0) -> DistContext:
    """Join the torchrun process group when launched by torchrun; else a single-process context."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistContext()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    follow_launcher()
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        # A finite timeout turns a dead peer into an error (and a non-zero exit) instead of a hang.
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=timeout_minutes))
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def follow_launcher() -> None:
    """Have Linux send this rank SIGTERM when its torchrun launcher dies, killed outright (SIGKILL, the OOM
    killer): torchrun starts each rank in a session of its own, so that nothing else ends it, and an orphaned
    rank would go on training, holding the run directory, with the other machines. SIGTERM makes the ranks
    save the step they finished and stop together (mtkit.training.run_dir.StopSignals). Elsewhere than on
    Linux, nothing."""
    if not sys.platform.startswith("linux") or "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the launcher died before the call: nobody is left to signal it
        os.kill(os.getpid(), signal.SIGTERM)


def all_reduce_sums(values: list[float], device: torch.device) -> list[float]:
    """Each of ``values`` summed over all ranks, in one all-reduce (identity in one process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)  # on the device: nccl reduces only GPU tensors
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_sum(value: float, device: torch.device) -> float:
    """The sum of ``value`` over all ranks (identity in one process)."""
    return all_reduce_sums([value], device)[0]


def any_rank(flag: bool, device: torch.device) -> bool:
    """Whether ``flag`` is true on at least one rank (``flag`` itself in one process).
    Decisions that end a loop of collectives (a time limit) must be the same on every rank."""
    return any_ranks([flag], device)[0]


def any_ranks(flags: list[bool], device: torch.device) -> list[bool]:
    """:func:`any_rank` of several flags in one collective (one per training step is enough)."""
    if not (dist.is_available() and dist.is_initialized()):
        return list(flags)
    t = torch.tensor([int(f) for f in flags], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(v) for v in t.tolist()]


def all_gather_objects(obj) -> list:
    """``obj`` of every rank, in rank order (``[obj]`` in one process); picklable objects."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def from_main(obj):
    """Rank 0's ``obj`` on every rank (``obj`` itself in one process); picklable objects, tensors among them."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def lost_peer(error: BaseException) -> bool:
    """Whether ``error`` is a collective that failed because another rank went away (its process or machine
    stopped): torch's distributed errors, and gloo's and NCCL's transport errors, which torch raises as
    RuntimeError."""
    said = str(error)
    return isinstance(error, dist.DistError) or (
        isinstance(error, RuntimeError) and any(w in said for w in ("gloo", "NCCL", "Connection reset", "closed")))


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()

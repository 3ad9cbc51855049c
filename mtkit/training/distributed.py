"""Multi-process training through torchrun and PyTorch DDP (nccl on GPU, gloo on CPU).

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; without them training runs in one
process. There is no home-made communication: DDP averages the gradients, and a
scalar all-reduce gives the global token count used to normalize the loss.
"""

from __future__ import annotations

import datetime
import os
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
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        # A finite timeout turns a dead peer into an error (and a non-zero exit) instead of a hang.
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=timeout_minutes))
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank)


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


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()

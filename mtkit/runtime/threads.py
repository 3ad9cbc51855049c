"""How many CPU threads to compute with: the CPUs this process may use, less those other work keeps busy.

A machine is rarely idle. Two intra-op threads time-sliced on the one core a busy neighbour leaves
wait a scheduler slice at every barrier (and spin while they wait), so that a run beside one other
CPU-bound process keeps a tenth of its speed instead of half (benchmarks/README.md). One thread per
CPU that is free keeps the fair share.

* :func:`usable_cpus`: the CPUs of the process's affinity mask, capped by a cgroup CPU quota
  (``cpu.max`` of cgroup v2, ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` of v1).
* :class:`LoadProbe`: CPU time the whole machine spent busy (``/proc/stat``) less this process's own
  (``os.times``), per second of wall time since the last sample: how many CPUs other work keeps busy.
* :func:`choose_threads`: the count, and a sentence saying why. A user's count (``--threads``,
  ``OMP_NUM_THREADS``) always wins.

Nothing here is timed against a clock in tests: the readers take their inputs as arguments.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

# Another process counts as holding a CPU once it keeps this much of one busy: a CPU-bound process
# that our own threads crowd gets ~0.6 of one, a desktop's background noise stays well under 0.4.
BUSY_SHARE = 0.4
CGROUP = Path("/sys/fs/cgroup")


def cgroup_quota(root: Path = CGROUP) -> float | None:
    """CPUs the cgroup's quota allows (``quota / period``), or None without a quota."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]  # v2: "max 100000" or "200000 100000"
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())  # v1: -1 without a quota
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


def usable_cpus(affinity: int | None = None, quota: float | None = None) -> int:
    """The CPUs this process may run on: its affinity mask, capped by the cgroup's quota (rounded up)."""
    if affinity is None:
        try:
            affinity = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            affinity = os.cpu_count() or 1
    if quota is None:
        quota = cgroup_quota()
    return max(1, min(affinity, math.ceil(quota)) if quota else affinity)


def machine_busy_seconds(stat: str | None = None) -> float | None:
    """Seconds all CPUs have spent busy since boot (``/proc/stat``'s first line less idle and iowait);
    None where there is no ``/proc/stat``."""
    if stat is None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                stat = f.readline()
        except OSError:
            return None
    fields = stat.split()
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


def own_busy_seconds() -> float:
    """CPU seconds this process has spent (all its threads)."""
    t = os.times()
    return t.user + t.system


@dataclass
class Sample:
    wall: float  # time.monotonic()
    machine: float  # machine_busy_seconds()
    own: float  # own_busy_seconds()


class LoadProbe:
    """How many CPUs other work keeps busy, over the time since the previous sample."""

    def __init__(self, first: Sample | None = None) -> None:
        self.last = first or self.sample()

    @staticmethod
    def sample() -> Sample | None:
        machine = machine_busy_seconds()
        return None if machine is None else Sample(time.monotonic(), machine, own_busy_seconds())

    def others(self, now: Sample | None | str = "now") -> float | None:
        """CPUs busy with other work since the last call (None when it cannot be known); ``now``: a
        sample to use instead of taking one (None: no reading)."""
        now = self.sample() if now == "now" else now
        last, self.last = self.last, now
        if now is None or last is None or now.wall - last.wall <= 0:
            return None
        return max(0.0, ((now.machine - last.machine) - (now.own - last.own)) / (now.wall - last.wall))


def user_threads(flag: int = 0, environ: dict | None = None) -> tuple[int, str] | None:
    """The user's thread count and where it was set (a flag > 0 first, then ``OMP_NUM_THREADS``)."""
    if flag > 0:
        return flag, "set by --threads"
    value = (os.environ if environ is None else environ).get("OMP_NUM_THREADS", "")
    if value.strip().isdigit() and int(value) > 0:
        return int(value), "set by OMP_NUM_THREADS"
    return None


def choose_threads(usable: int, others: float | None, user: tuple[int, str] | None = None) -> tuple[int, str]:
    """The intra-op thread count and why: the user's, else one per usable CPU that other work leaves free
    (a CPU counts as taken once other work keeps :data:`BUSY_SHARE` of one busy), at least one."""
    if user is not None:
        return user
    if others is None:
        return usable, f"{usable} usable CPU{'s' if usable != 1 else ''}"
    taken = max(0, math.ceil(others - BUSY_SHARE))
    n = max(1, usable - taken)
    return n, f"{usable} usable CPU{'s' if usable != 1 else ''}, {others:.1f} busy with other work"


class ThreadPolicy:
    """The intra-op thread count of long work (training), chosen again at each :meth:`check`: the user's
    when set, else what :func:`choose_threads` makes of the load since the last check. ``set_threads``
    (``torch.set_num_threads``) is called only when the count changes."""

    def __init__(self, set_threads, user: tuple[int, str] | None = None, usable: int | None = None,
                 probe: LoadProbe | None = None) -> None:
        self.set_threads = set_threads
        self.user = user
        self.usable = usable if usable is not None else usable_cpus()
        self.probe = probe if probe is not None else LoadProbe()
        self.current: int | None = None

    def check(self, now: Sample | None | str = "now") -> str | None:
        """Choose again; ``threads: N (why)`` when the count changed (the first check always says it);
        ``now`` as :meth:`LoadProbe.others` takes it."""
        others = None if self.user is not None else self.probe.others(now)
        n, why = choose_threads(self.usable, others, self.user)
        if n == self.current:
            return None
        self.current = n
        self.set_threads(n)
        return f"threads: {n} ({why})"

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
  ``OMP_NUM_THREADS``) always wins. :func:`serving_choice`: the same for each of a server's decoding
  threads, one CPU left to the HTTP side.
* :class:`ThreadPolicy`: the count of long work (training, an engine between batches, a server's
  decoding threads), chosen again at most every ``min_interval`` seconds.
* :func:`mark_start`, :func:`since_start`: a probe whose first reading was taken when the program started
  (the CLI calls :func:`mark_start` first thing), so that a command's first choice reads the whole time it
  took to start; a program that never marks its start reads from the probe's making.

Nothing here is timed against a clock in tests: the readers take their inputs as arguments.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Another process counts as holding a CPU once it keeps this much of one busy: a CPU-bound process
# that our own threads crowd gets ~0.6 of one, a desktop's background noise stays well under 0.4.
BUSY_SHARE = 0.4
# Long work chooses again at most this often (a choice reads the load over the time since the last).
RECHOOSE_SECONDS = 5.0
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


STARTED: Sample | None = None  # the reading :func:`mark_start` took (None: none taken)


def mark_start() -> None:
    """Take the reading that :func:`since_start` probes read from: what a program (the CLI, the server) calls
    as it starts. Importing this module takes none: a library sets no such state unless asked."""
    global STARTED
    STARTED = LoadProbe.sample()


def since_start(max_age: float = 60.0) -> LoadProbe:
    """A probe reading from :data:`STARTED` (none taken, or a process that started over ``max_age`` seconds
    ago: from now, as what it did then says little of now)."""
    if STARTED is not None and time.monotonic() - STARTED.wall <= max_age:
        return LoadProbe(STARTED)
    return LoadProbe()


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


Choice = Callable[[int, "float | None", "tuple[int, str] | None"], tuple[int, str]]


def serving_choice(decoding_threads: int) -> Choice:
    """The choice for each of a server's ``decoding_threads``: the CPUs other work leaves free
    (:func:`choose_threads`) but one, which the HTTP side keeps, shared by the decoding threads, at least
    one each. Engines that take every core make the event loop fight for one: on a small machine a
    server that leaves it a core answers more requests at every load (benchmarks/README.md)."""

    def choose(usable: int, others: float | None, user: tuple[int, str] | None = None) -> tuple[int, str]:
        if user is not None:
            return user
        free, why = choose_threads(usable, others)
        n = max(1, (free - 1) // max(1, decoding_threads))
        return n, f"{why}; per decoding thread ({decoding_threads}), one CPU left to HTTP"

    return choose


class ThreadPolicy:
    """The intra-op thread count of long work, chosen again at each :meth:`check`: the user's when set,
    else what ``choose`` (:func:`choose_threads`) makes of the load since the last reading. Checks less
    than ``min_interval`` seconds after the last reading keep the count (a check per batch costs a clock
    read). Safe to share between threads: one lock around each choice.

    ``set_threads`` (``torch.set_num_threads``) applies a count; :meth:`fit` applies it in the calling
    thread when ``get_threads`` there differs (torch keeps an OpenMP thread count per thread, so each of
    a server's decoding threads applies it itself)."""

    def __init__(self, set_threads: Callable[[int], object], user: tuple[int, str] | None = None,
                 usable: int | None = None, probe: LoadProbe | None = None, choose: Choice = choose_threads,
                 min_interval: float = 0.0, get_threads: Callable[[], int] | None = None) -> None:
        self.set_threads = set_threads
        self.get_threads = get_threads
        self.user = user
        self.usable = usable if usable is not None else usable_cpus()
        self.probe = probe if probe is not None else LoadProbe()
        self.choose = choose
        self.min_interval = min_interval
        self.current: int | None = None
        self._lock = threading.Lock()

    def check(self, now: Sample | None | str = "now", apply: bool = True) -> str | None:
        """Choose again; ``threads: N (why)`` when the count changed (the first check always says it);
        ``now`` as :meth:`LoadProbe.others` takes it. Applies the count (``set_threads``) on a change
        unless ``apply`` is false (the caller applies :attr:`current` itself)."""
        with self._lock:
            if self.current is not None and (self.user is not None or self._recent(now)):
                return None
            others = None if self.user is not None else self.probe.others(now)
            n, why = self.choose(self.usable, others, self.user)
            if n == self.current:
                return None
            self.current = n
            if apply:
                self.set_threads(n)
            return f"threads: {n} ({why})"

    def fit(self) -> str | None:
        """:meth:`check`, then the count applied in the calling thread where it differs there; what
        :meth:`check` said."""
        said = self.check()
        if self.get_threads is not None and self.current is not None and self.get_threads() != self.current:
            self.set_threads(self.current)
        return said

    def _recent(self, now: Sample | None | str) -> bool:
        last = self.probe.last
        if not self.min_interval or last is None:
            return False
        t = now.wall if isinstance(now, Sample) else time.monotonic()
        return t - last.wall < self.min_interval

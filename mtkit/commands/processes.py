"""The processes mtkit starts: torchrun ranks and an ensemble's members to train, and timed translations
(:func:`timed_mtkit`: the engine table at the end of a distillation recipe).

Both start ``python -m mtkit train RECIPE --data DATA --run-dir RUN`` (:func:`train_args`) on a
resolved config written to a temporary YAML file, so that the training code is the same as under a
hand-typed command. This is glue between ``mtkit train`` / ``mtkit run`` and the library; nothing
below the commands starts processes.

**Ranks** (``train.processes`` > 1 or ``train.nodes`` > 1, and this process not itself a torchrun rank):
:func:`launch_local` does what ``torchrun --standalone --nproc_per_node N -m mtkit train`` does,
through torchrun's own launcher API; on several machines (:class:`Nodes`) what ``torchrun --nnodes M
--node-rank R --master-addr HOST --master-port PORT --nproc_per_node N`` does on each. On CPU each rank
gets an equal share of its machine's cores as its intra-op threads: several single-threaded ranks keep
small models busier than one process whose threads split every small matmul (benchmarks/README.md,
"DDP ranks against threads").

**Ensemble members** (``train.ensemble`` > 1): member k (counted from 1) is the recipe with
``train.seed + k - 1`` and its own run directory: the first keeps RUN, so that one model is the
usual layout, the others take RUN-2, RUN-3, … Translating with all of them (``mtkit translate -m RUN
-m RUN-2``, or ``mtkit run``) averages their log-probabilities at every step
(:class:`mtkit.decoding.ensemble.Ensemble`). On CPU the members train at the same time, each pinned
to an equal share of the cores; on GPUs one after another, each on every GPU the recipe asks for.
The first member writes to this terminal; the others write to ``RUN-k/train.log``, and a member
that fails is reported with the last line it wrote.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch
from torch.distributed import DistError
from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import RendezvousError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from mtkit.config import Config, save_config
from mtkit.config.schema import MAX_PROCESSES
from mtkit.engines.device import device_type
from mtkit.errors import Interrupted, MtkitError, counted, shown
from mtkit.training.run_dir import check_prepared


@dataclasses.dataclass(frozen=True)
class Nodes:
    """The machines one training spans, as this machine's ``mtkit train`` was told: their ``count``
    (``--nnodes``, else ``train.nodes``), this one's ``rank`` (``--node-rank``) and node 0's ``endpoint``
    HOST:PORT (``--rdzv-endpoint``), where the ranks meet (:func:`check_nodes` checked them)."""

    count: int = 1
    rank: int = 0
    endpoint: str | None = None


# HOST:PORT with a host name, an IPv4 address or a bracketed IPv6 address, and a port
_ENDPOINT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*):(?P<port>[0-9]{1,5})$")


def check_nodes(config: Config, count: int | None, rank: int | None, endpoint: str | None) -> Nodes:
    """The machines from the flags (``None``: not given) and the recipe's ``train.nodes``, checked before
    anything loads: each broken rule is one error line naming its flag.

    Raises:
        MtkitError: a count below 1 or above the limit, a rank outside 0..count-1, an endpoint that is not
            HOST:PORT, no endpoint for several machines, node flags under torchrun or with an ensemble.
    """
    given = [flag for flag, value in (("--nnodes", count), ("--node-rank", rank), ("--rdzv-endpoint", endpoint))
             if value is not None]
    if given and under_torchrun():
        raise MtkitError(f"{', '.join(given)}: this process is already a torchrun rank: give torchrun the machines "
                         "(torchrun --nnodes --node-rank --rdzv-endpoint), not mtkit")
    if under_torchrun():  # one rank of the user's own torchrun, which placed it: train.nodes does not apply
        return Nodes()
    count = config.train.nodes if count is None else count
    rank = 0 if rank is None else rank
    if not 1 <= count <= MAX_PROCESSES:
        raise MtkitError(f"--nnodes must be between 1 and {MAX_PROCESSES}, got {count}")
    if not 0 <= rank < count:
        raise MtkitError(f"--node-rank must be between 0 and {count - 1} (--nnodes {count}), got {rank}")
    if endpoint is not None:
        match = _ENDPOINT.match(endpoint)
        if match is None or not 1 <= int(match["port"]) <= 65535:
            raise MtkitError(f"--rdzv-endpoint must be HOST:PORT (node 0's address and a port from 1 to 65535), "
                             f"got {shown(endpoint)}")
    if count > 1 and endpoint is None:
        raise MtkitError(f"--nnodes {count} needs --rdzv-endpoint HOST:PORT: node 0's address and a port it can open")
    if count > 1 and config.train.ensemble > 1:
        raise MtkitError("train.ensemble trains its members on one machine; train them with train.nodes 1")
    return Nodes(count, rank, endpoint)


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
    if wants_cuda(config) and config.train.processes > torch.cuda.device_count():
        raise MtkitError(f"train.processes={config.train.processes} needs one GPU per process, "
                         f"but {torch.cuda.device_count()} are visible")


def launch_local(config: Config, data_dir: Path, run_dir: Path, resume: bool | None = None,
                 nodes: Nodes = Nodes()) -> None:
    """Train ``config`` in ``config.train.processes`` torchrun ranks on this machine; wait for them.

    torchrun's own launcher (``elastic_launch``, what ``torchrun --standalone`` runs) starts
    ``python -m mtkit train`` in each rank; the ranks print their own messages (a rank that exits 1 has
    said why), and a rank that failed otherwise (a signal) becomes one error line here instead of
    torchrun's report.

    On several machines (``nodes.count`` > 1) each runs this with its own ``nodes.rank``; they meet at
    ``nodes.endpoint``, where node 0 opens torchrun's store: torchrun's static rendezvous, so that
    machine R holds the global ranks R × processes … (R + 1) × processes - 1 in every run. Rank 0, which
    alone writes the run directory, is then always on node 0, and a restarted job finds each rank where it
    was (c10d's dynamic rendezvous numbers the machines in the order of their host names and process ids)."""
    check_prepared(data_dir)  # the likeliest mistake, reported once rather than by every rank
    check_devices(config)
    n = config.train.processes
    saved_threads = os.environ.get("OMP_NUM_THREADS")
    elastic_log = logging.getLogger("torch.distributed.elastic")
    saved_level = elastic_log.level
    if nodes.count > 1:
        # run_id prefixes the store's keys: the same on every machine
        rendezvous = dict(rdzv_backend="static", rdzv_endpoint=nodes.endpoint, rdzv_configs={"rank": nodes.rank},
                          run_id="mtkit")
    else:
        rendezvous = dict(rdzv_backend="c10d", rdzv_endpoint="localhost:0", run_id=str(uuid.uuid4()))
    with tempfile.TemporaryDirectory(prefix="mtkit-launch-") as tmp:
        # torchrun's log folder inside ours: by default it makes one in TMPDIR and never removes it.
        launch = LaunchConfig(min_nodes=nodes.count, max_nodes=nodes.count, nproc_per_node=n, max_restarts=0,
                              monitor_interval=0.5, logs_specs=DefaultLogsSpecs(log_dir=str(Path(tmp) / "torchrun")),
                              **rendezvous)
        recipe = Path(tmp) / "config.yaml"
        save_config(config, recipe)
        args = train_args(recipe, data_dir, run_dir, resume)
        os.environ["OMP_NUM_THREADS"] = rank_threads(config)  # the ranks inherit this environment
        elastic_log.setLevel(logging.CRITICAL)  # its failure report repeats what the ranks said
        try:
            elastic_launch(launch, sys.executable)(*args)
        except (RendezvousError, DistError) as e:  # a port taken, a machine that never came
            said = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            where = (f"at {nodes.endpoint} (node {nodes.rank} of {nodes.count})" if nodes.count > 1
                     else "on this machine")
            raise MtkitError(f"the training's processes could not meet {where}: {said}") from None
        except SignalException as e:  # the launcher passed the signal on to the ranks
            raise Interrupted("", e.sigval.value) from None  # rank 0 said where it saved
        except ChildFailedError as e:
            codes = sorted({f.exitcode for f in e.failures.values()})
            if set(codes) <= {128 + signal.SIGINT, 128 + signal.SIGTERM}:
                said = "" if nodes.rank == 0 else (  # rank 0, on node 0, said where it saved
                    "the ranks were interrupted and saved their step; run the same command to resume")
                raise Interrupted(said, codes[-1] - 128) from None
            if codes == [1]:  # Python errors: each rank printed its one line (or its traceback) above
                raise MtkitError("") from None
            on = f" on node {nodes.rank} of {nodes.count}" if nodes.count > 1 else ""
            raise MtkitError(f"training in {counted(n, 'process', 'processes')}{on} failed (exit code "
                             f"{', '.join(map(str, codes))}); the ranks' messages are above") from None
        finally:
            elastic_log.setLevel(saved_level)
            if saved_threads is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = saved_threads


# ------------------------------------------------------------------ ensemble members


def member_run_dirs(run_dir: Path, members: int) -> list[Path]:
    """RUN, RUN-2, …, RUN-N: where the N members of an ensemble train."""
    run_dir = Path(run_dir)
    return [run_dir] + [run_dir.with_name(f"{run_dir.name}-{k}") for k in range(2, members + 1)]


def member_config(config: Config, k: int) -> Config:
    """The recipe of member ``k`` (from 1): its own seed, and a single model to train."""
    train = dataclasses.replace(config.train, seed=config.train.seed + k - 1, ensemble=1)
    return dataclasses.replace(config, train=train)


def core_shares(members: int) -> list[set[int] | None]:
    """The cores each member is pinned to: equal, disjoint shares; None (no pinning) when there
    are fewer cores than members or the platform cannot pin."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return [None] * members
    if len(cores) < members:
        return [None] * members
    per = len(cores) // members
    return [set(cores[k * per:(k + 1) * per]) for k in range(members)]


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def train_members(config: Config, data_dir: Path, run_dir: Path, resume: bool | None = None,
                  members: list[int] | None = None) -> None:
    """Train the ensemble's members (all, or the numbers in ``members``) and wait for them.

    Raises:
        MtkitError: one line naming each member that failed.
    """
    check_prepared(data_dir)  # reported once, not by every member
    n = config.train.ensemble
    run_dirs = member_run_dirs(run_dir, n)
    todo = members if members is not None else list(range(1, n + 1))
    side_by_side = not wants_cuda(config)
    shares = core_shares(len(todo)) if side_by_side else [None] * len(todo)
    user_threads = os.environ.get("OMP_NUM_THREADS")

    with tempfile.TemporaryDirectory(prefix="mtkit-ensemble-") as tmp:
        procs: list[tuple[int, subprocess.Popen, Path | None]] = []
        failed: list[str] = []

        def wait_for(k: int, proc: subprocess.Popen, log: Path | None) -> None:
            if proc.wait() != 0:
                said = _last_line(log) if log is not None else ""
                failed.append(f"member {k} ({run_dirs[k - 1]}, exit code {proc.returncode})"
                              + (f": {said}" if said else ""))

        try:
            for k, cores in zip(todo, shares):
                recipe = Path(tmp) / f"member-{k}.yaml"
                save_config(member_config(config, k), recipe)
                run_dirs[k - 1].mkdir(parents=True, exist_ok=True)
                args = [sys.executable, *train_args(recipe, data_dir, run_dirs[k - 1], resume)]
                env = dict(os.environ)
                if side_by_side and not user_threads:
                    env["OMP_NUM_THREADS"] = str(len(cores) if cores else max(1, usable_cores() // len(todo)))
                log = None if k == todo[0] else run_dirs[k - 1] / "train.log"
                stderr = open(log, "a", encoding="utf-8") if log is not None else None
                try:
                    proc = subprocess.Popen(args, env=env, stdout=stderr, stderr=stderr,
                                            preexec_fn=(lambda c=cores: os.sched_setaffinity(0, c)) if cores else None)
                finally:
                    if stderr is not None:
                        stderr.close()
                if side_by_side:
                    procs.append((k, proc, log))
                else:
                    wait_for(k, proc, log)
            for k, proc, log in procs:
                wait_for(k, proc, log)
        except BaseException:  # Ctrl-C or a failed start: end the members still running
            for _, proc, _ in procs:
                if proc.poll() is None:
                    proc.terminate()
            for _, proc, _ in procs:
                proc.wait()
            raise
    if failed:
        raise MtkitError(f"training the ensemble failed: {'; '.join(failed)}")


@dataclasses.dataclass
class Timed:
    """A finished ``python -m mtkit`` process: its wall time, its peak resident memory, what it wrote."""

    seconds: float
    peak_bytes: int
    stdout: str
    stderr: str


# Run by timed_mtkit: forks and execs the command, then writes its peak resident set to a file. The command's
# ``ru_maxrss`` counts the memory of the process it was forked from (Linux keeps the high-water mark across
# exec): forked from this small launcher, not from the large process that measures, it is the command's own.
_LAUNCHER = """import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def timed_mtkit(args: list[str], stdin: Path | None = None, env: dict | None = None) -> Timed:
    """Run ``python -m mtkit ARGS`` (``stdin`` read from a file, else empty) to its end, in a process of its own;
    its wall time from start to exit and its peak resident set (``wait4``'s ``ru_maxrss``, through a small
    launcher: see :data:`_LAUNCHER`). A failure is an error with the process's last stderr line."""
    with tempfile.TemporaryDirectory(prefix="mtkit-timed.") as tmp:
        out, err, peak = Path(tmp) / "stdout", Path(tmp) / "stderr", Path(tmp) / "peak"
        command = [sys.executable, "-c", _LAUNCHER, str(peak), sys.executable, "-m", "mtkit", *args]
        with open(stdin or os.devnull, "rb") as f_in, open(out, "wb") as f_out, open(err, "wb") as f_err:
            start = time.perf_counter()
            code = subprocess.run(command, stdin=f_in, stdout=f_out, stderr=f_err, env=env).returncode
            seconds = time.perf_counter() - start
        if code != 0 or not peak.is_file():
            raise MtkitError(f"mtkit {' '.join(args[:1])} failed (exit {code}): {_last_line(err)}")
        scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
        return Timed(seconds, int(peak.read_text()) * scale, out.read_text(encoding="utf-8"),
                     err.read_text(encoding="utf-8", errors="replace"))

"""Train the members of an ensemble: ``train.ensemble`` independent models of one recipe.

Member k (counted from 1) is the recipe with ``train.seed + k - 1`` and its own run directory:
the first keeps RUN, so that one model is the usual layout, the others take RUN-2, RUN-3, …
Translating with all of them (``mtkit translate -m RUN -m RUN-2``, or ``mtkit run``) averages
their log-probabilities at every step (:class:`mtkit.runtime.ensemble.Ensemble`).

On CPU the members train at the same time, each in its own ``mtkit train`` process pinned to
an equal share of the cores: the cores then serve several small models instead of splitting the
small matmuls of one (benchmarks/README.md, "DDP ranks against threads"). On GPUs they train
one after another, each on every GPU the recipe asks for.

The first member writes to this terminal; the others write to ``RUN-k/train.log``, and a
member that fails is reported with the last line it wrote.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from mtkit.config import Config, save_config
from mtkit.errors import MtkitError
from mtkit.training.launch import train_args, usable_cores, wants_cuda


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
    from mtkit.training.trainer import check_prepared

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

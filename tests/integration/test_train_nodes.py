"""Training across machines (``mtkit train --nnodes N --node-rank R --rdzv-endpoint HOST:PORT``), on localhost:
two ``mtkit train`` commands play two machines, one process each, gloo. Each node has its own run directory, as
two servers that share no file system would: rank 0 (node 0) alone reads and writes its own; node 1's stays empty.

What they must do: end with the weights of one machine with two processes, bit for bit; resume after either
machine dies (every process of one node killed at once) and end as if nothing had happened; and stop with one
error line naming the rank when one rank's weights drift from the others' (train.sync_check).

Bit for bit holds when every rank computes alike: the same recipe, software and hardware, and the same
number of intra-op threads per rank (OMP_NUM_THREADS=1 here). Left to themselves, one machine with two
processes gives each rank half of this machine's cores, two machines give each all of theirs: the sums inside
each rank's matmuls then run in another order, its gradients differ in their last bits, and Adam makes that
visible (measured: every weight differs, by up to 5e-3 after 30 updates).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY_MODEL, one_error, reverse_data_config, write_reverse_corpus
from inprocess import run_mtkit

from mtkit.checkpoints.io import load_checkpoint
from mtkit.commands.processes import Nodes, check_nodes
from mtkit.config import config_from_dict, save_config
from mtkit.errors import MtkitError
from mtkit.training.sync import differing_ranks, weights_checksum

STEPS = 60
TRAIN = {"max_tokens": 300, "lr_schedule": "inverse_sqrt", "lr": 3e-3, "warmup": 10, "label_smoothing": 0.0,
         "log_every": 10, "valid_every": 0, "save_every": 10, "keep_last": 20, "max_steps": STEPS, "seed": 3,
         "sync_check": 10}
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MTKIT_DEBUG": ""}


@pytest.fixture(scope="module")
def nodes_data(tmp_path_factory) -> tuple[Path, Path]:
    """A small prepared reverse task (600 pairs) and a tiny recipe on it."""
    from mtkit.commands.prepare import prepare

    root = tmp_path_factory.mktemp("nodes")
    data = reverse_data_config(write_reverse_corpus(root / "text", n_train=600, n_valid=20))
    prepare(config_from_dict({"data": data}), root / "prepared", progress=False)
    recipe = root / "recipe.yaml"
    save_config(config_from_dict({"data": data, "model": TINY_MODEL, "train": TRAIN}), recipe)
    return root / "prepared", recipe


# ------------------------------------------------------------------ the flags (fast)


def test_node_flags_are_checked_before_anything_loads(monkeypatch):
    config = config_from_dict({"train": {"nodes": 2}})
    assert check_nodes(config, None, 1, "node0:29500") == Nodes(2, 1, "node0:29500")  # the recipe's count
    assert check_nodes(config, 1, None, None) == Nodes(1, 0, None)  # the flag overrides it
    assert check_nodes(config, 3, 2, "[::1]:1") == Nodes(3, 2, "[::1]:1")
    bad = [((0, None, None), "--nnodes must be between 1 and 1024, got 0"),
           ((2, 2, "h:1"), "--node-rank must be between 0 and 1 (--nnodes 2), got 2"),
           ((2, -1, "h:1"), "--node-rank must be between 0 and 1"),
           ((2, 0, "h"), "--rdzv-endpoint must be HOST:PORT"),
           ((2, 0, "h:0"), "--rdzv-endpoint must be HOST:PORT"),
           ((2, 0, "h:65536"), "--rdzv-endpoint must be HOST:PORT"),
           ((2, 0, "a b:1"), "--rdzv-endpoint must be HOST:PORT"),
           ((2, 1, None), "--nnodes 2 needs --rdzv-endpoint HOST:PORT")]
    for args, said in bad:
        with pytest.raises(MtkitError, match="^" + said.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            check_nodes(config, *args)
    ensemble = config_from_dict({"train": {"ensemble": 2}})
    with pytest.raises(MtkitError, match="train.ensemble trains its members on one machine"):
        check_nodes(ensemble, 2, 0, "h:1")
    monkeypatch.setenv("WORLD_SIZE", "4")  # under the user's own torchrun: torchrun has the machines
    assert check_nodes(config, None, None, None) == Nodes()  # this process is one rank: train.nodes is ignored
    with pytest.raises(MtkitError, match="^--node-rank: this process is already a torchrun rank"):
        check_nodes(config, None, 1, None)


def test_a_bad_node_flag_is_one_error_line_before_the_data_is_read(tmp_path):
    result = run_mtkit("train", "-d", str(tmp_path / "missing"), "-r", str(tmp_path / "run"), "--nnodes", "2",
                       "--node-rank", "1")
    assert one_error(result) == ("error: --nnodes 2 needs --rdzv-endpoint HOST:PORT: node 0's address and a port "
                                 "it can open")
    assert not (tmp_path / "run").exists()


def test_the_checksum_sees_every_bit_and_names_the_odd_rank():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.LayerNorm(3)).to(torch.bfloat16)
    twin = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.LayerNorm(3)).to(torch.bfloat16)
    twin.load_state_dict(model.state_dict())
    assert weights_checksum(model) == weights_checksum(twin)
    with torch.no_grad():
        bits = twin[0].weight.view(torch.int16)
        bits[1, 2] ^= 1  # the lowest bit of one weight
    assert weights_checksum(model) != weights_checksum(twin)
    with torch.no_grad():  # two weights swapped: the same plain sum, another weighted one
        twin.load_state_dict(model.state_dict())
        w = twin[0].weight
        w[0, 0], w[0, 1] = w[0, 1].clone(), w[0, 0].clone()
    assert bool(model[0].weight[0, 0] != model[0].weight[0, 1])
    assert weights_checksum(model) != weights_checksum(twin)
    assert differing_ranks(["a", "a", "b", "a"]) == [2]
    assert differing_ranks(["a", "b"]) == [1]  # a tie: rank 0's is the reference
    assert differing_ranks(["b", "a", "a"]) == [0]
    assert differing_ranks(["a", "a"]) == []


# ------------------------------------------------------------------ two machines on localhost (slow)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(recipe: Path, data_dir: Path, run_dir: Path, rank: int, port: int, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "mtkit", "train", str(recipe), "-d", str(data_dir), "-r", str(run_dir),
           "--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", f"localhost:{port}", *extra]
    # Its temporaries (the launcher's folder) beside its run: a command these tests kill cannot remove them.
    scratch = run_dir.parent / f"tmp-{run_dir.name}"
    scratch.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(cmd, env={**ENV, "TMPDIR": str(scratch)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def two_nodes(recipe: Path, data_dir: Path, runs: tuple[Path, Path], extra: tuple = ((), ())):
    """Both nodes' commands, started together, to their end: [(exit code, stderr)] by node rank."""
    port = free_port()
    procs = [start_node(recipe, data_dir, runs[r], r, port, *extra[r]) for r in (0, 1)]
    said = [p.communicate(timeout=300)[1] for p in procs]
    return [(p.returncode, err) for p, err in zip(procs, said)]


def weights(run: Path) -> dict:
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    return {"step": ckpt["step"], "model": ckpt["model"], "optimizer": ckpt["optimizer"]["state"]}


def assert_same(a: dict, b: dict) -> None:
    assert a["step"] == b["step"]
    for key, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][key]), key
    for index, state in a["optimizer"].items():  # Adam's moments too: the run continues alike
        for key, value in state.items():
            assert torch.equal(value, b["optimizer"][index][key]), (index, key)


@pytest.fixture(scope="module")
def one_machine(nodes_data, tmp_path_factory) -> dict:
    """The reference: one machine, two processes (train.processes 2), the same recipe."""
    data_dir, recipe = nodes_data
    run = tmp_path_factory.mktemp("one-machine") / "run"
    cmd = [sys.executable, "-m", "mtkit", "train", str(recipe), "-d", str(data_dir), "-r", str(run),
           "--set", "train.processes=2"]
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return weights(run)


@pytest.mark.slow
def test_two_machines_end_with_the_weights_of_one_with_two_processes(nodes_data, one_machine, tmp_path):
    data_dir, recipe = nodes_data
    (code0, said0), (code1, said1) = two_nodes(recipe, data_dir, (tmp_path / "node0", tmp_path / "node1"))
    assert code0 == 0 and code1 == 0, said0[-3000:] + said1[-3000:]
    assert said0.count("trained 60 steps") == 1 and "trained" not in said1  # rank 0 reports, on node 0
    assert_same(weights(tmp_path / "node0"), one_machine)
    assert not (tmp_path / "node1").exists()  # node 1 needs no run directory of its own


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (torchrun starts each rank in a session of its own)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds a node's processes in /proc")
@pytest.mark.parametrize("killed", [0, 1], ids=["node-0-dies", "node-1-dies"])
def test_training_resumes_after_a_machine_dies(nodes_data, one_machine, tmp_path, killed):
    """Every process of one node killed at once (SIGKILL: the machine is gone) once step 20 is saved; the other
    node stops with one error line; both commands run again resume from rank 0's last checkpoint and end with
    the weights of the uninterrupted run."""
    data_dir, recipe = nodes_data
    runs = (tmp_path / "node0", tmp_path / "node1")
    port = free_port()
    procs = [start_node(recipe, data_dir, runs[r], r, port) for r in (0, 1)]
    saved = runs[0] / "checkpoints" / "step_0000020.pt"
    deadline = time.monotonic() + 240
    while not saved.exists() and time.monotonic() < deadline and procs[0].poll() is None:
        time.sleep(0.02)
    assert saved.exists(), procs[0].communicate()[1][-3000:]
    for pid in descendants(procs[killed].pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    survivor = procs[1 - killed]
    said = survivor.communicate(timeout=300)[1]
    procs[killed].communicate(timeout=60)
    assert procs[killed].returncode == -signal.SIGKILL
    error = one_error(subprocess.CompletedProcess([], survivor.returncode, "", said))
    assert f"rank {1 - killed} lost the other ranks at step" in error and "to resume from rank 0's last" in error
    stopped_at = weights(runs[0])["step"]
    assert 20 <= stopped_at < STEPS  # the kill came in the middle of the training

    (code0, said0), (code1, said1) = two_nodes(recipe, data_dir, runs)
    assert code0 == 0 and code1 == 0, said0[-3000:] + said1[-3000:]
    assert f"resuming {runs[0]} from step {stopped_at}" in said0
    assert_same(weights(runs[0]), one_machine)


@pytest.mark.slow
def test_the_sync_check_stops_every_rank_when_one_drifts(nodes_data, one_machine, tmp_path):
    """Node 1 started with another learning rate (a recipe edited on one machine): after the first update its
    weights differ; at the first check (step 10) both commands stop with the same one error line naming rank 1,
    nothing saved past step 10; the same commands with the right recipe resume and end as the reference."""
    data_dir, recipe = nodes_data
    runs = (tmp_path / "node0", tmp_path / "node1")
    ends = two_nodes(recipe, data_dir, runs, extra=((), ("--set", "train.lr=0.004")))
    errors = [one_error(subprocess.CompletedProcess([], code, "", said)) for code, said in ends]
    assert errors[0] == errors[1] == (
        "error: train.sync_check: at step 10 the weights of rank 1 differ from rank 0's: the machines no longer train "
        "the same model (another recipe, torch or hardware on one node?); step 10 was not saved; nothing was saved")
    assert not (runs[0] / "checkpoints" / "last.pt").exists()  # step 10's save came after its check

    (code0, said0), (code1, said1) = two_nodes(recipe, data_dir, runs)
    assert code0 == 0 and code1 == 0, said0[-3000:] + said1[-3000:]
    assert_same(weights(runs[0]), one_machine)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the ranks follow their launcher through prctl")
def test_ranks_whose_launcher_is_killed_save_the_step_and_stop_with_the_others(nodes_data, tmp_path):
    """Node 1's `mtkit train` itself killed outright (SIGKILL; its rank, in a session of its own, is not):
    Linux sends the orphaned rank SIGTERM, and the whole job saves the step it finished and stops, as for a
    Ctrl-C; no rank is left training."""
    data_dir, recipe = nodes_data
    runs = (tmp_path / "node0", tmp_path / "node1")
    port = free_port()
    procs = [start_node(recipe, data_dir, runs[r], r, port, "--set", "train.max_steps=100000") for r in (0, 1)]
    saved = runs[0] / "checkpoints" / "step_0000020.pt"
    deadline = time.monotonic() + 240
    while not saved.exists() and time.monotonic() < deadline and procs[0].poll() is None:
        time.sleep(0.02)
    assert saved.exists(), procs[0].communicate()[1][-3000:]
    ranks = descendants(procs[1].pid)[1:]
    assert ranks
    procs[1].kill()
    said = procs[0].communicate(timeout=300)[1]
    procs[1].communicate(timeout=60)
    assert procs[0].returncode == 128 + signal.SIGTERM, said[-3000:]
    errors = [line for line in said.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in said, said[-3000:]
    stopped = re.fullmatch(r"error: interrupted by a signal to another rank at step (\d+); saved (\S+); run the same "
                           r"command to resume", errors[0])
    assert stopped and weights(runs[0])["step"] == int(stopped[1]) >= 20, errors
    deadline = time.monotonic() + 30
    while any(map(alive, ranks)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(alive, ranks))


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, ended but not yet reaped by its new parent, does not)."""
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except OSError:
        return False


def test_a_taken_endpoint_port_is_one_error_line(nodes_data, tmp_path):
    data_dir, recipe = nodes_data
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_mtkit("train", str(recipe), "-d", str(data_dir), "-r", str(tmp_path / "run"), "--nnodes", "2",
                           "--node-rank", "0", "--rdzv-endpoint", f"localhost:{port}")
    error = one_error(result)
    assert error.startswith(f"error: the training's processes could not meet at localhost:{port} (node 0 of 2): ")
    assert "address already in use" in error
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_machine_with_other_prepared_data_is_refused(nodes_data, tmp_path):
    """Node 1's DATA prepared apart (another vocabulary size): its ids would mean other pieces. Both machines stop
    before the first update with one error line naming rank 1."""
    from mtkit.commands.prepare import prepare

    data_dir, recipe = nodes_data
    data = reverse_data_config(write_reverse_corpus(tmp_path / "text", n_train=600, n_valid=20), vocab_size=90)
    prepare(config_from_dict({"data": data}), tmp_path / "other", progress=False)
    port = free_port()
    procs = [start_node(recipe, data_dir, tmp_path / "node0", 0, port),
             start_node(recipe, tmp_path / "other", tmp_path / "node1", 1, port)]
    ends = [(p.communicate(timeout=300)[1], p) for p in procs]
    errors = [one_error(subprocess.CompletedProcess([], proc.returncode, "", said)) for said, proc in ends]
    # Each machine ends with one line; which of them reports the fingerprint first and which only sees the
    # other go (the rank that stops first) is a race between the two, so at least one line names it.
    named = [e for e in errors if "rank 1 would train on other prepared data than rank 0 (data fingerprint " in e]
    assert named, errors
    assert all(e.startswith((f"error: {data_dir}: ", f"error: {tmp_path / 'other'}: ")) for e in named), errors
    assert not (tmp_path / "node0" / "checkpoints" / "last.pt").exists()

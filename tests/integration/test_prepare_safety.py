"""``prepare`` never harms what it did not write, cleans up after dead runs, and reports damage in one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import TINY_MODEL, write_reverse_corpus
from inprocess import run_mtkit

from mtkit.commands.prepare import prepare
from mtkit.config import config_from_dict
from mtkit.errors import MtkitError

pytestmark = pytest.mark.slow  # real processes and training: the fast tier is pytest -m 'not slow'

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "MTKIT_DEBUG": ""}
SMALL = {"vocab_size": 60, "sample_size": 2000}


def config(folder: Path, n_train: int = 300, **spm):
    files = write_reverse_corpus(folder, n_train=n_train, n_valid=20)
    return config_from_dict({"data": {
        "train": {"src": str(files["train"][0]), "tgt": str(files["train"][1])},
        "valid": {"src": str(files["valid"][0]), "tgt": str(files["valid"][1])},
        "spm": {**SMALL, **spm}, "workers": 1,
    }})


def mtkit(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The CLI in this process: what the command does is the subject here, not the process."""
    return run_mtkit(*args, cwd=cwd)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


# ------------------------------------------------------------------ --force


def test_force_rebuilds_an_earlier_result_and_fills_an_empty_dir(tmp_path):
    cfg = config(tmp_path / "text")
    out = tmp_path / "out"
    out.mkdir()
    first = prepare(cfg, out, progress=False)  # an empty folder is fine
    inode = (out / "spm.model").stat().st_ino
    again = prepare(cfg, out, force=True, progress=False)
    assert (out / "spm.model").stat().st_ino != inode  # a new directory took its place
    assert again["splits"] == first["splits"]
    assert siblings(out) == []


@pytest.mark.parametrize("force", [False, True])
def test_user_files_in_a_prepared_dir_stop_a_rebuild(tmp_path, force):
    cfg = config(tmp_path / "text")
    out = tmp_path / "out"
    manifest = prepare(cfg, out, progress=False)
    (out / "notes.txt").write_text("keep me")
    (out / "run").mkdir()
    (out / "run" / "last.pt").write_bytes(b"weights")
    changed = config(tmp_path / "text", n_train=200) if not force else cfg  # changed inputs rebuild too
    with pytest.raises(MtkitError) as e:
        prepare(changed, out, force=force, progress=False)
    assert re.search(r"holds files mtkit did not write \(notes\.txt, run\); move them out", str(e.value))
    assert "--force" not in str(e.value)
    assert (out / "notes.txt").read_text() == "keep me" and (out / "run" / "last.pt").is_file()
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert siblings(out) == []


@pytest.mark.parametrize("manifest", [None, "{broken", '{"fingerprint": "x"}', "[1, 2]"])
def test_dir_without_an_mtkit_manifest_is_refused_even_with_force(tmp_path, manifest):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "train.src.bin").write_bytes(b"the user's own file with an mtkit-like name")
    if manifest is not None:
        (out / "manifest.json").write_text(manifest)
    with pytest.raises(MtkitError, match=r"mine: holds files mtkit did not write .*; choose another directory$") as e:
        prepare(config(tmp_path / "text"), out, force=True, progress=False)
    assert "--force" not in str(e.value)
    assert (out / "train.src.bin").read_bytes().startswith(b"the user's")
    assert siblings(out) == []


def test_current_directory_and_its_parents_are_never_replaced(tmp_path, monkeypatch):
    cfg = config(tmp_path / "text")
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    for out in (".", "..", str(tmp_path), "../b"):
        with pytest.raises(MtkitError, match="is the current directory or one of its parents"):
            prepare(cfg, Path(out), force=True, progress=False)
    assert work.is_dir() and (tmp_path / "text" / "train.src").is_file()


def test_out_dir_that_is_a_file(tmp_path):
    out = tmp_path / "out"
    out.write_text("a file of the user's")
    with pytest.raises(MtkitError, match=r"out: exists already and is not a directory; check it"):
        prepare(config(tmp_path / "text"), out, force=True, progress=False)
    assert out.read_text() == "a file of the user's"


# ---------------------------------------------------------- dead leftovers


def test_temporaries_of_dead_processes_are_removed_and_live_ones_kept(tmp_path):
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        out = tmp_path / "out"
        host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())  # as mtkit writes it
        dead_tmp = tmp_path / f".out.tmp-{finished.pid}@{host}-abc123"
        dead_old = tmp_path / f".out.old-{finished.pid}@{host}-def456"
        live_tmp = tmp_path / f".out.tmp-{sleeper.pid}@{host}-ghi789"
        elsewhere = tmp_path / f".out.tmp-{finished.pid}@not-{host}-jkl012"  # its PID means nothing here
        other = tmp_path / f".other.tmp-{finished.pid}@{host}-mno345"  # beside another output
        for path in (dead_tmp, dead_old / "dir", live_tmp, elsewhere, other):
            path.mkdir(parents=True)
            (path / "train.src.bin").write_bytes(b"\0" * 64)
        prepare(config(tmp_path / "text"), out, progress=False)
        assert siblings(out) == sorted([live_tmp.name, elsewhere.name])
        assert other.is_dir()
    finally:
        sleeper.kill()
        sleeper.wait()


# ----------------------------------------------------- workers die with us


def children(pid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def running(pid: int) -> bool:
    """True unless ``pid`` is gone or a zombie (a container's init may never reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
@pytest.mark.parametrize("phase, wanted", [("sentencepiece", 1), ("encoding", 2)])
def test_sigkilled_prepare_takes_its_children_along_and_its_leftovers_go_next_time(tmp_path, phase, wanted):
    # The first child is the SentencePiece trainer (sampling, then training); two at once are the
    # encoding pool. Killing at the first sight of the trainer also hits the race before its prctl.
    files = write_reverse_corpus(tmp_path / "big", n_train=200_000, n_valid=20)
    out = tmp_path / "out"
    parent = subprocess.Popen(
        [sys.executable, "-m", "mtkit", "prepare", "--src", str(files["train"][0]), "--tgt", str(files["train"][1]),
         "-o", str(out), "--set", "data.workers=2", "--set", "data.spm.vocab_size=60",
         "--set", "data.spm.sample_size=2000"],
        env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        workers: set[int] = set()
        while len(workers) < wanted and parent.poll() is None:
            workers = children(parent.pid)
            time.sleep(0.005)
        assert len(workers) >= wanted, f"no {phase} child showed up: {parent.stderr.read().decode()}"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    deadline = time.monotonic() + 120  # a bound for a busy machine, not a measurement
    while any(map(running, workers)) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [pid for pid in workers if running(pid)]
    for pid in survivors:  # don't leave them to the machine when the assertion fails
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"{phase} children outlived their parent"
    assert any(name.startswith(f".out.tmp-{parent.pid}@") for name in siblings(out))

    prepare(config(tmp_path / "small"), out, progress=False)  # the next run removes what the dead one left
    assert siblings(out) == []


# --------------------------------------------------- one-line input errors


def test_a_gz_file_that_is_not_gzip_is_a_one_line_error(tmp_path):
    files = write_reverse_corpus(tmp_path, n_train=50)
    fake = tmp_path / "train.en.gz"
    shutil.copy(files["train"][0], fake)
    message = one_line_error(mtkit("prepare", "--src", str(fake), "--tgt", str(files["train"][1]),
                                   "-o", str(tmp_path / "out")))
    assert message.endswith("train.en.gz: not a gzip file (its name ends in .gz); decompress or rename it")
    assert not (tmp_path / "out").exists()


def test_a_truncated_store_stops_training_with_one_line(tmp_path, reverse_data):
    data_dir = tmp_path / "data"
    shutil.copytree(reverse_data[0], data_dir)
    with open(data_dir / "train.src.bin", "r+b") as f:
        f.truncate(1000)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"data": reverse_data[1], "model": TINY_MODEL, "train": {"max_steps": 2}}))
    message = one_line_error(mtkit("train", str(recipe), "--data", str(data_dir), "--run-dir", str(tmp_path / "run")))
    assert re.search(r"train\.src\.bin: 1000 bytes, the index expects \d+ \(truncated or damaged; run mtkit prepare"
                     r" again\)$", message)


def test_a_vocabulary_smaller_than_asked_is_reported(tmp_path, capsys, logged):
    manifest = prepare(config(tmp_path / "text", vocab_size=8000), tmp_path / "out", progress=False)
    size = manifest["vocab"]["src_size"]
    assert size < 8000
    assert (f"warning: data.spm.vocab_size 8000 is more than this training sample supports;"
            f" the vocabulary has {size} pieces") in capsys.readouterr().err.splitlines()
    prepare(config(tmp_path / "text2", vocab_size=60, joint=False), tmp_path / "sep", progress=False)
    assert "warning:" not in capsys.readouterr().err

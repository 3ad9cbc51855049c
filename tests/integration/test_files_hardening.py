"""Files mtkit writes and reads, through the real CLI: `average` refuses checkpoints of different
vocabularies, `translate -o` cleans up its temporary after SIGTERM (at once) and SIGKILL (at the next
start), and write errors name the user's path, not the temporary."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY_MODEL, one_error, reverse_data_config, write_reverse_corpus
from inprocess import run_mtkit

pytestmark = pytest.mark.slow  # real processes and training: the fast tier is pytest -m 'not slow'

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "MTKIT_DEBUG": ""}
MTKIT = [sys.executable, "-m", "mtkit"]


def mtkit(*args, **kwargs) -> subprocess.CompletedProcess:
    """The CLI in this process (what it writes and says is the subject), or with ``kwargs`` (a ``preexec_fn``
    setting a limit) a real process."""
    if not kwargs:
        return run_mtkit(*args)
    return subprocess.run([*MTKIT, *map(str, args)], capture_output=True, text=True, env=ENV, timeout=300,
                          stdin=subprocess.DEVNULL, check=False, **kwargs)


# ------------------------------------------------------------------ average


def _prepare(root: Path, files: dict, **spm) -> Path:
    from mtkit.commands.prepare import prepare
    from mtkit.config import config_from_dict

    data = reverse_data_config(files)
    data["spm"].update(spm)
    prepare(config_from_dict({"data": data}), root, progress=False)
    return root


def test_average_refuses_checkpoints_of_different_vocabularies(reverse_data, tmp_path):
    """Two SentencePiece models of one size once averaged silently (exit 0: the ids mean different
    pieces), and of different sizes ended in a traceback; both are one-line errors, as for an ensemble."""
    from mtkit.checkpoints.io import load_checkpoint, save_checkpoint, step_checkpoints
    from mtkit.config import config_from_dict
    from mtkit.training.trainer import train

    data_dir, data = reverse_data
    run = tmp_path / "run"
    train(config_from_dict({"data": data, "model": TINY_MODEL,
                            "train": {"max_steps": 2, "max_tokens": 300, "valid_every": 0, "save_every": 1}}),
          data_dir, run, progress=False)
    first, second = step_checkpoints(run)
    files = write_reverse_corpus(tmp_path / "text", n_train=400, n_valid=10)
    # Same words, same size, another model: case-folding normalization (the pieces are lowercase anyway).
    folded = _prepare(tmp_path / "folded", files, lowercase=True)
    other = load_checkpoint(second)
    assert (folded / "spm.model").read_bytes() != other["vocab"]["src"]
    other["vocab"] = {**other["vocab"], "src": (folded / "spm.model").read_bytes()}
    mixed = tmp_path / "mixed"
    (mixed / "checkpoints").mkdir(parents=True)
    (mixed / "checkpoints" / first.name).write_bytes(first.read_bytes())
    save_checkpoint(other, mixed / "checkpoints" / second.name)
    error = one_error(mtkit("average", mixed, "--last", "2"))
    assert f"{mixed / 'checkpoints' / second.name}: its vocabulary" in error and str(first.name) in error
    assert not (mixed / "checkpoints" / "averaged.pt").exists()

    # A run on a smaller vocabulary: other embedding shapes.
    small = _prepare(tmp_path / "small", files, vocab_size=60)
    small_run = tmp_path / "small-run"
    train(config_from_dict({"data": reverse_data_config(files, 60), "model": TINY_MODEL,
                            "train": {"max_steps": 1, "max_tokens": 300, "valid_every": 0}}),
          small, small_run, progress=False)
    (mixed / "checkpoints" / second.name).write_bytes(step_checkpoints(small_run)[-1].read_bytes())
    error = one_error(mtkit("average", mixed, "--last", "2"))
    assert "its vocabulary" in error
    assert not (mixed / "checkpoints" / "averaged.pt").exists()

    assert mtkit("average", run, "--last", "2").returncode == 0  # one run's checkpoints still average


def test_average_refuses_parameters_of_other_shapes(reverse_run, tmp_path):
    from mtkit.checkpoints.io import load_checkpoint, save_checkpoint
    from mtkit.errors import MtkitError
    from mtkit.training.average import average_checkpoints

    ckpt = load_checkpoint(reverse_run / "checkpoints" / "last.pt")
    a = save_checkpoint(ckpt, tmp_path / "a.pt")
    name = next(k for k, v in ckpt["model"].items() if v.dim() == 2 and "embed" not in k)
    ckpt["model"][name] = torch.zeros(3, 5)
    b = save_checkpoint(ckpt, tmp_path / "b.pt")
    with pytest.raises(MtkitError, match=rf"b.pt: its {name} has shape \(3, 5\), .*a.pt's \(\d+, \d+\); "
                                         "cannot average$"):
        average_checkpoints([a, b], tmp_path / "avg.pt")


# ------------------------------------------------------------ translate -o


def _temporaries(folder: Path, name: str) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.startswith(f".{name}.") and p.name.endswith(".tmp"))


def _translating_into(run: Path, out: Path) -> subprocess.Popen:
    """A `translate -o out` that has opened its temporary and waits for more input (a pipe kept open)."""
    proc = subprocess.Popen([*MTKIT, "translate", "-m", str(run), "-o", str(out)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    proc.stdin.write(b"alpha bravo\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 240  # generous: the model loads first; not a timing assertion
    while not _temporaries(out.parent, out.name):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no temporary appeared: {proc.communicate()[1].decode()}")
        time.sleep(0.05)
    return proc


def test_translate_output_temporary_is_removed_on_sigterm(reverse_run, tmp_path):
    out = tmp_path / "out.txt"
    proc = _translating_into(reverse_run, out)
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, err.decode()
    assert err.decode().splitlines()[-1] == f"error: interrupted (SIGTERM); {out} is left as it was"
    assert "Traceback" not in err.decode()
    assert _temporaries(tmp_path, "out.txt") == [] and not out.exists()


def test_translate_removes_a_killed_runs_temporary_at_the_next_start(reverse_run, tmp_path):
    out = tmp_path / "out.txt"
    proc = _translating_into(reverse_run, out)
    (left,) = _temporaries(tmp_path, "out.txt")
    proc.kill()  # SIGKILL: nothing runs, the temporary stays
    proc.communicate(timeout=120)
    assert left.exists()
    unowned = tmp_path / ".out.txt.k3y9_abc.tmp"  # someone else's (an older mtkit's): not ours to remove
    unowned.write_text("x")
    (tmp_path / "in.txt").write_text("alpha bravo\ncharlie\n")
    result = mtkit("translate", "-m", reverse_run, tmp_path / "in.txt", "-o", out)
    assert result.returncode == 0, result.stderr
    assert f"{left}: removed; left behind by process {proc.pid}, which no longer runs" in result.stderr
    assert _temporaries(tmp_path, "out.txt") == [unowned]
    assert len(out.read_text().splitlines()) == 2


def test_translate_write_errors_name_the_output_not_the_temporary(reverse_run, tmp_path):
    """`translate -o /proc/x.txt` once said `/proc/.x.txt.liokb_dj.tmp`; a write that fails (here a file
    size limit, EFBIG, as a full disk's ENOSPC: an error of the open file, with no name) named nothing."""
    import resource

    error = one_error(mtkit("translate", "-m", reverse_run, tmp_path / "missing.txt", "-o", "/proc/x.txt"))
    assert "no such file" in error  # the input is checked first
    (tmp_path / "in.txt").write_text("".join("alpha bravo charlie delta\n" for _ in range(200)))
    error = one_error(mtkit("translate", "-m", reverse_run, tmp_path / "in.txt", "-o", "/proc/x.txt"))
    assert error.startswith("error: /proc/x.txt: ") and ".tmp" not in error

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))

    out = tmp_path / "out.txt"
    error = one_error(mtkit("translate", "-m", reverse_run, tmp_path / "in.txt", "-o", out, preexec_fn=limit))
    assert error == f"error: {out}: File too large", error
    assert _temporaries(tmp_path, "out.txt") == [] and not out.exists()

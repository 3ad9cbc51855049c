"""``mtkit translate`` as a Unix citizen, through the real CLI: pipes, ``| head``, n-best lists, and
one-line errors naming the flag before any work."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading

import pytest
import torch
from conftest import WORDS
from inprocess import run_mtkit

pytestmark = pytest.mark.slow  # real processes and training: the fast tier is pytest -m 'not slow'

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "MTKIT_DEBUG": ""}
MTKIT = [sys.executable, "-m", "mtkit"]


@pytest.fixture(scope="module")
def run(reverse_run):
    """A tiny model trained briefly on the reverse task (conftest's, shared with other CLI tests)."""
    return reverse_run


def mtkit(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    """The CLI in this process, for the tests of what it writes (the pipes, ``| head`` and ``<(…)`` inputs are a
    real process's)."""
    return run_mtkit(*args, stdin=stdin)


def test_a_pipe_gets_each_answer_before_it_writes_the_next_line(run, tmp_path):
    """A program that writes one line and waits for its translation (no 1,000-line buffer)."""
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen([*MTKIT, "translate", "-m", str(run)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, env=ENV, text=True, bufsize=1)
    answers: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [answers.put(line) for line in proc.stdout], daemon=True).start()
    try:
        for line in ("alpha bravo charlie", "delta echo"):
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            answer = answers.get(timeout=120)  # generous: the model loads first; not a timing assertion
            assert answer.endswith("\n") and set(answer.split()) <= set(WORDS)
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    assert answers.empty()
    assert re.search(r"^loaded .*checkpoints/\w+\.pt( \(step \d+\))?$", (tmp_path / "stderr").read_text(), re.M)


def test_head_closing_the_pipe_exits_0_quietly(run, tmp_path):
    # Enough output to fill the pipe, so that writes go on after `head` has left.
    lines = [" ".join(WORDS[(i + k) % len(WORDS)] for k in range(7)) for i in range(8000)]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    script = (f"{' '.join(MTKIT)} translate -m {run} --beam 1 {tmp_path / 'in.txt'} 2>{tmp_path / 'err'} | head -1;"
              " exit ${PIPESTATUS[0]}")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=ENV, timeout=300)
    err = (tmp_path / "err").read_text()
    assert done.returncode == 0, err
    assert len(done.stdout.splitlines()) == 1
    assert "Traceback" not in err and "Exception" not in err and "error" not in err


def test_nbest_lists_hypotheses_and_a_short_limit_warns_once(run):
    result = mtkit("translate", "-m", run, "--beam", "3", "--nbest", "3", stdin="alpha bravo\ncharlie delta echo\n")
    assert result.returncode == 0, result.stderr
    rows = [line.split(" ||| ") for line in result.stdout.splitlines()]
    assert [r[0] for r in rows] == ["0", "0", "0", "1", "1", "1"] and all(len(r) == 3 for r in rows)

    result = mtkit("translate", "-m", run, "--max-len-a", "0", "--max-len-b", "-1", stdin="alpha\nbravo\ncharlie\n")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 3
    assert result.stderr.count("warning:") == 1 and "--max-len-b" in result.stderr


ERRORS = [
    (["--sampling", "--top-p", "2"], "--top-p: must be in (0, 1], got 2.0"),
    (["--sampling", "--temperature", "0"], "--temperature: must be > 0"),
    (["--sampling", "--top-k", "-5"], "--top-k: must be >= 0"),
    (["--top-k", "5"], "--top-k needs --sampling"),
    (["--buffer-size", "0"], "--buffer-size: must be >= 1, got 0"),
    (["--batch-tokens", "0"], "--batch-tokens: must be >= 1"),
    (["--nbest", "3"], "--nbest: must be between 1 and decode.beam (2), got 3"),  # the checkpoint's beam
    (["--beam", "2", "--nbest", "3"], "--nbest: must be between 1 and --beam (2), got 3"),
    (["--attention-png", "{tmp}/a.png", "--attention-layer", "99"], "--attention-layer 99"),
    (["-o", "{tmp}"], "--output"),
    pytest.param(["--device", "cuda"], "--device cuda",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")),
]


@pytest.mark.parametrize("args,expected", ERRORS)
def test_a_bad_flag_is_one_line_naming_it_before_any_translation(run, tmp_path, args, expected):
    result = mtkit("translate", "-m", run, *[a.format(tmp=tmp_path) for a in args], stdin="alpha bravo\n")
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.stderr
    assert not (tmp_path / "a.png").exists()


def test_a_pipe_named_as_an_input_is_read_as_standard_input_is(run, tmp_path):
    """``translate -m RUN <(zcat corpus.gz)`` and ``score --src <(…) --tgt <(…)``: a pipe named as an input is
    the user's text read once, front to back, as standard input is (only files from elsewhere, read whole or
    twice, must be regular files)."""
    (tmp_path / "in.txt").write_text("alpha bravo\ncharlie delta echo\n")
    (tmp_path / "out.txt").write_text("bravo alpha\necho delta charlie\n")
    base = f"{' '.join(MTKIT)} {{}} 2>{tmp_path / 'err'}"
    for command in (f"translate -m {run} --beam 1 {{}}", f"score -m {run} --src {{}} --tgt {{}}"):
        files = command.format(*[tmp_path / "in.txt", tmp_path / "out.txt"][: command.count("{}")])
        pipes = command.format(*[f"<(cat {tmp_path / 'in.txt'})", f"<(cat {tmp_path / 'out.txt'})"][
            : command.count("{}")])
        want = mtkit(*files.split())  # the same command on the files: what the pipes must give
        got = subprocess.run(["bash", "-c", base.format(pipes)], capture_output=True, text=True, env=ENV, timeout=300)
        assert want.returncode == 0 and len(want.stdout.splitlines()) == 2, want.stderr
        assert got.returncode == 0 and got.stdout == want.stdout, (tmp_path / "err").read_text()

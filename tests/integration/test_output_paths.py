"""Output paths that are not regular files, through the real CLI: a character device or a FIFO is written
through (never replaced by a regular file: as root, `translate -o /dev/null` once did that to /dev/null), a
full one is one error line, a symbolic link stays a link and its target gets the output, a block device or
a socket is refused, and `prepare --report` never writes over the prepared folder.

Every device here is this test's own node in tmp_path (os.mknod): a failure must never touch the real
/dev/null or /dev/full."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import one_error, write_reverse_corpus, write_tiny_checkpoint
from inprocess import run_mtkit

pytestmark = pytest.mark.slow  # real processes: the fast tier is pytest -m 'not slow'

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "MTKIT_DEBUG": ""}
NULL, FULL = os.makedev(1, 3), os.makedev(1, 7)  # Linux's /dev/null and /dev/full


def mtkit(*args, **kwargs) -> subprocess.CompletedProcess:
    """The CLI in this process (what it writes and says is the subject), or with ``kwargs`` (a ``preexec_fn``
    setting a limit) a real process."""
    if not kwargs:
        return run_mtkit(*args)
    return subprocess.run([sys.executable, "-m", "mtkit", *map(str, args)], capture_output=True, text=True, env=ENV,
                          timeout=300, stdin=subprocess.DEVNULL, check=False, **kwargs)


def device(path: Path, number: int) -> Path:
    """A character device node of our own at ``path`` (skips where this process may not make one)."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, number)
    except (PermissionError, AttributeError) as e:  # not root, a container without CAP_MKNOD, no mknod
        pytest.skip(f"cannot make a device node in tmp_path ({e}); needs root with CAP_MKNOD")
    try:
        with open(path, "wb") as f:  # a node on a folder mounted nodev cannot be opened
            f.write(b"")
    except OSError as e:
        os.unlink(path)
        pytest.skip(f"cannot open a device node in tmp_path ({e}): tmp_path is on a nodev mount")
    return path


def is_device(path: Path) -> bool:
    return stat.S_ISCHR(os.lstat(path).st_mode)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("model") / "model.pt")


@pytest.fixture
def text(tmp_path) -> Path:
    path = tmp_path / "in.txt"
    path.write_text("one two three\nfour five\n")
    return path


def test_translate_writes_through_a_character_device(checkpoint, text, tmp_path):
    """`translate -o /dev/null` (as root) renamed a regular file onto /dev/null; so did --alignments-out."""
    null, null2 = device(tmp_path / "null", NULL), device(tmp_path / "null2", NULL)
    result = mtkit("translate", "-m", checkpoint, text, "-o", null, "--alignments-out", null2)
    assert result.returncode == 0, result.stderr
    assert is_device(null) and is_device(null2)
    assert leftovers(tmp_path) == []


def test_alignments_out_onto_a_full_device_is_one_error(checkpoint, text, tmp_path):
    """/dev/full became a regular file (twice, on the machine); its ENOSPC is now the command's one error."""
    full = device(tmp_path / "full", FULL)
    out = tmp_path / "out.txt"
    error = one_error(mtkit("translate", "-m", checkpoint, text, "-o", out, "--alignments-out", full))
    assert error == f"error: {full}: No space left on device"
    assert is_device(full)
    assert not out.exists() and leftovers(tmp_path) == []  # -o's temporary is gone, nothing half-written


def test_average_writes_through_a_device_and_fails_in_one_line_on_a_full_one(checkpoint, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step_1.pt").write_bytes(checkpoint.read_bytes())
    null = device(tmp_path / "null", NULL)
    result = mtkit("average", run, "--last", "1", "-o", null)
    assert result.returncode == 0, result.stderr
    assert is_device(null)
    full = device(tmp_path / "full", FULL)
    error = one_error(mtkit("average", run, "--last", "1", "-o", full))
    assert error.startswith(f"error: {full}: ") and "space" in error, error
    assert is_device(full) and leftovers(tmp_path) == []


def test_outputs_through_a_symbolic_link_keep_the_link(checkpoint, text, tmp_path):
    """The rename replaced a link with a regular file; now the temporary is made beside the target, renamed
    onto it, and the link stays. A dangling link's target is created (as `sort -o` and the shell's `>`)."""
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "out.txt"
    target.write_text("old\n")
    link = tmp_path / "out.txt"
    link.symlink_to(Path("real") / "out.txt")  # relative: resolved against the link's folder
    aligned = tmp_path / "real" / "aligned.txt"  # not there yet: a dangling link
    dangling = tmp_path / "aligned.txt"
    dangling.symlink_to(aligned)
    result = mtkit("translate", "-m", checkpoint, text, "-o", link, "--alignments-out", dangling)
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and os.readlink(link) == str(Path("real") / "out.txt")
    assert dangling.is_symlink() and os.readlink(dangling) == str(aligned)
    assert len(target.read_text().splitlines()) == 2 and target.read_text() != "old\n"
    assert len(aligned.read_text().splitlines()) == 2
    assert leftovers(tmp_path) == [] and leftovers(tmp_path / "real") == []

    nowhere = tmp_path / "nowhere.txt"
    nowhere.symlink_to(tmp_path / "missing" / "out.txt")
    error = one_error(mtkit("translate", "-m", checkpoint, text, "-o", nowhere))
    assert error == f"error: --output {nowhere}: a symbolic link to {tmp_path / 'missing' / 'out.txt'}, whose " \
                    "folder does not exist"
    assert not (tmp_path / "missing").exists()


def test_a_socket_output_is_refused_in_one_line(checkpoint, text, tmp_path):
    sock = socket.socket(socket.AF_UNIX)
    path = tmp_path / "sock"
    sock.bind(str(path))
    try:
        error = one_error(mtkit("translate", "-m", checkpoint, text, "-o", path))
    finally:
        sock.close()
    assert error == f"error: --output {path}: is a socket; mtkit writes only files, character devices and FIFOs"
    assert stat.S_ISSOCK(os.lstat(path).st_mode)


def test_a_fifo_output_is_written_through(checkpoint, text, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = mtkit("translate", "-m", checkpoint, text, "-o", fifo)
    reader.join(timeout=60)
    assert result.returncode == 0, result.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and len(got) == 1 and len(got[0].splitlines()) == 2


# ------------------------------------------------------------------ prepare --report


def test_prepare_report_never_writes_over_the_prepared_folder(tmp_path):
    """`prepare --report OUT/manifest.json` replaced the folder's own manifest with the report."""
    files = write_reverse_corpus(tmp_path / "text", n_train=300, n_valid=20)
    out = tmp_path / "out"
    args = ["prepare", "--src", files["train"][0], "--tgt", files["train"][1], "-o", out,
            "--set", "data.spm.vocab_size=60", "--set", "data.workers=1"]
    assert mtkit(*args).returncode == 0
    manifest = (out / "manifest.json").read_bytes()
    error = one_error(mtkit(*args, "--report", out / "manifest.json"))
    assert error == (f"error: --report {out / 'manifest.json'}: inside the prepared folder {out}, which holds "
                     "prepare's files alone; write the report elsewhere")
    link = tmp_path / "report.json"
    link.symlink_to(out / "manifest.json")  # a link into the folder is the same
    assert "inside the prepared folder" in one_error(mtkit(*args, "--report", link))
    assert "inside the prepared folder" in one_error(mtkit(*args, "--report", out / "clean.md"))
    assert (out / "manifest.json").read_bytes() == manifest and not (out / "clean.md").exists()

    null = device(tmp_path / "null", NULL)  # the prepared data is reused; the report goes through the device
    result = mtkit(*args, "--report", null)
    assert result.returncode == 0, result.stderr
    assert is_device(null) and (out / "manifest.json").read_bytes() == manifest


def test_prepare_into_a_loop_of_links_is_one_error(tmp_path):
    """`prepare -o LOOP/out` where LOOP is a link to itself: Python's resolve() raised a traceback."""
    files = write_reverse_corpus(tmp_path / "text", n_train=50, n_valid=5)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    error = one_error(mtkit("prepare", "--src", files["train"][0], "--tgt", files["train"][1], "-o", loop / "out"))
    assert error.startswith("error: ") and "symbolic links" in error

"""``mtkit shortlist`` and ``translate --shortlist`` end to end on the shared Multi30k model (skipped without it)."""

from __future__ import annotations

import shutil
import stat

import pytest
from conftest import MODELS, MULTI30K
from inprocess import run_mtkit

pytestmark = pytest.mark.slow

MODEL = MODELS / "multi30k-en-de"
LINES = 60


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A writable copy of the shared model with its shortlist built from the Multi30k training pairs."""
    if not (MODEL / "checkpoints").is_dir() or not (MULTI30K / "train.en").is_file():
        pytest.skip(f"the Multi30k model is not at {MODEL} (set MTKIT_MODELS to the folder holding multi30k-en-de)")
    copy = tmp_path_factory.mktemp("shortlist") / "run"
    shutil.copytree(MODEL, copy)
    for path in [copy, *copy.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    done = run_mtkit("shortlist", copy, "--source", MULTI30K / "train.en", "--target", MULTI30K / "train.de")
    assert done.returncode == 0, done.stderr
    assert "shortlist.txt" in done.stderr and "source pieces" in done.stderr
    return copy


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / "test.en"
    path.write_text("\n".join((MULTI30K / "test_2016_flickr.en").read_text("utf-8").splitlines()[:LINES]) + "\n")
    return path


def test_the_shortlist_is_ctranslate2s_map_of_the_models_pieces(run):
    lines = (run / "shortlist.txt").read_text("utf-8").splitlines()
    assert lines[0].startswith("\t") and len(lines[0].split()) == 256  # the always-candidates
    assert all(line.count("\t") == 1 and line.split("\t")[0] for line in lines[1:])


def test_translate_shortlist_keeps_most_lines_and_leaves_the_default_untouched(run, source):
    full = run_mtkit("translate", "-m", run, "--threads", "1", source)
    short = run_mtkit("translate", "-m", run, "--threads", "1", "--shortlist", source)
    original = run_mtkit("translate", "-m", MODEL, "--threads", "1", source)
    assert full.returncode == short.returncode == original.returncode == 0, short.stderr
    assert full.stdout == original.stdout  # a shortlist in the run changes nothing without --shortlist
    pairs = list(zip(full.stdout.splitlines(), short.stdout.splitlines(), strict=True))
    assert len(pairs) == LINES
    assert sum(a == b for a, b in pairs) >= 0.6 * LINES


def test_shortlist_without_a_file_is_one_line_naming_the_command(source):
    if not (MODEL / "checkpoints").is_dir():
        pytest.skip("no Multi30k model")
    done = run_mtkit("translate", "-m", MODEL, "--shortlist", source)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: --shortlist: the run has no shortlist.txt; build it with: mtkit shortlist RUN"]


def test_ctranslate2_exports_the_map_and_uses_it(run, source, tmp_path):
    pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2"
    done = run_mtkit("export", "ctranslate2", run, out)
    assert done.returncode == 0, done.stderr
    assert (out / "vmap.txt").read_bytes() == (run / "shortlist.txt").read_bytes()
    done = run_mtkit("translate", "-m", run, "--engine", "ctranslate2", "--shortlist", "--threads", "1", source)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == LINES

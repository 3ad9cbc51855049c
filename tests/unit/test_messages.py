"""Messages that count things say "1 line" and "2 lines" (:func:`mtkit.errors.counted`), never "1 lines"."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import write_tiny_checkpoint

from mtkit.errors import MtkitError, counted


def test_counted_is_singular_for_one_only():
    assert [counted(n, "line") for n in (0, 1, 2)] == ["0 lines", "1 line", "2 lines"]
    assert (counted(1, "entry", "entries"), counted(3, "entry", "entries")) == ("1 entry", "3 entries")
    assert counted(12_000, "pair", spec=",") == "12,000 pairs"


def test_messages_that_count_one_thing_say_it_in_the_singular(tmp_path):
    from mtkit.data.report import render_markdown, render_text
    from mtkit.data.sources import iter_pairs
    from mtkit.metrics.scores import score

    with pytest.raises(MtkitError, match=r"^reference 1 has 1 line but the hypotheses have 2$"):
        score(["a", "b"], [["a"]], ["bleu"])
    section = {"corpus": "train", "read": 1, "kept": 1, "rules": [{"rule": "empty", "dropped": 0, "share": 0.0,
                                                                    "examples": []}]}
    assert render_text([section]).splitlines()[0] == "train: kept 1 of 1 pair"
    assert "## train: kept 1 of 1 pair\n" in render_markdown([section])
    (tmp_path / "a.en").write_text("one\n")
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    from mtkit.config import SourceConfig

    with pytest.raises(MtkitError, match=r"a\.en has 1 line but \S+a\.de has 2"):
        list(iter_pairs(SourceConfig(src=str(tmp_path / "a.en"), tgt=str(tmp_path / "a.de")), "en", "de"))


@pytest.mark.slow  # a real mtkit process
def test_translate_says_it_translated_1_line(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "m.pt")
    done = subprocess.run([sys.executable, "-m", "mtkit", "translate", "-m", str(ckpt), "--device", "cpu",
                           "--threads", "1"], input="one two\n", capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "MTKIT_DEBUG": ""})
    assert done.returncode == 0, done.stderr
    assert re.search(r"^translated 1 line in \S+ s: ", done.stderr, re.M), done.stderr

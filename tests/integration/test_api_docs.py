"""docs/api.md runs as written: its Python blocks, in order and in one namespace, on the Multi30k model
(``runs/en-de`` there is ``../shared/models/multi30k-en-de``), each ``# prints: X`` comment checked
against what the block printed."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
from conftest import MODELS

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
MODEL = MODELS / "multi30k-en-de"


def test_the_api_page_runs_as_written(tmp_path, monkeypatch):
    if not (MODEL / "checkpoints").is_dir():
        pytest.skip(f"the Multi30k model is not at {MODEL} (set MTKIT_MODELS to the folder holding multi30k-en-de)")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "en-de").symlink_to(MODEL)
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 5
    namespace: dict = {}
    checked = 0
    for number, block in enumerate(blocks, 1):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, f"{DOC.name} block {number}", "exec"), namespace)  # noqa: S102 (our own docs)
        printed = out.getvalue()
        assert printed.strip(), f"block {number} printed nothing"
        for expected in re.findall(r"# prints: (.+)$", block, re.M):
            assert expected.strip() in printed.splitlines(), (number, expected, printed)
            checked += 1
    assert checked == 11  # every "# prints:" of the page

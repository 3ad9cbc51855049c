"""``mtkit score`` through the real CLI: forced-decoding log-probabilities that equal incremental
decoding, one line per input line, both formats, and one-line errors."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import incremental_logprob
from inprocess import run_mtkit

from mtkit.checkpoints.io import load_model

pytestmark = pytest.mark.slow  # real processes and a trained model: the fast tier is pytest -m 'not slow'


def mtkit(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    """The CLI in this process: what the command does is the subject here, not the process."""
    return run_mtkit(*args, stdin=stdin)


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def test_set(reverse_data) -> tuple[list[str], list[str]]:
    _, data = reverse_data
    src = Path(data["test"]["src"]).read_text().splitlines()
    tgt = Path(data["test"]["tgt"]).read_text().splitlines()
    return src, tgt


def score_json(run, src: Path, tgt: Path, *extra) -> list[dict]:
    result = mtkit("score", "-m", run, "--src", src, "--tgt", tgt, "--format", "json", "--device", "cpu", *extra)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_scores_equal_incremental_decoding_and_ignore_padding(reverse_run, test_set, tmp_path):
    src, tgt = test_set
    pairs = [(src[i], tgt[i]) for i in range(8)] + [("", ""), ("alpha bravo", "")] + [(src[8], tgt[9])]
    src_file, tgt_file = write(tmp_path / "s", [s for s, _ in pairs]), write(tmp_path / "t", [t for _, t in pairs])
    found = score_json(reverse_run, src_file, tgt_file)
    assert [d["line"] for d in found] == list(range(1, len(pairs) + 1))
    loaded = load_model(reverse_run)
    for d, (s, t) in zip(found, pairs):
        s_ids, t_ids = loaded.vocab.encode_src(s), loaded.vocab.encode_tgt(t)
        assert d["tokens"] == len(t_ids) + 1
        assert d["logprob"] == pytest.approx(incremental_logprob(loaded.model, s_ids, t_ids), abs=1e-4)
        assert d["mean"] == pytest.approx(d["logprob"] / d["tokens"], abs=1e-6)
    # The shortest pair alone (through stdin) scores what it scored padded among longer ones.
    shortest = min(range(8), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
    result = mtkit("score", "-m", reverse_run, "--src", "-", "--tgt", write(tmp_path / "t1", [pairs[shortest][1]]),
                   "--format", "json", stdin=pairs[shortest][0] + "\n")
    assert result.returncode == 0, result.stderr
    [alone] = [json.loads(line) for line in result.stdout.splitlines()]
    assert alone["logprob"] == pytest.approx(found[shortest]["logprob"], abs=1e-4)


def test_a_beam_search_hypothesis_scores_what_search_gave_it(reverse_run, test_set, tmp_path):
    src_file = write(tmp_path / "src", test_set[0][:6])
    found = mtkit("translate", "-m", reverse_run, "--beam", "2", "--alpha", "0", "--format", "scores", src_file)
    assert found.returncode == 0, found.stderr
    search_scores, hyps = zip(*(line.split("\t") for line in found.stdout.splitlines()))
    scored = score_json(reverse_run, src_file, write(tmp_path / "hyp", list(hyps)))
    assert [d["logprob"] for d in scored] == pytest.approx([float(x) for x in search_scores], abs=2e-4)  # 4 decimals


def test_references_outscore_a_shuffled_pairing(reverse_run, test_set, tmp_path):
    src, tgt = test_set
    src_file = write(tmp_path / "src", src)
    half = len(tgt) // 2  # a rotation: no sentence keeps its reference
    reference = score_json(reverse_run, src_file, write(tmp_path / "ref", tgt))
    shuffled = score_json(reverse_run, src_file, write(tmp_path / "shuf", tgt[half:] + tgt[:half]))
    assert len(reference) == len(shuffled) == len(src)
    assert sum(d["logprob"] for d in reference) > sum(d["logprob"] for d in shuffled)


def test_text_format_one_line_per_input_line_from_stdin(reverse_run, tmp_path):
    src = ["alpha bravo charlie", "", "delta echo", "   ", "kilo lima"]
    tgt = ["charlie bravo alpha", "", "echo delta", "", "lima kilo"]
    result = mtkit("score", "-m", reverse_run, "--src", write(tmp_path / "src", src), "--tgt", "-",
                   stdin="\n".join(tgt) + "\n")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == len(src)
    for line in lines:
        total, mean, tokens = line.split("\t")
        assert len(total.split(".")[1]) == len(mean.split(".")[1]) == 4
        assert float(total) < 0 and int(tokens) >= 1
        assert float(mean) == pytest.approx(float(total) / int(tokens), abs=1e-3)
    assert lines[1].split("\t")[2] == lines[3].split("\t")[2] == "1"  # an empty target scores EOS alone
    assert "loaded " in result.stderr and "it/s" not in result.stderr and "\r" not in result.stderr  # piped: no bar


def test_line_counts_differ_through_stdin_is_one_error_line(reverse_run, tmp_path):
    src = write(tmp_path / "src", ["alpha bravo", "charlie delta", "echo foxtrot"])
    result = mtkit("score", "-m", reverse_run, "--src", src, "--tgt", "-", stdin="bravo alpha\n")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: line counts differ: --src {src} has 3 lines, --tgt <stdin> has 1"]

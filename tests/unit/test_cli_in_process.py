"""The CLI end to end in this process (mtkit.cli.main with its arguments): the fast tier's coverage of the
command line, whose tests in a process of their own (tests/integration, marked slow) also check what
belongs to the process (imports, signals, pipes, exit at a closed stream)."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import yaml
from conftest import write_tiny_checkpoint

from mtkit.cli import main

LINES = ["two hundred five", "", "seven thousand one hundred and three", "   ", "nine"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model.pt", decode={"beam": 2, "max_len_b": 6})


@pytest.fixture
def mtkit(monkeypatch, capsys):
    """``mtkit(*args)`` -> (exit code, stdout, stderr) of main() run here; the stderr handler the CLI installs
    on the ``mtkit`` logger is taken away again after the test."""
    logger = logging.getLogger("mtkit")
    handlers, level = list(logger.handlers), logger.level

    def run(*args) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["mtkit", *map(str, args)])
        code = 0
        try:
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        out, err = capsys.readouterr()
        return code, out, err

    yield run
    logger.handlers[:] = handlers
    logger.setLevel(level)


def one_error_line(code: int, err: str) -> str:
    lines = err.splitlines()
    assert code == 1 and "Traceback" not in err, (code, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_translate_writes_one_line_per_input_line(mtkit, tiny, tmp_path):
    (tmp_path / "in.txt").write_text("\n".join(LINES) + "\n")
    code, out, err = mtkit("translate", "-m", tiny, tmp_path / "in.txt", "-o", tmp_path / "out.txt")
    assert code == 0, err
    assert out == ""  # the translations went to --output
    found = (tmp_path / "out.txt").read_text().split("\n")
    assert found[-1] == "" and len(found) - 1 == len(LINES)
    assert found[1] == "" and found[3] == ""  # an empty or blank line stays empty
    code, again, err = mtkit("translate", "-m", tiny, tmp_path / "in.txt", "--batch-tokens", "8")
    assert code == 0, err
    assert again.split("\n") == found  # the batching changes nothing; stdout without -o


def test_alignments_and_markup_come_through_the_command_line(mtkit, tiny, tmp_path):
    (tmp_path / "in.txt").write_text("\n".join(LINES) + "\n")
    code, plain, err = mtkit("translate", "-m", tiny, tmp_path / "in.txt")
    assert code == 0, err
    code, out, err = mtkit("translate", "-m", tiny, "--alignments", "--format", "json", tmp_path / "in.txt")
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["text"] for r in records] == plain.splitlines()  # the translations as without alignments
    for source, record in zip(LINES, records, strict=True):
        n_src, n_tgt = len(source.split()), len(record["text"].split())
        assert all(0 <= s < n_src and 0 <= t < n_tgt for s, t in record["alignment"]), record
        assert sorted(t for _, t in record["alignment"]) == (list(range(n_tgt)) if n_src else [])
    (tmp_path / "page.html").write_text("<p>two <b>hundred</b> five</p>\n<p>nine</p>\n")
    code, out, err = mtkit("translate", "-m", tiny, "--format", "html", tmp_path / "page.html")
    assert code == 0, err
    rows = out.splitlines()
    assert len(rows) == 2 and rows[0].startswith("<p>") and rows[0].endswith("</p>") and rows[1].startswith("<p>")
    assert rows[0].count("<b>") == rows[0].count("</b>") == 1


def test_score_gives_one_score_per_line_pair(mtkit, tiny, tmp_path):
    (tmp_path / "src.txt").write_text("two hundred five\nnine\n")
    (tmp_path / "tgt.txt").write_text("zweihundertfünf\nneun\n")
    code, out, err = mtkit("score", "-m", tiny, "--src", tmp_path / "src.txt", "--tgt", tmp_path / "tgt.txt")
    assert code == 0, err
    rows = [line.split("\t") for line in out.splitlines()]
    assert len(rows) == 2, out
    for total, mean, tokens in rows:
        assert float(total) < 0 and int(tokens) >= 1
        assert float(mean) == pytest.approx(float(total) / int(tokens), abs=1e-3)


@pytest.mark.parametrize("args, expected", [
    (["--beam", "2", "--nbest", "3"], "--nbest: must be between 1 and --beam (2), got 3"),
    (["--buffer-size", "0"], "--buffer-size: must be >= 1, got 0"),
])
def test_a_bad_flag_is_one_error_line_and_exit_1(mtkit, tiny, tmp_path, args, expected):
    (tmp_path / "in.txt").write_text("nine\n")
    code, out, err = mtkit("translate", "-m", tiny, tmp_path / "in.txt", *args)
    assert out == "" and expected in one_error_line(code, err)


def test_a_missing_model_is_one_error_line_naming_it(mtkit, tmp_path):
    (tmp_path / "in.txt").write_text("nine\n")
    code, _, err = mtkit("translate", "-m", tmp_path / "nope.pt", tmp_path / "in.txt")
    assert "nope.pt" in one_error_line(code, err)


def test_the_onnx_engine_takes_an_onnx_export_only(mtkit, tiny, tmp_path):
    (tmp_path / "in.txt").write_text("nine\n")
    code, _, err = mtkit("translate", "--engine", "onnx", "-m", tiny, tmp_path / "in.txt")
    assert one_error_line(code, err) == "error: --engine onnx takes one folder written by mtkit export onnx"


@pytest.mark.parametrize("kind", ["onnx", "hf"])
def test_an_export_into_a_folder_that_is_not_empty_is_one_error_line_and_writes_nothing(mtkit, tiny, tmp_path, kind):
    out = tmp_path / kind
    out.mkdir()
    (out / "keep.txt").write_text("mine\n")
    code, _, err = mtkit("export", kind, tiny, out, *(["--beam", "1"] if kind == "hf" else []))  # hf: no gnmt penalty
    assert one_error_line(code, err.splitlines()[-1]) == (
        f"error: {out}: already exists and is not empty; remove it or choose another directory")
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and sorted(p.name for p in tmp_path.iterdir()) == [kind]


def test_without_transformers_the_hf_export_and_comet_name_their_extra(mtkit, tiny, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if it were not installed
    code, _, err = mtkit("export", "hf", tiny, tmp_path / "hf", "--beam", "1")
    assert one_error_line(code, err.splitlines()[-1]) == (
        "error: exporting to Hugging Face needs transformers (pip install 'mtkit[hf]')")
    assert not (tmp_path / "hf").exists()
    for name, text in (("src.en", "one two\n"), ("ref.de", "eins zwei\n"), ("hyp.de", "eins\n")):
        (tmp_path / name).write_text(text)
    code, _, err = mtkit("evaluate", "--hyp", tmp_path / "hyp.de", "--src", tmp_path / "src.en", "--ref",
                         tmp_path / "ref.de", "--metrics", "comet", "--comet-model", tmp_path)
    assert code == 1 and err == "error: COMET needs transformers: pip install 'mtkit[comet]'\n"


def test_train_writes_a_run_that_translates(mtkit, reverse_data, tmp_path):
    data_dir, data = reverse_data
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(yaml.safe_dump({
        "data": data, "model": {"d_model": 16, "h": 2, "d_ff": 32, "encoder_layers": 1, "decoder_layers": 1},
        "train": {"max_tokens": 200, "max_steps": 3, "warmup": 1, "log_every": 1, "valid_every": 0, "save_every": 0}}))
    code, _, err = mtkit("train", recipe, "--data", data_dir, "--run-dir", tmp_path / "run")
    assert code == 0, err
    assert (tmp_path / "run" / "config.yaml").is_file() and list((tmp_path / "run" / "checkpoints").glob("*.pt"))
    (tmp_path / "in.txt").write_text("alpha bravo\n\ncharlie\n")
    code, out, err = mtkit("translate", "-m", tmp_path / "run", tmp_path / "in.txt")
    assert code == 0 and len(out.split("\n")) == 4 and out.split("\n")[1] == "", err


def test_run_of_a_recipe_that_is_not_there_is_one_error_line(mtkit, tmp_path):
    code, _, err = mtkit("run", tmp_path / "nope.yaml", "--work", tmp_path / "work")
    assert "nope.yaml" in one_error_line(code, err)
    assert not (tmp_path / "work").exists()


def test_an_unknown_option_is_a_usage_error_exit_2(mtkit):
    code, _, _ = mtkit("train", "--no-such-option")
    assert code == 2

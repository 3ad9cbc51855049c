"""Bad input, command by command: exit code 1, exactly one ``error:`` line, no traceback.

Grow the table whenever a new error path appears. Each case runs the CLI's entry point (in this
process: a fresh Python per case was most of the time; the `cuda` cases in a process that sees no GPU),
and each test then looks up its own result.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import TINY_MODEL
from inprocess import run_mtkit

pytestmark = pytest.mark.slow  # real processes and training: the fast tier is pytest -m 'not slow'

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "MTKIT_DEBUG": "",
       "CUDA_VISIBLE_DEVICES": ""}  # so that the `cuda` cases fail the same way on a GPU machine


def _cases(d: dict) -> dict[str, tuple[list[str], str]]:
    """name -> (argv after `mtkit`, a fragment the error line must contain)."""
    data, run, text, recipe = d["data"], d["run"], d["text"], d["recipe"]
    src, tgt = str(text / "src.txt"), str(text / "tgt.txt")
    train = ["train", recipe, "-d", data, "-r", str(d["tmp"] / "new-run")]
    tr = ["translate", "-m", run, src]
    ev = ["evaluate", "--hyp", src, "--ref", src]
    sc = ["score", "-m", run, "--src", src, "--tgt", tgt]
    return {
        # prepare
        "prepare: recipe is a directory": (["prepare", str(d["tmp"]), "-o", str(d["tmp"] / "o1")], "is a directory"),
        "prepare: no such recipe": (["prepare", str(d["tmp"] / "nope.yaml"), "-o", str(d["tmp"] / "o2")],
                                    "no such file"),
        "prepare: malformed YAML": (["prepare", d["malformed"], "-o", str(d["tmp"] / "o3")], "malformed YAML"),
        "prepare: unknown key": (["prepare", d["unknown_key"], "-o", str(d["tmp"] / "o4")], "did you mean"),
        "prepare: --src without --tgt": (["prepare", "--src", src, "-o", str(d["tmp"] / "o5")], "go together"),
        "prepare: missing input file": (["prepare", "--src", src + ".nope", "--tgt", tgt, "-o", str(d["tmp"] / "o6")],
                                        "no such file"),
        "prepare: .gz that is not gzip": (["prepare", "--src", d["fake_gz"], "--tgt", d["fake_gz"],
                                           "-o", str(d["tmp"] / "o7")], "gzip"),
        "prepare: output is a file": (["prepare", "--src", src, "--tgt", tgt, "-o", src], "not a directory"),
        "prepare: --force on the user's own folder": (["prepare", "--src", src, "--tgt", tgt, "-o", str(text),
                                                       "--force"], str(text)),
        "prepare: --set without =": (["prepare", "--src", src, "--tgt", tgt, "-o", str(d["tmp"] / "o8"),
                                      "--set", "data.workers"], "expected KEY=VALUE"),
        "prepare: --set wrong type": (["prepare", "--src", src, "--tgt", tgt, "-o", str(d["tmp"] / "o9"),
                                       "--set", "data.spm.vocab_size=many"], "--set data.spm.vocab_size=many"),
        "prepare: no training data": (["prepare", "-o", str(d["tmp"] / "o10")], "no training data"),
        "prepare: empty language code": (["prepare", "--src", src, "--tgt", tgt, "--src-lang", "",
                                          "-o", str(d["tmp"] / "o11")], "--src-lang"),
        "prepare: invalid UTF-8": (["prepare", "--src", d["bad_utf8"], "--tgt", tgt, "-o", str(d["tmp"] / "o12")],
                                   "invalid UTF-8"),
        "prepare: --vocab-from nowhere": (["prepare", "--src", src, "--tgt", tgt, "-o", str(d["tmp"] / "o13"),
                                           "--vocab-from", str(d["tmp"] / "novocab")], "novocab"),
        "prepare: --vocab-from with data.spm.model": (["prepare", "--src", src, "--tgt", tgt, "-o",
                                                       str(d["tmp"] / "o14"), "--vocab-from", run, "--set",
                                                       "data.spm.model=spm.model"],
                                                      "--vocab-from"),
        # train
        "train: no such data directory": (["train", recipe, "-d", str(d["tmp"] / "nodata"), "-r", str(d["tmp"] / "r1")],
                                          "nodata"),
        "train: data without manifest": (["train", recipe, "-d", str(text), "-r", str(d["tmp"] / "r2")], "manifest"),
        "train: broken manifest": (["train", recipe, "-d", d["broken_manifest"], "-r", str(d["tmp"] / "r3")],
                                   "manifest.json"),
        "train: truncated store": (["train", recipe, "-d", d["truncated"], "-r", str(d["tmp"] / "r4")],
                                   "train.src.bin"),
        "train: run directory is a file": (["train", recipe, "-d", data, "-r", src], src),
        "train: negative lr": (train + ["--set", "train.lr=-1"], "--set train.lr=-1"),
        "train: dropout 2": (train + ["--set", "model.dropout=2"], "model.dropout=2"),
        "train: log_every 0": (train + ["--set", "train.log_every=0"], "train.log_every"),
        "train: negative warmup": (train + ["--set", "train.warmup=-1"], "train.warmup"),
        "train: label smoothing 1.5": (train + ["--set", "train.label_smoothing=1.5"], "label_smoothing"),
        "train: keep_last 0": (train + ["--set", "train.keep_last=0"], "keep_last"),
        "train: cuda without a GPU": (train + ["--set", "train.device=cuda"], "cuda"),
        # fp16 trains on the CPU too (float16 autocast and GradScaler("cpu")); not on a device it does not run on
        "train: fp16 on mps": (train + ["--set", "train.device=mps", "--set", "train.precision=fp16"], "fp16"),
        "train: --resume with nothing to resume": (train + ["--resume"], "nothing to resume"),
        "train: unknown preset": (train + ["--set", "model.preset=transformer-huge"], "did you mean"),
        "train: --init-from nowhere": (train + ["--init-from", str(d["tmp"] / "noparent")], "noparent"),
        "train: --init-from a text file": (train + ["--init-from", src], "checkpoint"),
        "train: init_keep_optimizer alone": (train + ["--set", "train.init_keep_optimizer=true"], "train.init_from"),
        # average and curves
        "average: --last 0": (["average", run, "--last", "0"], "--last"),
        "average: --last -1": (["average", run, "--last", "-1"], "--last"),
        "average: more than there are": (["average", run, "--last", "99"], "only"),
        "average: no checkpoints": (["average", str(text)], "no step checkpoints"),
        "curves: no metrics": (["curves", str(text)], "metrics.jsonl"),
        # translate
        "translate: no such model": (["translate", "-m", str(d["tmp"] / "nomodel"), src], "nomodel"),
        "translate: a text file as model": (["translate", "-m", src, src], "checkpoint"),
        "translate: checkpoint without config": (["translate", "-m", d["no_config"], src], "config"),
        "translate: --device cuda without a GPU": (tr + ["--device", "cuda"], "--device"),
        "translate: temperature 0": (tr + ["--sampling", "--temperature", "0"], "--temperature"),
        "translate: top-p 2": (tr + ["--sampling", "--top-p", "2"], "--top-p"),
        "translate: top-k -5": (tr + ["--sampling", "--top-k", "-5"], "--top-k"),
        "translate: temperature without sampling": (tr + ["--temperature", "0.5"], "--sampling"),
        "translate: attention layer 99": (tr + ["--attention-png", str(d["tmp"] / "a.png"), "--attention-layer", "99"],
                                          "--attention-layer"),
        "translate: output is a directory": (tr + ["-o", str(text)], str(text)),
        "translate: beam 0": (tr + ["--beam", "0"], "--beam"),
        "translate: nbest above beam": (tr + ["--beam", "2", "--nbest", "5"], "--nbest"),
        "translate: unknown format": (tr + ["--format", "yaml"], "format"),
        "translate: unknown engine": (tr + ["--engine", "marian"], "engine"),
        "translate: missing input": (["translate", "-m", run, src + ".nope"], "no such file"),
        "translate: fp16 on CPU": (tr + ["--precision", "fp16"], "fp16"),
        "translate: batch tokens 0": (tr + ["--batch-tokens", "0"], "--batch-tokens"),
        # evaluate
        "evaluate: missing hypothesis": (["evaluate", "--hyp", src + ".nope", "--ref", src], "no such file"),
        "evaluate: line counts differ": (["evaluate", "--hyp", src, "--ref", d["short"]], "line counts differ"),
        "evaluate: unknown metric": (ev + ["--metrics", "meteor"], "meteor"),
        "evaluate: --model without --src": (["evaluate", "-m", run, "--ref", src], "--src"),
        "evaluate: --testset without --langpair": (["evaluate", "--testset", "wmt14", "--hyp", src], "--langpair"),
        "evaluate: no reference": (["evaluate", "--hyp", src], "--ref"),
        # score
        "score: line counts differ": (["score", "-m", run, "--src", src, "--tgt", d["short"]], "line counts differ"),
        "score: missing target file": (["score", "-m", run, "--src", src, "--tgt", tgt + ".nope"], "no such file"),
        "score: both from stdin": (["score", "-m", run, "--src", "-", "--tgt", "-"], "stdin"),
        "score: no such model": (["score", "-m", str(d["tmp"] / "nomodel"), "--src", src, "--tgt", tgt], "nomodel"),
        "score: unknown format": (sc + ["--format", "xml"], "--format"),
        "score: batch tokens 0": (sc + ["--batch-tokens", "0"], "--batch-tokens"),
        "score: fp16 on CPU": (sc + ["--precision", "fp16"], "fp16"),
        "score: --device cuda without a GPU": (sc + ["--device", "cuda"], "--device"),
        # export and run
        "export: not a checkpoint": (["export", "ctranslate2", src, str(d["tmp"] / "ct2")], "checkpoint"),
        "run: recipe is a directory": (["run", str(d["tmp"]), "-w", str(d["tmp"] / "w")], "is a directory"),
        # constraint and glossary text (their files are written here when d["tmp"] exists; at collection it
        # is a placeholder and nothing is written)
        "translate: --glossary not UTF-8": (tr + ["--glossary", d["bad_utf8"]], "line 2: not valid UTF-8"),
        **{name: (tr + [flag, str(path)], fragment) for name, flag, path, body, fragment in [
            ("translate: --constraints with a lone surrogate", "--constraints", d["tmp"] / "surrogate.jsonl",
             '{"include": ["\\ud800"]}\n{}\n', "line 1: include phrase '\\ud800': character 1 is a lone surrogate"),
            ("translate: --constraints with a tag as a phrase", "--constraints", d["tmp"] / "tag.jsonl",
             '{}\n{"exclude": ["<2de>"]}\n', "line 2: exclude phrase '<2de>' holds '<2de>', a reserved piece"),
            ("translate: --glossary target </s>", "--glossary", d["tmp"] / "eos.tsv", "alpha\t</s>\n",
             "line 1: target term '</s>' holds '</s>', a reserved piece"),
        ] if not Path(d["tmp"]).is_dir() or path.write_text(body, encoding="utf-8")},
        # model files whose config disagrees with their tensors (written there when d["tmp"] exists)
        **__import__("test_model_file_checks").bad_model_cases(d),
        # non-finite numbers, wherever a float is read: flags, --set, recipes (written when d["tmp"] exists);
        # and finite ones so large that they overflow
        "translate: --alpha nan": (tr + ["--alpha", "nan"], "--alpha: must be a finite number"),
        "translate: --max-len-a inf": (tr + ["--max-len-a", "inf"], "--max-len-a: must be a finite number"),
        "translate: --temperature nan": (tr + ["--sampling", "--temperature", "nan"],
                                         "--temperature: must be a finite number"),
        "translate: --top-p -inf": (tr + ["--sampling", "--top-p", "-inf"], "--top-p: must be a finite number"),
        "translate: --alpha 1e308": (tr + ["--alpha", "1e308"], "--alpha: must be in [0, 10]"),
        "translate: --max-len-a 1e308": (tr + ["--max-len-a", "1e308"], "--max-len-a: must be in [0, 1000]"),
        "translate: --temperature 1e-308": (tr + ["--sampling", "--temperature", "1e-308"],
                                            "--temperature: must be in [0.01, 100]"),
        "evaluate: --alpha inf": (["evaluate", "-m", run, "--src", src, "--ref", src, "--alpha", "inf"],
                                  "--alpha: must be a finite number"),
        "serve: --max-wait-ms nan": (["serve", "-m", run, "--port", "0", "--max-wait-ms", "nan"], "--max-wait-ms"),
        "serve: --graceful-timeout inf": (["serve", "-m", run, "--port", "0", "--graceful-timeout", "inf"],
                                          "--graceful-timeout"),
        "train: --set train.lr=nan": (train + ["--set", "train.lr=nan"], "--set train.lr=nan: must be a finite number"),
        "train: --set decode.alpha=inf": (train + ["--set", "decode.alpha=inf"],
                                          "--set decode.alpha=inf: must be a finite number"),
        "train: --set decode.alpha=1e308": (train + ["--set", "decode.alpha=1e308"], "must be in [0, 10]"),
        **{name: (["train", str(path), "-d", data, "-r", str(d["tmp"] / "r-non-finite")], fragment)
           for name, path, body, fragment in [
            ("train: recipe lr .nan", d["tmp"] / "nan.yaml", "train:\n  lr: .nan\n",
             "nan.yaml: train.lr: must be a finite number"),
            ("train: recipe alpha -.inf", d["tmp"] / "inf.yaml", "decode:\n  alpha: -.inf\n",
             "inf.yaml: decode.alpha: must be a finite number"),
            ("train: recipe alpha 1e308", d["tmp"] / "huge.yaml", "decode:\n  alpha: 1e308\n",
             "huge.yaml: decode.alpha: must be in [0, 10]"),
        ] if not Path(d["tmp"]).is_dir() or path.write_text(body, encoding="utf-8")},
        # evaluate's metrics, translate's output path
        "evaluate: --metrics ''": (ev + ["--metrics", ""], "--metrics: no metric given"),
        "evaluate: --metrics ,": (ev + ["--metrics", ","], "--metrics: no metric given"),
        "translate: -o in a folder that cannot hold it": (tr + ["-o", "/proc/x.txt"], "error: /proc/x.txt: "),
    }


@pytest.fixture(scope="module")
def results(reverse_data, tmp_path_factory):
    import torch

    from mtkit.config import config_from_dict
    from mtkit.training.trainer import train

    data, data_config = reverse_data
    tmp = tmp_path_factory.mktemp("bad")
    text = tmp / "text"
    text.mkdir()
    (text / "src.txt").write_text("alpha bravo\ncharlie delta\n")
    (text / "tgt.txt").write_text("bravo alpha\ndelta charlie\n")
    (tmp / "short.txt").write_text("one line\n")
    (tmp / "fake.gz").write_text("not gzip at all\n")
    (tmp / "bad.txt").write_bytes(b"fine\n\xff\xfe broken\n")
    (tmp / "malformed.yaml").write_text("train:\n  lr: [1, 2\n")
    (tmp / "unknown.yaml").write_text("train:\n  max_stpes: 3\n")
    recipe = tmp / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"model": TINY_MODEL, "train": {"max_steps": 2, "max_tokens": 300}}))
    torch.save({"format_version": 1, "model": {}}, tmp / "no_config.pt")

    # Damaged copies of the prepared data.
    def copy(name: str) -> Path:
        target = tmp / name
        target.mkdir()
        for f in Path(data).iterdir():
            (target / f.name).write_bytes(f.read_bytes())
        return target

    broken = copy("broken")
    (broken / "manifest.json").write_text("{broken")
    truncated = copy("truncated")
    with open(truncated / "train.src.bin", "r+b") as f:
        f.truncate(1000)

    run = tmp / "run"
    config = config_from_dict({"data": data_config, "model": TINY_MODEL,
                               "train": {"max_steps": 2, "max_tokens": 300, "valid_every": 0}})
    train(config, data, run, progress=False)

    d = {"data": str(data), "run": str(run), "text": text, "recipe": str(recipe), "tmp": tmp,
         "malformed": str(tmp / "malformed.yaml"), "unknown_key": str(tmp / "unknown.yaml"),
         "fake_gz": str(tmp / "fake.gz"), "bad_utf8": str(tmp / "bad.txt"), "short": str(tmp / "short.txt"),
         "broken_manifest": str(broken), "truncated": str(truncated), "no_config": str(tmp / "no_config.pt")}
    cases = _cases(d)

    def run_case(name: str, argv: list[str]) -> subprocess.CompletedProcess:
        """The CLI in this process (each case is about what a command says), but for the `cuda` cases: a
        process of its own that sees no GPU (torch reads CUDA_VISIBLE_DEVICES once)."""
        if "cuda" not in name:
            return run_mtkit(*argv, cwd=tmp)
        return subprocess.run([sys.executable, "-m", "mtkit", *argv], capture_output=True, text=True, env=ENV,
                              stdin=subprocess.DEVNULL, timeout=600, cwd=tmp)

    return {name: (run_case(name, argv), expected) for name, (argv, expected) in cases.items()}


CASE_NAMES = list(_cases({k: Path("/x") for k in ("data", "run", "text", "recipe", "tmp", "malformed", "unknown_key",
                                                  "fake_gz", "bad_utf8", "short", "broken_manifest", "truncated",
                                                  "no_config")}))


def test_the_table_is_large_enough():
    assert len(CASE_NAMES) >= 40
    assert len({name.split(":")[0] for name in CASE_NAMES}) >= 7  # every command


@pytest.mark.parametrize("name", CASE_NAMES)
def test_bad_input_is_one_error_line(results, name):
    result, fragment = results[name]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert len(errors) == 1, result.stderr
    assert result.stderr.rstrip().splitlines()[-1] == errors[0], result.stderr
    assert fragment in errors[0], errors[0]

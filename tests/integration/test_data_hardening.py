"""The data side of hardening issue 60, through the CLI as a stranger would run it: word alignments whose lines
repeat a link a million times (3 GB of memory from 4 MB before), a FIFO or ``/dev/zero`` in place of a score
file, a distillation shard, its ``done`` marker, an alignments file or a corpus (a hang, or a read until memory
ran out), a ``done`` marker that is not a number, ``mtkit prepare`` of a recipe with ``data.corpora``, the
languages a corpus of files is taken in, and a cleaning rule that is off in the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import fast_first, write_reverse_corpus
from inprocess import run_mtkit
from test_corpora import corpora_config
from test_model_file_checks import ENV, MEMORY_LIMIT, assert_one_error

from mtkit.commands.prepare import prepare
from mtkit.config import config_from_dict

SPECIALS = ("fifo", "/dev/zero")


def run(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    """A command under the address-space limit; ``timeout``: generous, only for a hang."""
    import resource

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, env=ENV,
                          timeout=timeout, preexec_fn=limited, stdin=subprocess.DEVNULL, check=False)


def mtkit(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return run("-m", "mtkit", *args, timeout=timeout)


def special(path: Path, kind: str) -> Path:
    """A FIFO at ``path``, or a symlink there to /dev/zero (the real device is only read, never written)."""
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(kind)
    return path


def named(path: Path) -> Path:
    """How prepare names a file of the recipe: its resolved path (a symlink's target)."""
    return path.resolve()


def corpus(tmp_path: Path, n: int = 60) -> tuple[Path, Path]:
    files = write_reverse_corpus(tmp_path / "text", n_train=n, n_valid=5)
    return files["train"]


# ------------------------------------------------------------------ word alignments


def test_a_line_repeating_one_link_a_million_times_costs_memory_bounded_by_the_sentence(tmp_path):
    """Word 0 of each side is cut into many pieces; its link given a million times (4 MB) multiplied into a link
    per piece pair per repeat (3 GB) before: now a repeated link counts once."""
    src, tgt = corpus(tmp_path, n=40)
    long_word = "qzxjvkwqzxjvkwpfyg"  # letters the corpus never has together: a piece each
    lines_src = src.read_text().splitlines()
    lines_tgt = tgt.read_text().splitlines()
    lines_src[0], lines_tgt[0] = f"{long_word} {lines_src[0]}", f"{long_word[::-1]} {lines_tgt[0]}"
    src.write_text("\n".join(lines_src) + "\n")
    tgt.write_text("\n".join(lines_tgt) + "\n")
    align = tmp_path / "train.align"
    align.write_text("0-0 " * 1_000_000 + "\n" + "0-0\n" * (len(lines_src) - 1))
    out = tmp_path / "out"
    r = mtkit("prepare", "--src", src, "--tgt", tgt, "--src-lang", "en", "--tgt-lang", "de", "--alignments", align,
              "-o", out, "--set", "data.spm.vocab_size=60", "--set", "data.workers=1", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"]["alignments"]["aligned_pairs"] == len(lines_src)
    from mtkit.data.alignments import AlignmentStore
    from mtkit.data.store import ParallelStore

    pairs = ParallelStore.open(out, "train")
    links = AlignmentStore.open(out, "train", pairs).links(0)
    assert len({tuple(x) for x in links.tolist()}) == len(links)  # each link once
    assert len(links) <= int(pairs.src_lengths[0]) * int(pairs.tgt_lengths[0])


def test_a_link_outside_the_sentence_is_one_line_naming_file_and_line(tmp_path):
    src, tgt = corpus(tmp_path, n=20)
    align = tmp_path / "train.align"
    align.write_text("0-0\n" * 5 + "0-0 " * 1000 + "999999999-0\n" + "0-0\n" * 14)
    r = mtkit("prepare", "--src", src, "--tgt", tgt, "--alignments", align, "-o", tmp_path / "out",
              "--set", "data.spm.vocab_size=60", "--set", "data.workers=1")
    assert_one_error(r, f"data.alignments {align}: line 6: pair 999999999-0 names a word beyond the sentence")
    assert not (tmp_path / "out" / "manifest.json").exists()


# ------------------------------------------------------------------ special files


@pytest.mark.parametrize("kind", fast_first(SPECIALS))  # each: mtkit processes
def test_a_special_file_as_alignments_or_corpus_is_one_line(tmp_path, kind):
    src, tgt = corpus(tmp_path, n=20)
    align = special(tmp_path / "train.align", kind)
    r = mtkit("prepare", "--src", src, "--tgt", tgt, "--alignments", align, "-o", tmp_path / "out",
              "--set", "data.spm.vocab_size=60", "--set", "data.workers=1")
    assert_one_error(r, f"{named(align)}: not a regular file")
    odd = special(tmp_path / "odd.tgt", kind)
    r = mtkit("prepare", "--src", src, "--tgt", odd, "-o", tmp_path / "out2", "--set", "data.spm.vocab_size=60")
    assert_one_error(r, f"{named(odd)}: not a regular file")


@pytest.mark.parametrize("kind", fast_first(SPECIALS))  # each: mtkit processes
def test_a_special_file_as_a_dual_xent_score_file_is_one_line(tmp_path, kind):
    src, tgt = corpus(tmp_path, n=20)
    good = tmp_path / "bwd.txt"
    good.write_text("-1.0\t-0.5\t2\n" * 20)
    scores = special(tmp_path / "fwd.txt", kind)
    r = mtkit("prepare", "--src", src, "--tgt", tgt, "-o", tmp_path / "out", "--set", "data.spm.vocab_size=60",
              "--set", f"data.clean.filters={{dual_xent: {{forward: {scores}, backward: {good}}}}}")
    assert_one_error(r, f"{named(scores)}: not a regular file")


DISTILL = """
import sys
from pathlib import Path
from mtkit.errors import MtkitError
from mtkit.training.distill import _shards_done, read_shards
folder = Path(sys.argv[1])
try:
    print(sum(1 for _ in read_shards(folder, _shards_done(folder))))
except MtkitError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
"""


@pytest.mark.parametrize("kind", fast_first(SPECIALS))  # each: mtkit processes
def test_a_special_file_as_a_distill_shard_or_its_done_marker_is_one_line(tmp_path, kind):
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "000000.tsv").write_text("a b\t-1.5\t3\n")
    (shards / "done").write_text("2\n")
    shard = special(shards / "000001.tsv", kind)
    assert_one_error(run("-c", DISTILL, shards), f"{shard}: not a regular file")
    shard.unlink()
    (shards / "000001.tsv").write_text("c\t-0.5\t2\n")
    r = run("-c", DISTILL, shards)
    assert r.returncode == 0 and r.stdout.strip() == "2", r.stderr
    (shards / "done").unlink()
    done = special(shards / "done", kind)
    assert_one_error(run("-c", DISTILL, shards), f"{done}: not a regular file")


@pytest.mark.parametrize(("text", "problem"), fast_first([  # each: a process
    ("two\n", "not a number of shards ('two')"),
    ("", "not a number of shards ('')"),
    ("-1\n", "not a number of shards ('-1')"),
    ("9" * 5000, "larger than a distillation shards' done marker can be"),
    ("99999999999\n", "99999999999 shards, more than the folder holds"),
], 2))
def test_a_done_marker_that_is_not_a_count_of_its_shards_is_one_line(tmp_path, text, problem):
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "000000.tsv").write_text("a b\t-1.5\t3\n")
    (shards / "done").write_text(text)
    assert_one_error(run("-c", DISTILL, shards), f"{shards / 'done'}: {problem}")


# ------------------------------------------------------------------ prepare's recipes and reports


def test_prepare_takes_a_recipe_with_corpora(tmp_path):
    raw = corpora_config(tmp_path)
    del raw["train"], raw["model"]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    out = tmp_path / "prepared"
    r = mtkit("prepare", recipe, "-o", out, timeout=300)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert [c["name"] for c in manifest["corpora"]] == ["original", "bt"]
    assert manifest["splits"]["train"]["pairs"] == 900
    assert "train original: kept 600 of 600 pairs" in r.stderr and "note:" not in r.stderr


def test_a_rule_that_is_off_has_no_row_in_the_manifest_or_the_report(tmp_path):
    from mtkit.data.report import cleaning_report, render_text

    files = write_reverse_corpus(tmp_path / "text", n_train=60, n_valid=5)
    data = {"src_lang": "en", "tgt_lang": "de", "workers": 1, "spm": {"vocab_size": 60},
            "train": {"src": str(files["train"][0]), "tgt": str(files["train"][1])}}
    off = prepare(config_from_dict({"data": {**data, "clean": {"dedup": False, "max_ratio": 0}}}), tmp_path / "off")
    assert list(off["dropped"]["train"]) == ["invalid_utf8", "empty", "too_long"]
    text = render_text(cleaning_report(off))
    assert "duplicate" not in text and "ratio" not in text and "too_long" in text
    on = prepare(config_from_dict({"data": {**data, "clean": {"dedup": True}}}), tmp_path / "on")
    assert list(on["dropped"]["train"]) == ["invalid_utf8", "empty", "too_long", "ratio", "duplicate"]
    assert "duplicate" in render_text(cleaning_report(on))


# ------------------------------------------------------------------ languages


@pytest.mark.slow
def test_a_language_filter_needs_the_languages_and_files_without_them_are_said_to_be_en_de(tmp_path):
    src, tgt = corpus(tmp_path, n=30)
    # the CLI in this process: the languages a corpus is taken in are the subject, not the process or its memory
    r = run_mtkit("prepare", "--src", src, "--tgt", tgt, "--filter", "langid", "-o", tmp_path / "a",
                  "--set", "data.spm.vocab_size=60")
    line = assert_one_error(r, "data.clean.filters.langid: needs the corpus's languages")
    assert "--src-lang and --tgt-lang" in line and "en-de would be assumed" in line
    r = run_mtkit("prepare", "--src", src, "--tgt", tgt, "--tgt-lang", "cs", "--filter", "langid", "-o",
                  tmp_path / "b", "--set", "data.spm.vocab_size=60")
    assert "give --src-lang (or data.src_lang" in assert_one_error(r, "no --src-lang (the pair en-cs would be")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()

    r = run_mtkit("prepare", "--src", src, "--tgt", tgt, "-o", tmp_path / "c", "--set", "data.spm.vocab_size=60")
    assert r.returncode == 0, r.stderr
    assert "note: no --src-lang and --tgt-lang given: the corpus is taken as en-de" in r.stderr
    r = run_mtkit("prepare", "--src", src, "--tgt", tgt, "--src-lang", "fr", "--tgt-lang", "cs", "-o",
                  tmp_path / "d", "--set", "data.spm.vocab_size=60")
    assert r.returncode == 0 and "note:" not in r.stderr, r.stderr
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"data": {"src_lang": "fr", "tgt_lang": "cs", "spm": {"vocab_size": 60},
                                               "train": {"src": str(src), "tgt": str(tgt)}}}))
    r = run_mtkit("prepare", recipe, "-o", tmp_path / "e")
    assert r.returncode == 0 and "note:" not in r.stderr, r.stderr

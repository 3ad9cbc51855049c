"""``mtkit prepare`` with ``data.clean.filters``: each kind of noise dropped by its filter, counted, shown in the
report (printed, in the manifest, in --report FILE), and the clean pairs kept; language ID on Multi30k with
French targets mixed in; one-line errors for bad settings."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest
from conftest import MULTI30K, WORDS
from inprocess import run_mtkit

from mtkit.data.store import ParallelStore

RULE_FLAGS = ["--filter", "nonprinting", "--filter", "alpha", "--filter", "repeats", "--filter", "copy",
              "--filter", "numbers", "--filter", "urls"]


def mtkit(*args) -> subprocess.CompletedProcess:
    """The CLI in this process: what the command does is the subject here, not the process."""
    return run_mtkit(*args)


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def noisy_corpus(folder: Path, n: int = 400, seed: int = 0) -> tuple[Path, Path, dict[str, set[int]]]:
    """Word sequences -> their words reversed in reverse order, with each kind of noise a rule filter catches
    mixed in; returns the files and, per filter, the pair numbers (1-based) it must drop."""
    rng = random.Random(seed)
    src, tgt, noise = [], [], {k: set() for k in ("nonprinting", "alpha", "repeats", "copy", "numbers", "urls")}
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 7))]
        s, t = " ".join(words), " ".join(w[::-1] for w in reversed(words))
        kind = rng.choice([*noise, *["clean"] * 14])
        if kind == "nonprinting":
            t = t.replace(" ", "\ufffd ", 1)
        elif kind == "alpha":
            t = "".join(rng.choice("#*%$&@!?=+-_/|<>~^") for _ in range(len(t)))
        elif kind == "repeats":
            t = " ".join([words[0][::-1]] * 6)
        elif kind == "copy":
            t = s
        elif kind == "numbers":
            s, t = f"{s} {i}", f"{t} {i + 1}"
        elif kind == "urls":
            s, t = f"{s} www.{words[0]}.com", f"{t} www.{words[1]}x.org"
        if kind != "clean":
            noise[kind].add(i + 1)
        src.append(s)
        tgt.append(t)
    return write(folder / "train.src", src), write(folder / "train.tgt", tgt), noise


def test_each_rule_filter_drops_its_noise_keeps_the_rest_and_the_report_shows_it(tmp_path):
    src, tgt, noise = noisy_corpus(tmp_path)
    out, report = tmp_path / "prepared", tmp_path / "report.md"
    r = mtkit("prepare", "--src", src, "--tgt", tgt, *RULE_FLAGS, "--report", report, "-o", out,
              "--set", "data.spm.vocab_size=200", "--set", "data.workers=2", "--set", "data.clean.warn_share=0.05",
              "--set", "data.clean.examples=100")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    dropped, examples = manifest["dropped"]["train"], manifest["examples"]["train"]
    assert list(dropped) == ["invalid_utf8", "empty", "nonprinting", "alpha", "repeats", "copy", "numbers", "urls",
                             "too_long", "ratio"]
    for name, numbers in noise.items():
        assert numbers, name
        assert dropped[name] == len(numbers), name
        assert {e["pair"] for e in examples[name]} == numbers, name  # and only those
    kept = 400 - sum(map(len, noise.values()))
    assert manifest["splits"]["train"]["pairs"] == kept == len(ParallelStore.open(out, "train"))
    # printed: the table with an example per rule, and a warning for each rule over warn_share
    assert f"train: kept {kept} of 400 pairs" in r.stderr
    assert "target = source" in r.stderr
    over = [name for name, numbers in noise.items() if len(numbers) > 0.05 * 400]
    assert over and all(f"warning: train: {name} dropped" in r.stderr for name in over)
    assert not [name for name in noise if name not in over and f"warning: train: {name} dropped" in r.stderr]
    text = report.read_text()
    assert text.startswith("# Cleaning report") and f"| copy | {len(noise['copy'])} |" in text

    # a prepared directory reused as it is still writes its report (JSON for another suffix)
    r = mtkit("prepare", "--src", src, "--tgt", tgt, *RULE_FLAGS, "--report", tmp_path / "again.json", "-o", out,
              "--set", "data.spm.vocab_size=200", "--set", "data.workers=2", "--set", "data.clean.warn_share=0.05",
              "--set", "data.clean.examples=100")
    assert r.returncode == 0 and "reusing it" in r.stderr, r.stderr
    sections = json.loads((tmp_path / "again.json").read_text())
    assert {row["rule"]: row["dropped"] for row in sections[0]["rules"]} == dropped


def test_without_filters_the_manifest_and_fingerprint_are_the_rules_alone(tmp_path):
    src, tgt, noise = noisy_corpus(tmp_path)
    r = mtkit("prepare", "--src", src, "--tgt", tgt, "-o", tmp_path / "plain", "--set", "data.spm.vocab_size=200")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "plain" / "manifest.json").read_text())
    # deduplication is off by default: no row of its own (never "duplicate 0")
    assert list(manifest["dropped"]["train"]) == ["invalid_utf8", "empty", "too_long", "ratio"]
    assert "duplicate" not in r.stderr
    assert manifest["clean"]["filters"] is None


@pytest.mark.parametrize(("args", "problem"), [
    (["--filter", "langidd"], "--filter langidd: unknown config key (did you mean 'langid'?)"),
    (["--filter", "dual_xent"], "--filter dual_xent: needs its score files; give it with --set"),
    (["--set", "data.clean.filters={langid: {}}", "--set", "data.tgt_lang=xx", "--src-lang", "en"],
     "data.tgt_lang: lingua does not identify the language 'xx'"),
])
def test_bad_filters_are_one_line_errors_and_write_nothing(tmp_path, args, problem):
    if "langid" in str(args):
        pytest.importorskip("lingua", reason="lingua-language-detector (extra [clean]) not installed")
    src, tgt, _ = noisy_corpus(tmp_path, n=50)
    r = mtkit("prepare", "--src", src, "--tgt", tgt, *args, "-o", tmp_path / "out", "--set", "data.spm.vocab_size=100")
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1] == f"error: {problem}" or problem in r.stderr.strip().splitlines()[-1]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.slow  # prepare on Multi30k with lingua in a process (fast: test_data_filters' langid test)
def test_langid_drops_the_french_targets_mixed_into_multi30k(tmp_path):
    pytest.importorskip("lingua", reason="lingua-language-detector (extra [clean]) not installed")
    if not (MULTI30K / "train.en").is_file():
        pytest.skip(f"Multi30k not found at {MULTI30K} (set MTKIT_MULTI30K to its folder)")
    read = {lang: (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:600]
            for lang in ("en", "de", "fr")}
    french = set(random.Random(1).sample(range(600), 60))
    src = write(tmp_path / "train.en", read["en"])
    tgt = write(tmp_path / "train.de", [read["fr" if i in french else "de"][i] for i in range(600)])
    out = tmp_path / "prepared"
    r = mtkit("prepare", "--src", src, "--tgt", tgt, "--src-lang", "en", "--tgt-lang", "de", "--filter", "langid",
              "-o", out,
              "--set", "data.spm.vocab_size=500", "--set", "data.clean.examples=100", "--set", "data.clean.max_ratio=0")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    caught = {e["pair"] - 1 for e in manifest["examples"]["train"]["langid"]}
    assert manifest["dropped"]["train"]["langid"] == len(caught)
    assert len(caught & french) >= 0.95 * len(french)  # lingua is not perfect on every caption: 95 %
    assert len(caught - french) <= 0.01 * 540
    assert all(e["why"] == "target is fr" for e in manifest["examples"]["train"]["langid"] if e["pair"] - 1 in french)


def test_a_multilingual_recipe_filters_and_reports_each_pair(tmp_path):
    from mtkit.commands.prepare import prepare
    from mtkit.config import config_from_dict
    from mtkit.data.report import cleaning_report

    pairs = []
    expected = {}
    for k, tgt_lang in enumerate(("de", "fr")):
        (tmp_path / tgt_lang).mkdir()
        src, tgt, noise = noisy_corpus(tmp_path / tgt_lang, n=200, seed=k)
        pairs.append({"src_lang": "en", "tgt_lang": tgt_lang, "train": {"src": str(src), "tgt": str(tgt)}})
        expected[f"en-{tgt_lang}"] = len(noise["copy"])
    config = config_from_dict({"data": {"pairs": pairs, "workers": 1, "spm": {"vocab_size": 200},
                                        "clean": {"filters": {"copy": {}}}}})
    manifest = prepare(config, tmp_path / "prepared", progress=False)
    assert {e["name"]: e["dropped"]["train"]["copy"] for e in manifest["pairs"]} == expected
    assert manifest["dropped"]["train"]["copy"] == sum(expected.values())
    sections = cleaning_report(manifest)
    assert [s["corpus"] for s in sections] == ["train en-de", "train en-fr"]
    assert all(r["examples"] for s in sections for r in s["rules"] if r["rule"] == "copy")

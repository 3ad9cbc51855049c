"""Terminology constraints (issue #24) through the real CLI on a trained model (the reverse task):
``translate`` and ``evaluate`` with ``--constraints`` and ``--glossary``; phrases forced in and kept
out, other lines untouched, n-best lists, beam 1, what cannot fit reported per line, and one-line
errors before any model loads."""

from __future__ import annotations

import json
import random
import subprocess

import pytest
from conftest import WORDS
from inprocess import run_mtkit

pytestmark = pytest.mark.slow  # real processes and training: the fast tier is pytest -m 'not slow'


def mtkit(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    """The CLI in this process: what the command does is the subject here, not the process."""
    return run_mtkit(*args, stdin=stdin)


def reverse_lines(n: int = 40, seed: int = 5) -> tuple[list[str], list[dict]]:
    """Lines of the reverse task, and per line: {} (every third line), or a word it lacks to include
    and one of its own words (which the model would write) to exclude."""
    rng = random.Random(seed)
    lines, constraints = [], []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 6))]
        lines.append(" ".join(words))
        if i % 3 == 0:
            constraints.append({})
        else:
            constraints.append({"include": [rng.choice([w for w in WORDS if w not in words])],
                                "exclude": [rng.choice(words)]})
    return lines, constraints


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("constraints")
    lines, constraints = reverse_lines()
    (folder / "in.txt").write_text("\n".join(lines) + "\n")
    (folder / "c.jsonl").write_text("".join(json.dumps(c) + "\n" for c in constraints))
    return folder, lines, constraints


@pytest.mark.parametrize("beam", [1, 4])
def test_every_include_in_no_exclude_in_and_the_other_lines_untouched(reverse_run, files, beam):
    folder, lines, constraints = files
    plain = mtkit("translate", "-m", reverse_run, "--beam", beam, folder / "in.txt")
    found = mtkit("translate", "-m", reverse_run, "--beam", beam, folder / "in.txt",
                  "--constraints", folder / "c.jsonl")
    assert plain.returncode == 0 and found.returncode == 0, found.stderr
    assert "warning" not in found.stderr
    plain_out, found_out = plain.stdout.splitlines(), found.stdout.splitlines()
    assert len(found_out) == len(lines)
    for c, p, f in zip(constraints, plain_out, found_out):
        if not c:
            assert f == p
            continue
        assert all(w in f.split() for w in c["include"]), (f, c)
        assert not any(w in f.split() for w in c["exclude"]), (f, c)
    assert sum(any(w in p.split() for w in c.get("exclude", [])) for c, p in zip(constraints, plain_out)) > 5


def test_nbest_lists_stay_distinct_and_ordered(reverse_run, files):
    from mtkit.checkpoints.io import load_model
    from mtkit.config import DecodeConfig
    from mtkit.engines.constraints import Constraints
    from mtkit.engines.torch_engine import TorchEngine

    _, lines, constraints = files
    wanted = [Constraints(tuple(c.get("include", ())), tuple(c.get("exclude", ()))) for c in constraints]
    translator = TorchEngine(load_model(reverse_run), DecodeConfig(beam=4, nbest=3))
    found = list(translator.translate(lines, constraints=lambda i, line: wanted[i]))
    assert len(found) == len(lines)
    for t, c in zip(found, wanted):
        assert len({tuple(h.ids) for h in t.candidates}) == len(t.candidates) == 3
        assert [h.score for h in t.candidates] == sorted((h.score for h in t.candidates), reverse=True)
        for h in t.candidates:
            assert all(w in h.text.split() for w in c.include) and not any(w in h.text.split() for w in c.exclude)


def test_glossary_terms_are_forced_where_the_source_term_occurs(reverse_run, files, tmp_path):
    folder, lines, _ = files
    (tmp_path / "g.tsv").write_text("Alpha\tkilo kilo\n")
    plain = mtkit("translate", "-m", reverse_run, folder / "in.txt")
    found = mtkit("translate", "-m", reverse_run, folder / "in.txt", "--glossary", tmp_path / "g.tsv")
    assert found.returncode == 0, found.stderr
    for line, p, f in zip(lines, plain.stdout.splitlines(), found.stdout.splitlines()):
        assert ("kilo kilo" in f) if "alpha" in line.split() else (f == p)
    assert any("alpha" in line.split() for line in lines)


def test_evaluate_translates_with_constraints(reverse_run, files, tmp_path):
    folder, lines, constraints = files
    (tmp_path / "ref.txt").write_text("\n".join(" ".join(reversed(line.split())) for line in lines) + "\n")
    done = mtkit("evaluate", "-m", reverse_run, "--src", folder / "in.txt", "--ref", tmp_path / "ref.txt",
                 "--constraints", folder / "c.jsonl", "--hyp-out", tmp_path / "hyp.txt", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["n_sentences"] == len(lines)
    for c, hyp in zip(constraints, (tmp_path / "hyp.txt").read_text().splitlines()):
        assert all(w in hyp.split() for w in c.get("include", []))


def test_a_phrase_that_cannot_fit_is_reported_on_its_line(reverse_run, tmp_path):
    (tmp_path / "c.jsonl").write_text('{}\n{"include": ["kilo lima kilo lima"]}\n{}\n')
    done = mtkit("translate", "-m", reverse_run, "--max-len-a", 0, "--max-len-b", 2, "--constraints",
                 tmp_path / "c.jsonl", stdin="alpha\nbravo\ncharlie\n")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 3
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: line 2: the translation lacks 'kilo lima kilo lima'")


ERRORS = [
    ('{}\n{"include": ["x"\n{}\n', [], "--constraints {c}: line 2: malformed JSON"),
    ('{}\n{"include": [""]}\n{}\n', [], "--constraints {c}: line 2: include holds an empty phrase"),
    ("{}\n" + json.dumps({"include": [f"w{i}" for i in range(2000)]}) + "\n{}\n", [],
     "--constraints {c}: line 2: 2000 constraint phrases, more than the 256 a line may hold"),
    ("{}\n{}\n", [], "--constraints {c}: has 2 lines, the input 3"),
    ("{}\n{}\n{}\n{}\n", [], "--constraints {c}: has 4 lines, the input 3"),
    ('{}\n{"include": ["x"]}\n{}\n', ["--sampling"], "--constraints needs beam search: drop --sampling"),
    ('{}\n{"include": ["x"]}\n{}\n', ["--engine", "ctranslate2"],
     "--constraints {c}: line 2: --engine ctranslate2 cannot force phrases into a translation"),
]


@pytest.mark.parametrize("text,args,expected", ERRORS)
def test_bad_constraints_are_one_line_before_the_model_loads(tmp_path, text, args, expected):
    (tmp_path / "c.jsonl").write_text(text)
    (tmp_path / "in.txt").write_text("alpha\nbravo\ncharlie\n")
    # The model path does not exist: the error must come before anything loads.
    done = mtkit("translate", "-m", tmp_path / "no-model", tmp_path / "in.txt",
                 "--constraints", tmp_path / "c.jsonl", *args)
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected.format(c=tmp_path / "c.jsonl") in lines[0]


def test_more_lines_on_stdin_than_constraints_is_an_error_naming_the_line(reverse_run, tmp_path):
    (tmp_path / "c.jsonl").write_text("{}\n")
    done = mtkit("translate", "-m", reverse_run, "--constraints", tmp_path / "c.jsonl", stdin="alpha\nbravo\n")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (f"error: --constraints {tmp_path / 'c.jsonl'}: has 1 line, but the input "
                                            "has more (line 2); give one JSON object per input line")


def test_ctranslate2_keeps_exclude_phrases_out(reverse_run, files, tmp_path):
    pytest.importorskip("ctranslate2")
    folder, _, constraints = files
    assert mtkit("export", "ctranslate2", reverse_run, tmp_path / "ct2").returncode == 0
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"exclude": c["exclude"]} if c else {}) + "\n"
                                              for c in constraints))
    ct2 = ["translate", "--engine", "ctranslate2", "-m", tmp_path / "ct2", folder / "in.txt"]
    plain, found = mtkit(*ct2), mtkit(*ct2, "--constraints", tmp_path / "c.jsonl")
    assert found.returncode == 0, found.stderr
    for c, p, f in zip(constraints, plain.stdout.splitlines(), found.stdout.splitlines()):
        assert not any(w in f.split() for w in c.get("exclude", [])) and (c or f == p)
    (tmp_path / "g.tsv").write_text("alpha\tkilo\n")
    glossary = mtkit(*ct2, "--glossary", tmp_path / "g.tsv")
    assert glossary.returncode == 1 and "cannot force phrases into a translation" in glossary.stderr


def test_a_phrase_the_model_cannot_write_is_warned_about_once_and_never_forced(reverse_run, tmp_path):
    (tmp_path / "in.txt").write_text("alpha bravo\ncharlie delta\ndelta echo\n")
    (tmp_path / "c.jsonl").write_text('{"include": ["ALPHA", "kilo"]}\n{"include": ["ALPHA"]}\n{}\n')
    (tmp_path / "g.tsv").write_text("echo\t1,000\n")
    plain = mtkit("translate", "-m", reverse_run, tmp_path / "in.txt")
    found = mtkit("translate", "-m", reverse_run, tmp_path / "in.txt", "--constraints", tmp_path / "c.jsonl",
                  "--glossary", tmp_path / "g.tsv")
    assert found.returncode == 0, found.stderr
    out = found.stdout.splitlines()
    assert len(out) == 3 and "⁇" not in found.stdout and "kilo" in out[0].split()
    assert out[1:] == plain.stdout.splitlines()[1:]  # nothing it can write: as without constraints
    assert all(line == line.strip() for line in out)
    warnings = [line for line in found.stderr.splitlines() if "cannot write" in line]
    assert len(warnings) == 2, found.stderr  # once per phrase, not once per line
    assert warnings[0].startswith("warning: line 1: include phrase 'ALPHA': the model cannot write 'A'")
    assert warnings[1].startswith("warning: line 3: include phrase '1,000': the model cannot write")


@pytest.mark.parametrize("engine", ["torch", "ctranslate2"])
def test_an_exclude_phrase_keeps_out_every_word_it_begins(reverse_run, tmp_path, engine):
    lines = ["alpha bravo", "charlie alpha delta", "alpha alpha echo", "bravo kilo alpha"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "c.jsonl").write_text('{"exclude": ["alph"]}\n' * len(lines))
    model = reverse_run
    if engine == "ctranslate2":
        pytest.importorskip("ctranslate2")
        assert mtkit("export", "ctranslate2", reverse_run, tmp_path / "ct2").returncode == 0
        model = tmp_path / "ct2"
    run = ["translate", "--engine", engine, "-m", model, tmp_path / "in.txt"]
    plain, found = mtkit(*run), mtkit(*run, "--constraints", tmp_path / "c.jsonl")
    assert found.returncode == 0, found.stderr
    assert sum("alpha" in p.split() for p in plain.stdout.splitlines()) >= 3  # the model writes the word
    for f in found.stdout.splitlines():
        assert not any(w.startswith("alph") for w in f.split()), f

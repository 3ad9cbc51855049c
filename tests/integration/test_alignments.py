"""``mtkit translate --alignments``: Pharaoh alignments in every output format, from the torch and the
CTranslate2 engines, through the real CLI."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest
from conftest import write_tiny_checkpoint
from inprocess import run_mtkit

LINES = ["two hundred five", "", "seven thousand one hundred and three", "nine", "  forty   two  "]


def mtkit(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    """The CLI in this process: these tests are about what translate writes, not about the process."""
    return run_mtkit(*args, stdin=stdin)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """An untrained one-layer model (its outputs are arbitrary, their alignments well-formed all the same)."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model.pt", decode={"beam": 3, "max_len_b": 6})


def check_pairs(pairs: list[tuple[int, int]], source: str, output: str, hard: bool = True) -> None:
    """Every pair names words of its lines; hard: each target word exactly once."""
    n_src, n_tgt = len(source.split()), len(output.split())
    assert all(0 <= s < n_src and 0 <= t < n_tgt for s, t in pairs), (pairs, source, output)
    if hard:
        assert sorted(t for _, t in pairs) == list(range(n_tgt)) if n_src else pairs == []


def parse(field: str) -> list[tuple[int, int]]:
    return [tuple(map(int, p.split("-"))) for p in field.split()]


@pytest.mark.slow  # mtkit processes that translate (fast: test_cli_in_process, test_alignment)
def test_text_nbest_and_json_carry_each_hypothesis_alignment(tiny, tmp_path):
    (tmp_path / "in.txt").write_text("\n".join(LINES) + "\n")
    plain = mtkit("translate", "-m", tiny, tmp_path / "in.txt")
    text = mtkit("translate", "-m", tiny, "--alignments", tmp_path / "in.txt")
    assert plain.returncode == text.returncode == 0, text.stderr
    outputs = plain.stdout.splitlines()
    rows = text.stdout.splitlines()
    assert len(rows) == len(LINES)
    for source, output, row in zip(LINES, outputs, rows, strict=True):
        translation, _, alignment = row.rpartition(" |||") if row.endswith("|||") else row.rpartition(" ||| ")
        assert translation == output  # the translation itself unchanged, in order
        check_pairs(parse(alignment), source, output)

    nbest = mtkit("translate", "-m", tiny, "--alignments", "--nbest", "3", tmp_path / "in.txt")
    assert nbest.returncode == 0, nbest.stderr
    lines = nbest.stdout.splitlines()
    assert len(lines) == 3 * len(LINES)
    for row in lines:
        index, output, _score, alignment = (f.strip() for f in row.split("|||"))
        check_pairs(parse(alignment), LINES[int(index)], output)

    found = mtkit("translate", "-m", tiny, "--alignments", "--nbest", "2", "--format", "json", tmp_path / "in.txt")
    assert found.returncode == 0, found.stderr
    for source, line in zip(LINES, found.stdout.splitlines(), strict=True):
        record = json.loads(line)
        check_pairs([tuple(p) for p in record["alignment"]], source, record["text"])
        for hypothesis in record["nbest"]:
            check_pairs([tuple(p) for p in hypothesis["alignment"]], source, hypothesis["text"])
    soft = mtkit("translate", "-m", tiny, "--alignment-threshold", "0.3", "--format", "json", tmp_path / "in.txt")
    assert soft.returncode == 0, soft.stderr
    for source, line in zip(LINES, soft.stdout.splitlines(), strict=True):
        record = json.loads(line)
        check_pairs([tuple(p) for p in record["alignment"]], source, record["text"], hard=False)


@pytest.mark.slow  # mtkit processes that translate
def test_alignments_out_writes_a_line_per_input_and_leaves_the_translations_as_they_are(tiny, tmp_path):
    (tmp_path / "in.txt").write_text("\n".join(LINES) + "\n")
    plain = mtkit("translate", "-m", tiny, tmp_path / "in.txt")
    done = mtkit("translate", "-m", tiny, "--alignments-out", tmp_path / "al.txt", "-o", tmp_path / "out.txt",
                 tmp_path / "in.txt")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.txt").read_text() == plain.stdout
    alignments = (tmp_path / "al.txt").read_text().split("\n")
    assert alignments[-1] == "" and len(alignments) == len(LINES) + 1
    for source, output, alignment in zip(LINES, plain.stdout.splitlines(), alignments, strict=False):
        check_pairs(parse(alignment), source, output)
    assert alignments[1] == ""  # the empty line: no pair


@pytest.mark.parametrize("args, message", [
    (["--alignments", "--format", "tokens"], "--alignments: word alignments go with --format text, nbest or json"),
    (["--alignment-layer", "0"], "--alignment-layer needs --alignments"),
    pytest.param(["--alignments", "--alignment-layer", "1"], "--alignment-layer 1: the model has 1 decoder layers",
                 marks=pytest.mark.slow),  # this one loads the model
    (["--alignment-threshold", "0"], "--alignment-threshold: must be in (0, 1], got 0"),
])
def test_bad_alignment_flags_are_one_line_errors(tiny, args, message):
    done = mtkit("translate", "-m", tiny, *args, stdin="two hundred\n")
    assert done.returncode != 0 and done.stdout == ""
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_alignments_do_not_depend_on_the_batch(tiny):
    """The teacher-forced pass that aligns pads sources and outputs: a line aligned in a batch of others
    gets the attention it gets alone."""
    from mtkit.checkpoints.io import load_model
    from mtkit.engines.torch_engine import TorchEngine

    loaded = load_model(tiny)
    decode = dataclasses.replace(loaded.config.decode, alignments="soft", alignment_threshold=0.05)
    engine = TorchEngine(loaded, decode)
    together = list(engine.translate(LINES))
    alone = [t for line in LINES for t in engine.translate([line])]
    assert [t.best.alignment for t in together] == [t.best.alignment for t in alone]
    assert any(t.best.alignment for t in together)
    call = engine.call()
    src = [t.src_ids for t in together if t.src_ids]
    out = [t.best.ids for t in together if t.src_ids]
    batched = engine.attention_batch(src, out, call, 0, None)
    for s, o, attention in zip(src, out, batched, strict=True):
        single = engine.attention_batch([s], [o], call, 0, None)[0]
        assert attention.shape == (len(o), len(s))
        assert abs(attention - single).max() < 1e-5
        assert abs(attention.sum(axis=1) - 1).max() < 1e-5


@pytest.mark.slow
def test_ctranslate2_aligns_as_torch_on_a_trained_model(reverse_run, reverse_data, tmp_path):
    pytest.importorskip("ctranslate2")
    _, data = reverse_data
    source = data["test"]["src"]
    assert mtkit("export", "ctranslate2", reverse_run, tmp_path / "ct2").returncode == 0
    found = {}
    for engine, model in (("torch", reverse_run), ("ctranslate2", tmp_path / "ct2")):
        done = mtkit("translate", "-m", model, "--engine", engine, "--alignments", "--nbest", "2", "--no-guard",
                     source)  # (the engines' own outputs: the guard forces in torch, carries in CTranslate2)
        assert done.returncode == 0, done.stderr
        found[engine] = done.stdout.splitlines()
    lines = open(source).read().splitlines()
    assert len(found["torch"]) == 2 * len(lines)
    same = sum(a == b for a, b in zip(found["torch"], found["ctranslate2"], strict=True))
    assert same >= len(found["torch"]) - 2, f"{same}/{len(found['torch'])} lines the same"
    wrong = mtkit("translate", "-m", tmp_path / "ct2", "--engine", "ctranslate2", "--alignments",
                  "--alignment-layer", "1", stdin="alpha bravo\n")
    assert wrong.returncode != 0 and "fixed at export" in wrong.stderr and "Traceback" not in wrong.stderr


@pytest.mark.slow  # mtkit processes that translate (fast: test_markup)
def test_format_html_and_xml_carry_the_markup_of_each_line(tiny, tmp_path):
    from mtkit.text.markup import _tokens

    lines = ['two <b>hundred</b> <a href="/x">five</a>', "<p>seven</p><p>one <i>hundred</i></p>", "", "plain nine",
             "<script>no <b> tags</script> forty"]
    (tmp_path / "in.html").write_text("\n".join(lines) + "\n")
    done = mtkit("translate", "-m", tiny, "--format", "html", tmp_path / "in.html")
    assert done.returncode == 0, done.stderr
    out = done.stdout.split("\n")
    assert len(out) == len(lines) + 1 and out[-1] == "" and out[2] == ""
    for line, result in zip(lines, out, strict=False):
        tags = [t.text for t in _tokens(result, "html") if t.kind != "text"]  # well-formed, or _tokens raises
        assert sorted(tags) == sorted(t.text for t in _tokens(line, "html") if t.kind != "text")
    assert out[4].startswith("<script>no <b> tags</script> ")  # raw text untouched
    xml = mtkit("translate", "-m", tiny, "--format", "xml", stdin='two <g id="1">hundred</g> <x id="2"/>\n')
    assert xml.returncode == 0 and '<g id="1">' in xml.stdout and '<x id="2"/>' in xml.stdout, xml.stderr
    (tmp_path / "bad.html").write_text("fine\nstill <b>fine</b>\nbroken </i> here\n")
    bad = mtkit("translate", "-m", tiny, "--format", "html", "-o", tmp_path / "out.html", tmp_path / "bad.html")
    assert bad.returncode != 0 and not (tmp_path / "out.html").exists()
    assert f"{tmp_path / 'bad.html'}: line 3: </i> closes no open tag (--format html)" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert "drop --nbest" in mtkit("translate", "-m", tiny, "--format", "html", "--nbest", "2",
                                   stdin="x\n").stderr


@pytest.mark.slow  # mtkit processes that translate (fast: test_markup)
def test_protect_carries_placeholders_through_plain_text(tiny, tmp_path):
    lines = ["two {count} hundred %s five", "{only}", "", "seven thousand"]
    done = mtkit("translate", "-m", tiny, "--protect", r"\{\w+\}|%s", stdin="\n".join(lines) + "\n")
    assert done.returncode == 0, done.stderr
    out = done.stdout.split("\n")
    assert len(out) == len(lines) + 1
    assert out[0].count("{count}") == 1 and out[0].count("%s") == 1
    assert out[1] == "{only}" and out[2] == ""
    bad = mtkit("translate", "-m", tiny, "--protect", "(", stdin="x\n")
    assert bad.returncode != 0 and "--protect '(': not a regular expression" in bad.stderr
    assert "not --format json" in mtkit("translate", "-m", tiny, "--protect", "x", "--format", "json",
                                        stdin="x\n").stderr


@pytest.mark.slow  # mtkit processes that translate (fast: test_markup)
def test_protect_spaces_placeholders_as_in_the_source(tiny):
    """Whatever the untrained model writes: a placeholder with whitespace on a side in the source has whitespace
    (or the line's end) on that side in the output, and no line begins or ends with whitespace."""
    lines = ["{count} two hundred", "two hundred {unit}", "seven {name} thousand nine", "{a} {b} five"]
    done = mtkit("translate", "-m", tiny, "--protect", r"\{\w+\}", stdin="\n".join(lines) + "\n")
    assert done.returncode == 0, done.stderr
    out = done.stdout.split("\n")[:-1]
    assert len(out) == len(lines)
    for line, result in zip(lines, out):
        assert result == result.strip(), (line, result)
        for name in ("{count}", "{unit}", "{name}", "{a}", "{b}"):
            if name in line:
                assert result.count(name) == 1
                at = result.index(name)
                assert at == 0 or result[at - 1] == " ", (line, result)
                assert at + len(name) == len(result) or result[at + len(name)] == " ", (line, result)


@pytest.mark.slow  # mtkit processes that translate
def test_protect_refuses_alignments_and_a_pattern_without_end_stops(tiny):
    for flags in (["--protect", "x", "--alignments"], ["--format", "html", "--alignments"],
                  ["--protect", "x", "--alignment-threshold", "0.2"]):
        done = mtkit("translate", "-m", tiny, *flags, stdin="two\n")
        assert done.returncode == 1 and f"drop {flags[-1] if flags[-1] != '0.2' else flags[-2]}" in done.stderr, \
            done.stderr
        assert "Traceback" not in done.stderr
    done = mtkit("translate", "-m", tiny, "--protect", "(a|aa)+$", stdin="two\n" + "a" * 60 + "!\n")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "<stdin>: line 2: --protect '(a|aa)+$' took more than 1 s" in done.stderr, done.stderr


@pytest.mark.slow  # mtkit processes: an export, then translations
def test_a_ctranslate2_export_without_an_alignment_head_says_so(tiny, tmp_path):
    pytest.importorskip("ctranslate2")
    assert mtkit("export", "ctranslate2", tiny, tmp_path / "ct2").returncode == 0
    manifest = json.loads((tmp_path / "ct2" / "mtkit.json").read_text())
    assert manifest["alignment"] == {"layer": 0, "head": None}  # one decoder layer: its heads' mean
    done = mtkit("translate", "--engine", "ctranslate2", "-m", tmp_path / "ct2", "--alignments", stdin="two\n")
    assert done.returncode == 0 and " ||| " in done.stdout, done.stderr
    del manifest["alignment"]  # as an older mtkit wrote it
    (tmp_path / "ct2" / "mtkit.json").write_text(json.dumps(manifest))
    done = mtkit("translate", "--engine", "ctranslate2", "-m", tmp_path / "ct2", "--alignments", stdin="two\n")
    assert done.returncode != 0 and "gives no word alignments" in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.count("\n") <= 3, done.stderr  # loaded …, threads …, the error

"""Distillation's stages on a tiny real teacher: shards written whole and kept across a kill, the
cross-entropy filter dropping the teacher's least sure pairs, the original pairs mixed in, the recipe checks."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from conftest import write_reverse_corpus, write_tiny_checkpoint

from mtkit.config import ConfigError, config_from_dict
from mtkit.errors import MtkitError
from mtkit.training.distill import DONE, distill, read_shards, shard_path, translate_shards, worst

TEACHER_DECODE = {"beam": 2, "max_len_b": 8}  # how the teacher's own recipe decodes


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("teacher") / "teacher.pt", TEACHER_DECODE)


class Said(logging.Handler):
    """What distillation says on the ``mtkit`` logger, a line each, in :attr:`lines`."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def said(caplog) -> list[str]:
    """The lines distillation says from now on (a list that grows as it speaks)."""
    caplog.set_level(logging.INFO, logger="mtkit.training.distill")
    handler = Said()
    logger = logging.getLogger("mtkit.training.distill")
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


@pytest.fixture(scope="module")
def engine(teacher):
    from mtkit.api import LoadOptions, load_models

    return load_models([teacher], LoadOptions(engine="torch", device="cpu", threads=1, any_target=False)).engine


def recipe(tmp_path: Path, teacher: Path, **distill) -> dict:
    files = write_reverse_corpus(tmp_path / "text", n_train=70, n_valid=5)
    data = {"src_lang": "en", "tgt_lang": "de", "train": {"kind": "files", "src": str(files["train"][0]),
                                                           "tgt": str(files["train"][1])}}
    return {"data": data, "decode": {"beam": 1}, "distill": {"teacher": [str(teacher)], **distill}}  # the student's


class Killed(Exception):
    """What a kill does to the stage: it stops between two shards."""


def test_a_killed_translation_keeps_its_finished_shards(engine, tmp_path, said):
    sources = [f"line {n} " + "alpha bravo"[: n % 11] for n in range(23)]
    whole = tmp_path / "whole"
    assert translate_shards(engine.translate, sources, whole, 5) == 5
    assert (whole / DONE).read_text() == "5\n" and len(list(read_shards(whole, 5))) == 23

    calls: list[int] = []

    def dies_after_two(lines):
        if len(calls) == 2:
            raise Killed
        calls.append(len(lines))
        return engine.translate(lines)

    cut = tmp_path / "cut"
    with pytest.raises(Killed):
        translate_shards(dies_after_two, sources, cut, 5)
    assert sorted(p.name for p in cut.iterdir()) == ["000000.tsv", "000001.tsv"]  # no partial file, no marker
    first = shard_path(cut, 0).stat().st_mtime_ns
    said.clear()
    again: list[int] = []

    def counting(lines):
        again.append(len(lines))
        return engine.translate(lines)

    assert translate_shards(counting, sources, cut, 5) == 5
    assert again == [5, 5, 3] and said == ["distill: 2 of 5 shards were translated before; kept"]
    assert shard_path(cut, 0).stat().st_mtime_ns == first
    for n in range(5):
        assert shard_path(cut, n).read_bytes() == shard_path(whole, n).read_bytes()
    assert translate_shards(counting, sources, cut, 5) == 5 and len(again) == 3  # done: no work


def test_each_shard_line_is_the_teachers_best_translation_with_its_log_probability(engine, tmp_path):
    sources = ["alpha bravo", "", "charlie delta echo"]
    translate_shards(engine.translate, sources, tmp_path, 2)
    rows = list(read_shards(tmp_path, 2))
    best = [t.best for t in engine.translate(sources)]
    assert [r[0] for r in rows] == [b.text for b in best]
    assert [r[1] for r in rows] == pytest.approx([b.logprob for b in best])
    assert [r[2] for r in rows] == [len(b.ids) + 1 for b in best]


def test_the_filter_drops_the_share_of_highest_cross_entropy():
    mask = worst([0.5, 2.0, 0.1, 2.0, 1.0, 3.0, 0.2, 0.3, 0.4, 0.6], 0.3)
    assert [i for i, drop in enumerate(mask) if drop] == [1, 3, 5]  # 3.0, then the tie 2.0, 2.0
    assert not worst([1.0, 2.0], 0.0).any() and worst([1.0, 2.0, 3.0], 0.34).tolist() == [False, False, True]


@pytest.mark.parametrize("mix", [False, True])
def test_the_stages_chain_into_the_students_recipe(teacher, tmp_path, mix, said):
    config = config_from_dict(recipe(tmp_path, teacher, shard_lines=16, filter_share=0.2, mix_original=mix))
    student = distill(config, tmp_path / "distill", progress=False)
    folder = tmp_path / "distill"
    counts = json.loads((folder / "filter.json").read_text())
    assert counts["translated"] == 70 and counts["dropped"] == 14 and counts["kept"] == 56
    assert counts["original"] == (70 if mix else 0)
    rows = list(read_shards(folder / "shards", 5))
    entropy = [-logprob / tokens for _, logprob, tokens in rows]
    kept_targets = (folder / "train.tgt").read_text().splitlines()
    kept_sources = (folder / "train.src").read_text().splitlines()
    sources = Path(config.data.train.src).read_text().splitlines()
    assert len(kept_sources) == len(kept_targets) == 56 + counts["original"]
    dropped = sorted(range(70), key=lambda i: -entropy[i])[:14]
    assert max(entropy[i] for i in range(70) if i not in dropped) <= min(entropy[i] for i in dropped)
    assert kept_sources[:56] == [s for i, s in enumerate(sources) if i not in dropped]
    assert kept_targets[:56] == [rows[i][0] for i in range(70) if i not in dropped]
    if mix:
        assert kept_targets[56:] == Path(config.data.train.tgt).read_text().splitlines()
    assert student.data.train.src == str(folder / "train.src") and student.data.spm.vocab_from == str(teacher)
    assert student.model == config.model and student.distill == config.distill
    assert any("14 dropped by the filter" in line for line in said)
    assert distill(config, folder, progress=False) == student and said[-1].endswith("skipped")


def test_other_filter_settings_rewrite_the_corpus_and_other_translations_are_refused(teacher, tmp_path, said):
    raw = recipe(tmp_path, teacher, shard_lines=30, filter_share=0.1)
    folder = tmp_path / "distill"
    distill(config_from_dict(raw), folder, progress=False)
    made = {p.name: p.stat().st_mtime_ns for p in (folder / "shards").glob("*.tsv")}
    said.clear()
    distill(config_from_dict({**raw, "distill": {**raw["distill"], "filter_share": 0.5}}), folder,
            progress=False)
    assert json.loads((folder / "filter.json").read_text())["dropped"] == 35 and not any("skipped" in s for s in said)
    assert {p.name: p.stat().st_mtime_ns for p in (folder / "shards").glob("*.tsv")} == made  # not translated again
    with pytest.raises(MtkitError, match="its translations were made with another distill.shard_lines; remove"):
        distill(config_from_dict({**raw, "distill": {**raw["distill"], "shard_lines": 31}}), folder,
                progress=False)


def test_the_teacher_translates_as_its_own_recipe_decodes_not_as_the_students(tmp_path, said):
    from mtkit.api import LoadOptions, load_models
    from mtkit.config import DecodeConfig, config_to_dict

    teacher = write_tiny_checkpoint(tmp_path / "teacher.pt", {"beam": 3, "max_len_b": 6, "alpha": 0.0})
    raw = recipe(tmp_path, teacher, shard_lines=30)
    folder = tmp_path / "distill"
    distill(config_from_dict(raw), folder, progress=False)
    made = json.loads((folder / "shards" / "settings.json").read_text())["decode"]
    assert made == config_to_dict(DecodeConfig(beam=3, max_len_b=6, alpha=0.0, guard=False))
    own = load_models([teacher], LoadOptions(engine="torch", device="cpu", threads=1, any_target=False)).engine
    sources = Path(raw["data"]["train"]["src"]).read_text().splitlines()
    assert [row[0] for row in read_shards(folder / "shards", 3)] == [t.best.text for t in own.translate(sources)]
    said.clear()  # the student's decoding is not the teacher's: another one keeps the translations
    distill(config_from_dict({**raw, "decode": {"beam": 4}}), folder, progress=False)
    assert said[-1].endswith("skipped")
    settings = folder / "shards" / "settings.json"  # as an mtkit before decode.epsilon wrote it: still the same
    older = json.loads(settings.read_text())
    del older["decode"]["epsilon"], older["train"]["seed"]
    settings.write_text(json.dumps(older))
    distill(config_from_dict(raw), folder, progress=False)
    assert said[-1].endswith("skipped")
    write_tiny_checkpoint(teacher, {"beam": 2, "max_len_b": 6, "alpha": 0.0})  # the teacher's recipe changed
    with pytest.raises(MtkitError, match=r"made with another decoding \(the teacher's decode section\); remove"):
        distill(config_from_dict(raw), folder, progress=False)


@pytest.mark.parametrize(("changes", "message"), [
    ({"distill": {"filter_share": 0.1}}, "distill.filter_share: applies only with distill.teacher"),
    ({"distill": {"teacher": ["t"], "filter_share": 1.0}}, "distill.filter_share: must be in [0, 1)"),
    ({"distill": {"teacher": ["t"], "shard_lines": 0}}, "distill.shard_lines: must be between 1 and"),
    ({"distill": {"teacher": ["t"]}, "data": {"spm": {"model": "m.model"}}},
     "distill.teacher: the student takes the teacher's SentencePiece model"),
    ({"distill": {"teacher": ["t"]}, "data": {"pairs": [{"src_lang": "en", "tgt_lang": "de",
                                                          "train": {"kind": "demo"}}]}},
     "distill.teacher: distills a single-pair recipe"),
    ({"distill": {"teacher": [" "]}}, "distill.teacher: must be a list of checkpoints or run directories"),
])
def test_distill_settings_are_checked(changes, message):
    with pytest.raises(ConfigError) as e:
        config_from_dict(changes)
    assert str(e.value).startswith(message)


def test_the_student_presets_are_deep_encoder_shallow_decoder():
    for name in ("transformer-student-base", "transformer-student-tiny"):
        model = config_from_dict({"model": {"preset": name}}).model
        assert (model.encoder_layers, model.decoder_layers) == (6, 2)


@pytest.mark.slow  # mtkit processes, for their peak memory
def test_a_timed_process_reports_its_own_peak_memory_not_its_parents():
    """The engine table's peak memory is the command's: a process forked from a large one would otherwise
    report the large one's resident set (Linux keeps the high-water mark across exec)."""
    from mtkit.commands.processes import timed_mtkit

    ballast = bytearray(400 << 20)
    ballast[:: 4096] = b"\x01" * len(ballast[:: 4096])  # resident in this process
    timed = timed_mtkit(["--help"])
    assert "Usage" in timed.stdout and timed.seconds > 0
    assert 1 << 20 < timed.peak_bytes < 300 << 20, timed.peak_bytes
    with pytest.raises(MtkitError, match=r"^mtkit translate failed \(exit 1\): error: "):
        timed_mtkit(["translate", "-m", "/nonexistent/model"])
    del ballast


def test_a_training_source_that_changed_since_its_translation_is_refused(teacher, tmp_path):
    raw = recipe(tmp_path, teacher, shard_lines=30)
    folder = tmp_path / "distill"
    distill(config_from_dict(raw), folder, progress=False)
    (folder / "filter.json").unlink()  # the corpus is written again ...
    src, tgt = Path(raw["data"]["train"]["src"]), Path(raw["data"]["train"]["tgt"])
    src.write_text(src.read_text() + "alpha bravo\n")  # ... from a source with one more pair
    tgt.write_text(tgt.read_text() + "bravo alpha\n")
    with pytest.raises(MtkitError, match="data.train has not as many pairs as were translated .70.: it changed"):
        distill(config_from_dict(raw), folder, progress=False)

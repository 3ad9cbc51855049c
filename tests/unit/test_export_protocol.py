"""The exporters' one scaffold (mtkit.export.protocol) and the one manifest module (mtkit.engines.manifest):
their steps' order, what a failure leaves (nothing), and mtkit.json's fields, read back and checked."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from mtkit.config import DataConfig, PairConfig
from mtkit.engines import manifest
from mtkit.errors import MtkitError
from mtkit.export.protocol import Exporter, export, replace_directory


class Recorded(Exporter):
    """An exporter that writes one file and records the steps it is asked for."""

    target = "Test"

    def __init__(self, problems=(), bad_check: bool = False) -> None:
        self.problems, self.bad_check, self.steps = list(problems), bad_check, []

    def refusals(self) -> list[str]:
        self.steps.append("refuse")
        return self.problems

    def require(self) -> None:
        self.steps.append("require")

    def prepare(self) -> None:
        self.steps.append("prepare")

    def write(self, folder: Path) -> None:
        self.steps.append("write")
        (folder / "model.bin").write_bytes(b"weights")

    def check(self, folder: Path) -> None:
        self.steps.append("check")
        assert (folder / "model.bin").read_bytes() == b"weights"  # checked beside the output, before the rename
        if self.bad_check:
            raise MtkitError("the export differs; nothing written")


def test_an_export_runs_its_steps_in_order_and_lands_in_one_rename(tmp_path):
    exporter = Recorded()
    out = export(exporter, tmp_path / "deep" / "out")
    assert out == tmp_path / "deep" / "out" and (out / "model.bin").read_bytes() == b"weights"
    assert exporter.steps == ["refuse", "require", "prepare", "write", "check"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]  # no temporary left beside it


def test_an_empty_output_folder_is_taken(tmp_path):
    (tmp_path / "out").mkdir()
    assert (export(Recorded(), tmp_path / "out") / "model.bin").is_file()


def test_what_cannot_be_exported_is_refused_in_one_line_before_any_work(tmp_path):
    exporter = Recorded(problems=["model.positions is 'learned'", "data.tag_side is 'target'"])
    with pytest.raises(MtkitError) as e:
        export(exporter, tmp_path / "out")
    assert str(e.value) == "cannot export to Test: model.positions is 'learned'; data.tag_side is 'target'"
    assert exporter.steps == ["refuse"] and not (tmp_path / "out").exists()


def test_a_folder_that_holds_something_is_refused_before_the_export_is_built(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    exporter = Recorded()
    with pytest.raises(MtkitError, match="already exists and is not empty"):
        export(exporter, tmp_path / "out")
    assert exporter.steps == ["refuse"] and (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_a_failed_check_leaves_nothing_at_the_output_nor_beside_it(tmp_path):
    exporter = Recorded(bad_check=True)
    with pytest.raises(MtkitError, match="nothing written"):
        export(exporter, tmp_path / "out")
    assert exporter.steps[-1] == "check" and list(tmp_path.iterdir()) == []


def test_replace_directory_puts_the_new_folder_in_place_of_the_old(tmp_path):
    old, new = tmp_path / "export", tmp_path / "work" / "made"
    old.mkdir()
    (old / "v").write_text("1")
    new.mkdir(parents=True)
    (new / "v").write_text("2")
    assert replace_directory(new, old, tmp_path / "work" / "outdated") == old
    assert (old / "v").read_text() == "2" and (tmp_path / "work" / "outdated" / "v").read_text() == "1"
    assert replace_directory(tmp_path / "work" / "outdated", tmp_path / "fresh", tmp_path / "unused") == (
        tmp_path / "fresh") and not (tmp_path / "unused").exists()


# ----------------------------------------------------------------------------------------------- mtkit.json


def test_a_manifest_records_what_was_exported_first_then_the_exporters_fields(tmp_path):
    from mtkit.version import __version__

    loaded = SimpleNamespace(path=tmp_path / "run" / "averaged.pt", step=1200)
    record = manifest.record(loaded, spm=["spm.model"], quantization=None)
    assert list(record) == ["mtkit_version", "checkpoint", "step", "spm", "quantization"]
    assert record["mtkit_version"] == __version__ and record["checkpoint"] == str(loaded.path)
    path = manifest.write(tmp_path, record)
    assert path == tmp_path / manifest.NAME
    assert path.read_text(encoding="utf-8") == json.dumps(record, indent=2) + "\n"
    assert manifest.read_object(tmp_path, "model manifest") == record
    assert manifest.record(SimpleNamespace(path=loaded.path))["step"] is None  # a model without a step


def test_a_multilingual_models_languages_are_its_pairs_and_tag_side():
    one = DataConfig(src_lang="en", tgt_lang="de")
    many = DataConfig(pairs=(PairConfig(src_lang="en", tgt_lang="de"), PairConfig(src_lang="en", tgt_lang="fr")),
                      tag_side="target")
    assert manifest.languages(one) == {}
    assert manifest.languages(many) == {"pairs": [["en", "de"], ["en", "fr"]], "tag_side": "target"}


@pytest.mark.parametrize(("text", "message"), [
    ("[1, 2]", "mtkit.json: expected a JSON object, got list"),
    ('{"step": "12"}', "mtkit.json: step must be an integer, got '12'"),
    ('{"step": true}', "mtkit.json: step must be an integer, got True"),
    ('{"spm": "spm.model"}', "mtkit.json: spm must be a list of file names, got 'spm.model'"),
    ('{"pairs": [["en"]]}', "mtkit.json: pairs must be a list of [source, target] language pairs"),
    ('{"tag_side": "left"}', "mtkit.json: tag_side must be 'source', 'target' or 'codes', got 'left'"),
    ('{"alignment": {"layer": null, "head": 0}}', "mtkit.json: alignment must be {layer: N, head: N or null}"),
    ('{"model": [1]}', "mtkit.json: model must be a mapping, got [1]"),
    ('{"decode": {"beam": 0}}', "mtkit.json: decode.beam"),
    ('{"decode": {"bean": 4}}', "mtkit.json: decode.bean"),
    ("{", "mtkit.json: not valid JSON"),
])
def test_a_manifest_of_the_wrong_shape_is_one_line_naming_the_file_and_key(tmp_path, text, message):
    (tmp_path / manifest.NAME).write_text(text)
    with pytest.raises(MtkitError) as e:
        manifest.read_object(tmp_path, "model manifest")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_manifest_is_read_in_bounded_work(tmp_path, monkeypatch):
    import mtkit.engines.manifest as module

    monkeypatch.setattr(module, "MAX_CONFIG_BYTES", 64)
    (tmp_path / manifest.NAME).write_text(json.dumps({"checkpoint": "x" * 100}))
    with pytest.raises(MtkitError, match="larger than"):
        manifest.read(tmp_path, "model manifest")

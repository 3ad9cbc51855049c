"""Corpus readers: files, gzip, TSV, Hugging Face (local folders in the hub's schema), and their errors."""

import gzip
import json

import pytest

from mtkit.config import SourceConfig
from mtkit.data.sources import iter_pairs
from mtkit.errors import MtkitError


@pytest.fixture(autouse=True)
def hf_cache(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def write(path, lines, gz=False):
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if gz:
        data = gzip.compress(data)
    path.write_bytes(data)
    return str(path)


def test_files_plain_and_gzip(tmp_path):
    src = write(tmp_path / "a.en.gz", ["one", " two "], gz=True)
    tgt = write(tmp_path / "a.de", ["eins", "zwei"])
    assert list(iter_pairs(SourceConfig(src=src, tgt=tgt), "en", "de")) == [("one", "eins"), (" two ", "zwei")]


def test_tsv_gzip_and_missing_tab(tmp_path):
    path = write(tmp_path / "c.tsv.gz", ["one\teins", "two\tzwei"], gz=True)
    assert list(iter_pairs(SourceConfig(kind="tsv", path=path), "en", "de")) == [("one", "eins"), ("two", "zwei")]
    bad = write(tmp_path / "bad.tsv", ["one\teins", "two zwei"])
    with pytest.raises(MtkitError, match=r"bad\.tsv: line 2: expected 'source<TAB>target'"):
        list(iter_pairs(SourceConfig(kind="tsv", path=bad), "en", "de"))


def test_line_count_mismatch_names_both_files(tmp_path):
    src = write(tmp_path / "x.en", ["a", "b", "c"])
    tgt = write(tmp_path / "x.de", ["a", "b"])
    with pytest.raises(MtkitError) as e:
        list(iter_pairs(SourceConfig(src=src, tgt=tgt), "en", "de"))
    assert str(e.value) == f"{src} has 3 lines but {tgt} has 2: parallel files must align"


def test_invalid_utf8_error_and_skip(tmp_path):
    src = tmp_path / "u.en"
    src.write_bytes(b"ok\nbad \xff here\nfine\n")
    tgt = write(tmp_path / "u.de", ["gut", "schlecht", "fein"])
    with pytest.raises(MtkitError, match=r"u\.en: line 2: invalid UTF-8"):
        list(iter_pairs(SourceConfig(src=str(src), tgt=tgt), "en", "de"))
    import collections

    skipped = collections.Counter()
    pairs = list(iter_pairs(SourceConfig(src=str(src), tgt=tgt), "en", "de", invalid_utf8="skip", skipped=skipped))
    assert pairs == [("ok", "gut"), ("fine", "fein")]
    assert skipped["invalid_utf8"] == 1


def test_missing_file(tmp_path):
    tgt = write(tmp_path / "y.de", ["a"])
    with pytest.raises(MtkitError, match=r"nope\.en: no such file"):
        list(iter_pairs(SourceConfig(src=str(tmp_path / "nope.en"), tgt=tgt), "en", "de"))
    with pytest.raises(MtkitError, match=r"data\.valid: kind 'files' needs"):
        list(iter_pairs(SourceConfig(src=tgt), "en", "de", split_name="valid"))


def hub_folder(tmp_path, rows_by_split):
    folder = tmp_path / "wmt-like"
    folder.mkdir()
    for split, rows in rows_by_split.items():
        with open(folder / f"{split}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return str(folder)


TRANSLATION = [{"translation": {"de": "Hallo Welt", "en": "hello world"}}, {"translation": {"de": "zwei", "en": "two"}}]


@pytest.mark.parametrize("streaming", [False, True])
def test_hf_translation_layout(tmp_path, streaming):
    folder = hub_folder(tmp_path, {"train": TRANSLATION, "validation": TRANSLATION[:1]})
    source = SourceConfig(kind="hf", name=folder, streaming=streaming)
    assert list(iter_pairs(source, "en", "de")) == [("hello world", "Hallo Welt"), ("two", "zwei")]
    assert list(iter_pairs(source, "de", "en", split_name="valid")) == [("Hallo Welt", "hello world")]


def test_hf_parquet_and_flat_columns(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    folder = tmp_path / "flat"
    folder.mkdir()
    pq.write_table(pa.table({"en": ["one", "two"], "de": ["eins", "zwei"], "id": [1, 2]}), folder / "test.parquet")
    source = SourceConfig(kind="hf", name=str(folder))
    assert list(iter_pairs(source, "en", "de", split_name="test")) == [("one", "eins"), ("two", "zwei")]
    renamed = SourceConfig(kind="hf", name=str(folder), split="test", src_field="de", tgt_field="en")
    assert list(iter_pairs(renamed, "xx", "yy")) == [("eins", "one"), ("zwei", "two")]
    with pytest.raises(MtkitError, match=r"no column 'fr'; keys present: en, de, id"):
        list(iter_pairs(source, "en", "fr", split_name="test"))


@pytest.mark.parametrize("streaming", [False, True])
def test_hf_flat_columns_by_split_name(tmp_path, streaming):
    """Multi30k's hub layout: one file per split, two flat columns named by language."""
    rows = {"train": [{"en": "A dog.", "de": "Ein Hund."}, {"en": "Two men.", "de": "Zwei Männer."}],
            "validation": [{"en": "A cat.", "de": "Eine Katze."}], "test": [{"en": "Rain.", "de": "Regen."}]}
    folder = hub_folder(tmp_path, rows)
    for split, hub_split in (("train", "train"), ("valid", "validation"), ("test", "test")):
        source = SourceConfig(kind="hf", name=folder, split=hub_split, src_field="de", tgt_field="en",
                              streaming=streaming)
        assert list(iter_pairs(source, "de", "en", split_name=split)) == [(r["de"], r["en"]) for r in rows[hub_split]]
    # without split and fields: mtkit's split names and the language codes
    default = SourceConfig(kind="hf", name=folder)
    assert list(iter_pairs(default, "en", "de", split_name="valid")) == [("A cat.", "Eine Katze.")]


def test_hf_missing_language_key_lists_keys(tmp_path):
    folder = hub_folder(tmp_path, {"train": TRANSLATION})
    with pytest.raises(MtkitError, match=r"no language 'fr' in 'translation'; keys present: de, en"):
        list(iter_pairs(SourceConfig(kind="hf", name=folder), "en", "fr"))
    with pytest.raises(MtkitError, match=r"data\.test: cannot load Hugging Face dataset"):
        list(iter_pairs(SourceConfig(kind="hf", name=folder), "en", "de", split_name="test"))


def test_damaged_gzip_is_a_one_line_error_naming_the_file(tmp_path):
    tgt = write(tmp_path / "g.de", [f"zeile {i}" for i in range(5000)])
    plain = write(tmp_path / "plain.en.gz", [f"line {i}" for i in range(5000)])
    with pytest.raises(MtkitError, match=r"plain\.en\.gz: not a gzip file \(its name ends in \.gz\)"):
        list(iter_pairs(SourceConfig(src=plain, tgt=tgt), "en", "de"))
    whole = gzip.compress("".join(f"line {i}\t{i * i}\n" for i in range(5000)).encode())
    (tmp_path / "cut.en.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(MtkitError, match=r"cut\.en\.gz: gzip data ends early \(the file is truncated\)"):
        list(iter_pairs(SourceConfig(src=str(tmp_path / "cut.en.gz"), tgt=tgt), "en", "de"))
    with pytest.raises(MtkitError, match=r"cut\.en\.gz: gzip data ends early"):
        list(iter_pairs(SourceConfig(kind="tsv", path=str(tmp_path / "cut.en.gz")), "en", "de"))
    (tmp_path / "bad.en.gz").write_bytes(whole[:-8] + bytes(8))  # the CRC and length trailer zeroed
    with pytest.raises(MtkitError, match=r"bad\.en\.gz: damaged gzip data \(CRC check failed"):
        list(iter_pairs(SourceConfig(src=str(tmp_path / "bad.en.gz"), tgt=tgt), "en", "de"))

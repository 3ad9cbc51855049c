"""``prepare`` end to end: Multi30k, the demo corpus, reuse, and every user error leaving no complete-looking dir."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest

from mtkit.commands.prepare import prepare
from mtkit.config import config_from_dict
from mtkit.data.store import ParallelStore
from mtkit.data.vocab import Vocab
from mtkit.errors import MtkitError

pytestmark = pytest.mark.slow  # real processes and training: the fast tier is pytest -m 'not slow'

MULTI30K = Path(os.environ.get("MTKIT_MULTI30K", Path(__file__).resolve().parents[2].parent / "shared/data/multi30k"))
SMALL_SPM = {"vocab_size": 300, "sample_size": 5000}


def config(**data):
    data.setdefault("spm", SMALL_SPM)
    data.setdefault("workers", 1)
    return config_from_dict({"data": data})


def write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def demo_files(tmp_path: Path, n: int = 300) -> dict:
    from mtkit.data.synthetic import demo_pairs

    pairs = list(demo_pairs(n))
    return {"src": write(tmp_path / "c.en", [s for s, _ in pairs]),
            "tgt": write(tmp_path / "c.de", [t for _, t in pairs])}


def assert_nothing_complete(out: Path) -> None:
    assert not (out / "manifest.json").exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")], "temp dir left behind"


# ---------------------------------------------------------------------- Multi30k


@pytest.mark.skipif(not (MULTI30K / "train.en").is_file(), reason=f"Multi30k not found at {MULTI30K}")
def test_multi30k_en_de(tmp_path):
    m = str(MULTI30K)
    cfg = config(
        train={"src": f"{m}/train.en", "tgt": f"{m}/train.de"},
        valid={"src": f"{m}/val.en", "tgt": f"{m}/val.de"},
        test={"src": f"{m}/test_2016_flickr.en", "tgt": f"{m}/test_2016_flickr.de"},
        spm={"vocab_size": 2000, "sample_size": 20000},
        clean={"max_ratio": 0},  # keep every training line, so that line i of the files is example i
        workers=2,
    )
    out = tmp_path / "m30k"
    manifest = prepare(cfg, out, progress=False)
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert manifest["splits"]["train"]["pairs"] == 29000
    assert manifest["splits"]["valid"]["pairs"] == 1014
    assert manifest["splits"]["test"]["pairs"] == 1000
    assert sum(manifest["dropped"]["train"].values()) == 0
    assert manifest["vocab"]["joint"] and manifest["vocab"]["files"] == ["spm.model"]
    assert manifest["vocab"]["special_ids"] == {"pad": 0, "unk": 1, "bos": 2, "eos": 3}

    vocab = Vocab.load(out)
    assert vocab.src_size <= 2000
    for split, src_file, tgt_file in (("train", "train.en", "train.de"), ("test", "test_2016_flickr.en",
                                                                              "test_2016_flickr.de")):
        store = ParallelStore.open(out, split)
        src_lines = (MULTI30K / src_file).read_text(encoding="utf-8").splitlines()
        tgt_lines = (MULTI30K / tgt_file).read_text(encoding="utf-8").splitlines()
        assert len(store) == len(src_lines)
        for i in list(range(0, len(store), max(1, len(store) // 300))):
            assert vocab.decode_src(store.src(i)) == " ".join(src_lines[i].split())
            assert vocab.decode_tgt(store.tgt(i)) == " ".join(tgt_lines[i].split())
            assert store.src_lengths[i] == len(store.src(i)) and store.tgt_lengths[i] == len(store.tgt(i))
        assert manifest["splits"][split]["src_max_tokens"] == int(store.src_lengths.max())
    valid_ref = (out / "valid.tgt.txt").read_text(encoding="utf-8").splitlines()
    assert valid_ref == [line.strip() for line in (MULTI30K / "val.de").read_text(encoding="utf-8").splitlines()]


# -------------------------------------------------------------------------- demo


def test_demo_corpus_with_workers_and_reuse(tmp_path):
    cfg = config(
        train={"kind": "demo", "size": 3000, "seed": 1},
        valid={"kind": "demo", "size": 100, "seed": 1},
        test={"kind": "demo", "size": 100, "seed": 1},
        spm={"vocab_size": 400},
        workers=2,
    )
    out = tmp_path / "demo"
    manifest = prepare(cfg, out, progress=False)
    assert manifest["splits"]["train"]["pairs"] + sum(manifest["dropped"]["train"].values()) == 3000
    assert manifest["splits"]["valid"]["pairs"] == manifest["splits"]["test"]["pairs"] == 100
    assert manifest["splits"]["train"]["src_max_tokens"] <= 60
    valid = set((out / "valid.src.txt").read_text(encoding="utf-8").splitlines())
    test = set((out / "test.src.txt").read_text(encoding="utf-8").splitlines())
    store, vocab = ParallelStore.open(out, "train"), Vocab.load(out)
    train = {vocab.decode_src(store.src(i)) for i in range(len(store))}
    assert not train & valid and not train & test and not valid & test

    model_mtime = (out / "spm.model").stat().st_mtime_ns
    assert prepare(cfg, out, progress=False) == manifest  # identical inputs: reused
    fewer_workers = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, workers=1))
    assert prepare(fewer_workers, out, progress=False) == manifest  # workers change no output
    assert (out / "spm.model").stat().st_mtime_ns == model_mtime
    rebuilt = prepare(cfg, out, force=True, progress=False)
    assert rebuilt["fingerprint"] == manifest["fingerprint"]
    assert (out / "spm.model").stat().st_mtime_ns != model_mtime
    assert rebuilt["splits"] == manifest["splits"]  # deterministic
    assert_nothing_complete(tmp_path / "other")  # and no temp dirs beside out


def test_changed_input_rebuilds_and_tsv_gzip(tmp_path):
    import gzip

    from mtkit.data.synthetic import demo_pairs

    path = tmp_path / "corpus.tsv.gz"
    path.write_bytes(gzip.compress("".join(f"{s}\t{t}\n" for s, t in demo_pairs(200)).encode()))
    cfg = config(train={"kind": "tsv", "path": str(path)})
    out = tmp_path / "tsv"
    first = prepare(cfg, out, progress=False)
    assert first["splits"]["train"]["read"] == 200
    path.write_bytes(gzip.compress("".join(f"{s}\t{t}\n" for s, t in demo_pairs(150)).encode()))
    second = prepare(cfg, out, progress=False)
    assert second["fingerprint"] != first["fingerprint"]
    assert second["splits"]["train"]["read"] == 150


def test_separate_vocab_reused_model_and_dedup(tmp_path):
    files = demo_files(tmp_path, 200)
    dup = {"src": write(tmp_path / "d.en", ["a b", "a b", "  a b ", "c"]),
           "tgt": write(tmp_path / "d.de", ["x y", "x y", "x y", "z"])}
    first = prepare(config(train=files, spm={"joint": False, "vocab_size": 200}), tmp_path / "sep", progress=False)
    assert not first["vocab"]["joint"] and first["vocab"]["files"] == ["spm.src.model", "spm.tgt.model"]
    models = {"model": str(tmp_path / "sep/spm.src.model"), "tgt_model": str(tmp_path / "sep/spm.tgt.model")}
    with pytest.raises(MtkitError, match="set data.spm.joint: false"):
        prepare(config(train=dup, spm=models), tmp_path / "bad", progress=False)
    reuse = config(train=dup, spm={**models, "joint": False}, clean={"dedup": True})
    manifest = prepare(reuse, tmp_path / "dedup", progress=False)
    assert manifest["vocab"]["type"] == "reused"
    assert manifest["dropped"]["train"]["duplicate"] == 2
    assert manifest["splits"]["train"]["pairs"] == 2
    assert (tmp_path / "dedup/spm.tgt.model").read_bytes() == (tmp_path / "sep/spm.tgt.model").read_bytes()


def test_eval_splits_keep_every_line(tmp_path):
    files = demo_files(tmp_path, 200)
    valid = {"src": write(tmp_path / "v.en", ["one", "", "  two\x07  ", "one " * 100]),
             "tgt": write(tmp_path / "v.de", ["eins", "leer", "zwei", "eins"])}
    manifest = prepare(config(train=files, valid=valid), tmp_path / "out", progress=False)
    assert manifest["splits"]["valid"]["pairs"] == 4
    assert (tmp_path / "out/valid.src.txt").read_text(encoding="utf-8").splitlines()[:3] == ["one", "", "two"]
    assert len(ParallelStore.open(tmp_path / "out", "valid").src(1)) == 0


def test_invalid_utf8_skip_is_counted(tmp_path):
    files = demo_files(tmp_path, 200)
    Path(files["src"]).write_bytes(Path(files["src"]).read_bytes() + b"bad \xc3\x28\n")
    with open(files["tgt"], "a", encoding="utf-8") as f:
        f.write("schlecht\n")
    manifest = prepare(config(train=files, clean={"invalid_utf8": "skip"}), tmp_path / "out", progress=False)
    assert manifest["dropped"]["train"]["invalid_utf8"] == 1
    assert manifest["splits"]["train"]["read"] == 201


# ------------------------------------------------------------------------ errors


def bad_inputs(tmp_path: Path) -> dict:
    files = demo_files(tmp_path, 100)
    short = write(tmp_path / "short.de", ["eins"] * 99)
    binary = tmp_path / "bin.en"
    binary.write_bytes(Path(files["src"]).read_bytes().replace(b"\n", b"\xff\n", 1))
    empty_tgt = write(tmp_path / "empty.de", [""] * 100)
    hf = tmp_path / "hf"
    hf.mkdir()
    write(hf / "train.jsonl", [json.dumps({"translation": {"de": "eins", "fr": "un"}})])
    return {
        "line counts": ({"train": {"src": files["src"], "tgt": short}},
                        r"c\.en has 100 lines but .*short\.de has 99"),
        "invalid utf-8": ({"train": {"src": str(binary), "tgt": files["tgt"]}}, r"bin\.en: line 1: invalid UTF-8"),
        "missing file": ({"train": {"src": files["src"], "tgt": str(tmp_path / "gone.de")}}, r"gone\.de: no such file"),
        "empty after filtering": ({"train": {"src": files["src"], "tgt": empty_tgt}},
                                  r"data\.train: no training pairs left after cleaning"),
        "hf language key": ({"train": {"kind": "hf", "name": str(hf)}},
                            r"no language 'en' in 'translation'; keys present: de, fr"),
        "bad valid file": ({"train": files, "valid": {"src": files["src"], "tgt": short}}, r"has 100 lines but"),
    }


@pytest.mark.parametrize("case", ["line counts", "invalid utf-8", "missing file", "empty after filtering",
                                  "hf language key", "bad valid file"])
def test_user_errors_leave_nothing_complete(tmp_path, monkeypatch, case):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    data, message = bad_inputs(tmp_path)[case]
    out = tmp_path / "out"
    with pytest.raises(MtkitError, match=message) as e:
        prepare(config(**data), out, progress=False)
    assert "\n" not in str(e.value)
    assert not out.exists()
    assert_nothing_complete(out)


def test_failed_rebuild_never_looks_complete_for_new_inputs(tmp_path):
    files = demo_files(tmp_path, 100)
    out = tmp_path / "out"
    old = prepare(config(train=files), out, progress=False)
    Path(files["tgt"]).write_text("only one line\n", encoding="utf-8")
    with pytest.raises(MtkitError, match="lines but"):
        prepare(config(train=files), out, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest == old  # the old result is intact, and its fingerprint no longer matches the inputs
    assert_nothing_complete(tmp_path / "elsewhere")


@pytest.mark.parametrize("force", [False, True])
def test_refuses_foreign_nonempty_dir(tmp_path, force):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(MtkitError, match=r"mine: holds files mtkit did not write \(no manifest\.json\);"
                                         r" choose another directory$") as e:
        prepare(config(train=demo_files(tmp_path, 50)), out, force=force, progress=False)
    assert "--force" not in str(e.value)  # forcing would not help, and must not delete the user's files
    assert (out / "notes.txt").read_text() == "keep me"
    assert_nothing_complete(out)


def test_store_ids_are_unpadded(tmp_path):
    out = tmp_path / "out"
    prepare(config(train=demo_files(tmp_path, 100)), out, progress=False)
    store = ParallelStore.open(out, "train")
    ids = np.concatenate([store.tgt(i) for i in range(len(store))])
    assert not np.isin(ids, [0, 2, 3]).any()

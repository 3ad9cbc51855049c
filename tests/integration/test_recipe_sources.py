"""The Multi30k recipes run for a user elsewhere: the hub dataset by default, a local copy through ``--set``.

Offline: the hub's layout is stood in for by a local folder of JSON lines (two flat columns, en
and de), and the local copy of the raw text by a tiny fake with Multi30k's file names. The
``--set`` lines come from the recipe's own header comment, so the documented command is what
is tested.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from mtkit.commands.prepare import prepare
from mtkit.config import load_config

pytestmark = pytest.mark.slow  # real processes and training: the fast tier is pytest -m 'not slow'

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
PAIRS = {"multi30k-en-de": ("en", "de"), "multi30k-de-en": ("de", "en")}
WORDS = {"en": "a man woman dog child runs sits on the street with red ball in water".split(),
         "de": "ein mann frau hund kind läuft sitzt auf der straße mit rotem ball im wasser".split()}
FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
SIZES = {"train": 300, "valid": 20, "test": 20}
SMALL = ["data.spm.vocab_size=120", "data.workers=1"]


@pytest.fixture(autouse=True)
def hf_offline(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def captions(split: str) -> list[dict]:
    """Word-for-word caption pairs, so that no cleaning rule drops one."""
    rng = random.Random(split)
    rows = []
    for _ in range(SIZES[split]):
        ids = [rng.randrange(len(WORDS["en"])) for _ in range(rng.randint(3, 9))]
        rows.append({lang: " ".join(WORDS[lang][i] for i in ids).capitalize() + "." for lang in ("en", "de")})
    return rows


def documented_sets(recipe: Path, folder: Path) -> list[str]:
    """The ``--set`` values of the recipe's header comment, with ``$M`` the local copy."""
    sets = re.findall(r'^#\s+--set "(.+?)"', recipe.read_text(encoding="utf-8"), flags=re.M)
    assert len(sets) == 3, "the recipe's header documents one --set per split"
    return [s.replace("$M", str(folder)) for s in sets]


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_recipe_prepares_from_a_local_copy_of_the_raw_files(name, tmp_path):
    src, tgt = PAIRS[name]
    copy = tmp_path / "multi30k"
    (copy / "tok").mkdir(parents=True)
    for split, stem in FILES.items():
        rows = captions(split)
        for lang in ("en", "de"):
            (copy / f"{stem}.{lang}").write_text("".join(r[lang] + "\n" for r in rows), encoding="utf-8")
    ref = copy / "tok" / f"test_2016_flickr.lc.norm.tok.{tgt}"
    ref.write_text("".join(r[tgt].lower() + "\n" for r in captions("test")), encoding="utf-8")

    recipe = RECIPES / f"{name}.yaml"
    config = load_config(recipe, documented_sets(recipe, copy) + SMALL + [f"eval.lc_tok_ref={ref}"])
    assert {getattr(config.data, s).kind for s in FILES} == {"files"}
    assert config.eval.lc_tok_ref == str(ref)

    manifest = prepare(config, tmp_path / "data", progress=False)
    assert {s: manifest["splits"][s]["pairs"] for s in FILES} == SIZES
    test_src = (tmp_path / "data" / "test.src.txt").read_text(encoding="utf-8").splitlines()
    assert test_src == [r[src] for r in captions("test")]


def test_recipe_reads_the_hub_datasets_layout(tmp_path):
    """The recipe's own hf sources (split names, columns), pointed at a local folder in the hub's layout."""
    folder = tmp_path / "multi30k-hub"
    folder.mkdir()
    for split, hub_split in (("train", "train"), ("valid", "validation"), ("test", "test")):
        with open(folder / f"{hub_split}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in captions(split))

    recipe = RECIPES / "multi30k-en-de.yaml"
    config = load_config(recipe, [f"data.{s}.name={folder}" for s in FILES] + SMALL)
    assert {getattr(config.data, s).kind for s in FILES} == {"hf"}

    manifest = prepare(config, tmp_path / "data", progress=False)
    assert {s: manifest["splits"][s]["pairs"] for s in FILES} == SIZES
    for side, lang in (("src", "en"), ("tgt", "de")):
        text = (tmp_path / "data" / f"valid.{side}.txt").read_text(encoding="utf-8").splitlines()
        assert text == [r[lang] for r in captions("valid")]

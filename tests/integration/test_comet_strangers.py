"""A COMET model folder from a stranger costs work bounded by its size, never runs its code, never reads
standard input, and each bad one is one error line (issue 60).

Each case is the real CLI (``translate --qe-model``, ``evaluate --comet-model``) in a process under
test_model_file_checks' address-space limit (:data:`MEMORY_LIMIT`), on a copy of a tiny reference-free COMET
model (tests/tiny_comet.py) spoiled one way: an encoder whose config asks for custom code (transformers asked
"run the custom code? [y/N]" on mtkit's standard input, so that a ``y`` line piped in ran the folder's Python);
a Lightning checkpoint of zero-stride views standing for gigabytes, or with a deflated ``data.pkl`` (a zip
bomb); an ``hparams.yaml`` of YAML aliases (a "billion laughs"); an encoder ``config.json`` or
``tokenizer.json`` nested 200,000 deep or of 3 GB (sparse: nothing of that size is written).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import write_tiny_checkpoint, zip_bomb
from test_model_file_checks import _limited, assert_one_error, run_each
from test_stranger_files import deep_json, sparse
from tiny_comet import write_tiny_comet

from mtkit.errors import MtkitError
from mtkit.metrics.comet import CometScorer

SOURCES = ["A man is riding a bicycle.", "Two dogs play in the snow."]
HYPS = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]
ANSWERS = "y\nyes\n1\n" * 20  # what transformers' prompt took as "run the custom code"
EVIL = ("from pathlib import Path\n"
        "Path(__file__).resolve().parents[0].joinpath('RAN').write_text('ran')\n"  # beside the copy it runs
        "Path({marker!r}).write_text('ran')\n")


@pytest.fixture(scope="module")
def kiwi(tmp_path_factory) -> Path:
    """A pristine reference-free tiny COMET model (CometKiwi's shape: mt and src); tests spoil copies of it."""
    folder = write_tiny_comet(tmp_path_factory.mktemp("kiwi") / "kiwi", "unified_metric")
    set_hparams(folder, input_segments=["mt", "src"])
    return folder


@pytest.fixture(scope="module")
def translator(tmp_path_factory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("mt") / "model.pt", {"beam": 1, "max_len_b": 4})


def set_hparams(folder: Path, **values) -> None:
    """Set ``values`` in the model's hyper-parameters (the checkpoint's and ``hparams.yaml``'s)."""
    path = folder / "checkpoints" / "model.ckpt"
    ckpt = torch.load(path, weights_only=True)
    ckpt["hyper_parameters"].update(values)
    torch.save(ckpt, path)
    hparams = yaml.safe_load((folder / "hparams.yaml").read_text())
    (folder / "hparams.yaml").write_text(yaml.safe_dump({**hparams, **values}))


def copy_of(kiwi: Path, target: Path) -> Path:
    """A copy of ``kiwi`` whose hyper-parameters name its own encoder folder (the one to spoil)."""
    shutil.copytree(kiwi, target)
    set_hparams(target, pretrained_model=str(target / "encoder"))
    return target


def run_env(tmp_path: Path) -> dict:
    """Offline, its Hugging Face caches (where transformers copies a model's code before running it) inside
    ``tmp_path``."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MTKIT_DEBUG": "", "CUDA_VISIBLE_DEVICES": "",
            "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home"),
            "HF_MODULES_CACHE": str(tmp_path / "hf-home" / "modules")}


def run(tmp_path: Path, *args, stdin: str = "") -> subprocess.CompletedProcess:
    """The CLI under the memory limit, with :func:`run_env`; ``timeout``: only against a hang."""
    return subprocess.run([sys.executable, "-m", "mtkit", *map(str, args)], capture_output=True, text=True,
                          input=stdin, env=run_env(tmp_path), timeout=300, preexec_fn=_limited, check=False)


def texts(tmp_path: Path) -> tuple[Path, Path]:
    src, hyp = tmp_path / "src.en", tmp_path / "hyp.de"
    src.write_text("".join(s + "\n" for s in SOURCES))
    hyp.write_text("".join(h + "\n" for h in HYPS))
    return src, hyp


def qe(tmp_path: Path, command: str, folder: Path, translator: Path) -> subprocess.CompletedProcess:
    """``command`` (translate or evaluate) scoring with the COMET model ``folder``; "y" lines on stdin."""
    if command == "translate":
        return run(tmp_path, "translate", "-m", translator, "--qe-model", folder, stdin=ANSWERS)
    src, hyp = texts(tmp_path)
    return run(tmp_path, "evaluate", "--hyp", hyp, "--src", src, "--metrics", "comet", "--comet-model", folder,
               stdin=ANSWERS)


@pytest.mark.slow  # the CLI in a process of its own: torch's and transformers' imports
def test_the_tiny_model_scores_under_the_limit(kiwi, translator, tmp_path):
    """The limit and the copying are no cause of the failures below: an unspoiled copy scores."""
    done = qe(tmp_path, "evaluate", copy_of(kiwi, tmp_path / "model"), translator)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------ code in the encoder's folder


@pytest.mark.slow  # the CLI in a process of its own: torch's and transformers' imports
@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_an_encoder_asking_for_custom_code_never_runs_it_nor_reads_stdin(kiwi, translator, tmp_path, command):
    """config.json with an auto_map and a model_type transformers does not know: transformers asked on stdin
    whether to run the folder's evil.py, and a piped "y" ran it."""
    model = copy_of(kiwi, tmp_path / "model")
    marker = tmp_path / "RAN"
    config = model / "encoder" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_type": "mtkit-evil",
                                  "auto_map": {"AutoConfig": "evil.EvilConfig"}}))
    (model / "encoder" / "evil.py").write_text(EVIL.format(marker=str(marker)))
    done = qe(tmp_path, command, model, translator)
    assert not marker.exists() and not list(tmp_path.rglob("RAN")), "the folder's code ran"
    assert_one_error(done, f"{config}: asks for code of its own (auto_map); mtkit runs none")
    assert "[y/N]" not in done.stdout + done.stderr


@pytest.mark.slow  # the CLI in a process of its own: torch's and transformers' imports
@pytest.mark.parametrize("case", ["tokenizer auto_map", "unknown model_type"])
def test_any_request_for_custom_code_is_refused(kiwi, translator, tmp_path, case):
    """Without trust_remote_code=False transformers would consider either (a prompt, or the code run)."""
    model = copy_of(kiwi, tmp_path / "model")
    if case == "tokenizer auto_map":
        path = model / "encoder" / "tokenizer_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()),
                                    "auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}}))
        expected = f"{path}: asks for code of its own (auto_map); mtkit runs none"
    else:
        path = model / "encoder" / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "model_type": "mtkit-evil"}))
        expected = f"{path}: model_type 'mtkit-evil' is none that transformers knows (a model of its own code)"
    (model / "encoder" / "evil.py").write_text(EVIL.format(marker=str(tmp_path / "RAN")))
    assert_one_error(qe(tmp_path, "evaluate", model, translator), expected)
    assert not list(tmp_path.rglob("RAN"))


# ------------------------------------------------------------------ the Lightning checkpoint


@pytest.mark.slow  # the CLI in a process of its own: torch's and transformers' imports
def test_zero_stride_views_cannot_stand_for_gigabytes_of_weights(kiwi, translator, tmp_path):
    """A checkpoint of KBs whose every tensor is a view of one element, as large as its config.json claims
    (an encoder of 4 GiB of word embeddings): refused before torch.load, not allocated."""
    from transformers import AutoConfig

    from mtkit.metrics.comet import _hparams, _network

    model = copy_of(kiwi, tmp_path / "model")
    config_path = model / "encoder" / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "vocab_size": 250_000,
                                       "hidden_size": 4096, "intermediate_size": 16_384, "num_attention_heads": 16}))
    ckpt_path = model / "checkpoints" / "model.ckpt"
    ckpt = torch.load(ckpt_path, weights_only=True)
    shapes = _network(_hparams(ckpt["hyper_parameters"], "x"), AutoConfig.from_pretrained(model / "encoder"), "meta")
    one = torch.zeros(1)
    ckpt["state_dict"] = {k: one.expand(*v.shape) for k, v in shapes.state_dict().items()}
    torch.save(ckpt, ckpt_path)
    assert ckpt_path.stat().st_size < 1 << 20
    done = qe(tmp_path, "evaluate", model, translator)
    assert_one_error(done, f"{ckpt_path}: not a readable COMET checkpoint (its tensors describe ")
    assert "views that repeat their data" in done.stderr


@pytest.mark.slow  # the CLI in a process of its own: torch's and transformers' imports
def test_a_deflated_data_pkl_is_refused_before_it_is_inflated(kiwi, translator, tmp_path):
    """data.pkl deflated from 200 MB (the pickle, then zeros) into a file of KBs: torch.load inflated it whole."""
    model = copy_of(kiwi, tmp_path / "model")
    ckpt_path = model / "checkpoints" / "model.ckpt"
    bomb = zip_bomb(ckpt_path, tmp_path / "bomb.ckpt", keep_pickle=True)
    assert bomb.stat().st_size < 2 << 20
    bomb.replace(ckpt_path)
    done = qe(tmp_path, "evaluate", model, translator)
    assert_one_error(done, f"{ckpt_path}: not a readable COMET checkpoint (entry ")
    assert "is compressed; torch.save stores every entry as it is" in done.stderr


# ------------------------------------------------------------------ hparams.yaml


def laughs(levels: int = 9, width: int = 9) -> str:
    """A "billion laughs" of YAML aliases: ``width ** levels`` strings in under a KB, named where a message
    quotes the value (class_identifier)."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join([*lines, f"class_identifier: *l{levels - 1}", ""])


@pytest.mark.slow  # the CLI in a process of its own: torch's and transformers' imports
def test_an_hparams_yaml_of_aliases_is_refused_in_work_of_its_size(kiwi, translator, tmp_path):
    model = copy_of(kiwi, tmp_path / "model")
    bomb = laughs()
    assert len(bomb) < 1024
    (model / "hparams.yaml").write_text(bomb)
    done = qe(tmp_path, "evaluate", model, translator)
    line = assert_one_error(done, f"{model / 'hparams.yaml'}: line 2: a YAML alias of anchor 'l0'; mtkit "
                                  "reads none in a model's files")
    assert len(line) < 300


@pytest.mark.parametrize(("text", "expected"), [
    ("class_identifier: [" + ", ".join(["unified_metric"] * 20_000) + "]\n",
     "class_identifier must be one of regression_metric, referenceless_regression_metric, unified_metric (the "
     "others are not supported here), got ['unified_metric', 'unified_metric', "),
    ("<<: &a {class_identifier: unified_metric}\nb: *a\n", "line 2: a YAML alias of anchor 'a'"),
    ("class_identifier: 1" + "0" * 5000 + "\n", "malformed YAML (a number too long to read)"),
])
def test_hparams_yaml_values_are_quoted_shortly(kiwi, tmp_path, text, expected):
    """A long value is quoted through reprlib (the message is one short line); an integer of 5,000 digits
    (Python refuses to convert it) is malformed YAML, not a ValueError."""
    model = copy_of(kiwi, tmp_path / "model")
    (model / "hparams.yaml").write_text(text)
    set_hparams_file_only = model / "checkpoints" / "model.ckpt"
    ckpt = torch.load(set_hparams_file_only, weights_only=True)
    del ckpt["hyper_parameters"]  # the class then comes from hparams.yaml alone
    torch.save(ckpt, set_hparams_file_only)
    with pytest.raises(MtkitError) as e:
        CometScorer(str(model), device="cpu")
    assert expected in str(e.value) and len(str(e.value)) < 400 and "\n" not in str(e.value)


def test_input_segments_that_are_not_names_are_one_line(kiwi, tmp_path):
    """A list inside input_segments was hashed (set(v)): a TypeError traceback."""
    model = copy_of(kiwi, tmp_path / "model")
    set_hparams(model, input_segments=["mt", ["src"]])
    with pytest.raises(MtkitError, match=r"input_segments must be a list of mt, then src and/or ref, got \['mt', "):
        CometScorer(str(model), device="cpu")


# ------------------------------------------------------------------ the encoder's JSON files


@pytest.fixture(scope="module")
def deep_or_huge(request, kiwi, translator, tmp_path_factory) -> dict:
    """node id -> (what ``translate --qe-model`` said, the spoiled encoder file) for every case of
    test_a_deep_or_huge_encoder_file_is_one_error_line this session runs: one after another in ONE process
    under the memory limit, as :func:`run` sets it up (a process per case spent most of its time importing
    torch and transformers)."""
    root = tmp_path_factory.mktemp("deep-or-huge")
    cases, paths = [], {}
    test = "test_a_deep_or_huge_encoder_file_is_one_error_line"
    for k, item in enumerate(i for i in request.session.items if getattr(i, "originalname", None) == test):
        name, shape = item.callspec.params["name"], item.callspec.params["shape"]
        model = copy_of(kiwi, root / f"{k}" / "model")
        path = paths[item.nodeid] = model / "encoder" / name
        if shape == "deep":
            path.write_text(deep_json())
        else:
            sparse(path)
        cases.append((item.nodeid, ["translate", "-m", translator, "--qe-model", model], ANSWERS))
    said = run_each(cases, env=run_env(root))
    return {nodeid: (said[nodeid][0], paths[nodeid]) for nodeid in paths}


@pytest.mark.slow  # the CLI under the memory limit in a process of its own (one for all the cases)
@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "tokenizer_config.json"])
@pytest.mark.parametrize("shape", ["deep", "huge"])
def test_a_deep_or_huge_encoder_file_is_one_error_line(deep_or_huge, request, name, shape):
    said, path = deep_or_huge[request.node.nodeid]
    expected = f"{path}: nested more than 64 levels deep" if shape == "deep" else f"{path}: larger than a"
    assert_one_error(said, expected)


@pytest.mark.slow  # the CLI in a process of its own: torch's and transformers' imports
def test_an_encoder_named_on_the_hub_is_checked_in_the_cache(kiwi, translator, tmp_path):
    """A hub name (as unbabel-comet's releases give ``xlm-roberta-large``): its files, from the Hugging Face
    cache (offline here), are checked before transformers reads them; a good copy there loads."""
    repo = tmp_path / "hf-home" / "hub" / "models--someone--tiny-xlmr"
    snapshot = repo / "snapshots" / ("0" * 40)
    shutil.copytree(kiwi / "encoder", snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    model = copy_of(kiwi, tmp_path / "model")
    set_hparams(model, pretrained_model="someone/tiny-xlmr")
    done = qe(tmp_path, "evaluate", model, translator)
    assert done.returncode == 0, done.stderr
    (snapshot / "tokenizer.json").write_text(deep_json())
    assert_one_error(qe(tmp_path, "evaluate", model, translator), f"{snapshot / 'tokenizer.json'}: nested more than 64")


# ------------------------------------------------------------------ YAML in other model folders


@pytest.mark.parametrize(("text", "reason"), [(laughs().replace("class_identifier", "data: {src_lang"), "aliases"),
                                              ("data: [en, de]\n", "data not a mapping"),
                                              ("data: {src_lang: 1" + "0" * 5000 + "}\n", "a 5,000-digit number")])
def test_the_config_yaml_of_an_exports_run_is_read_bounded(tmp_path, text, reason):
    """``serve`` reads the languages of an exported model from the run it came from: a config.yaml there
    that cannot be read so leaves them unknown (before: the aliases' value, an AttributeError, a ValueError)."""
    from mtkit.commands.serve import _exported_languages

    run, export = tmp_path / "run", tmp_path / "ct2"
    (run / "checkpoints").mkdir(parents=True)
    export.mkdir()
    (export / "model.bin").write_bytes(b"")
    (export / "mtkit.json").write_text(json.dumps({"checkpoint": str(run / "checkpoints" / "step_1.pt")}))
    (run / "config.yaml").write_text(text + ("}\n" if reason == "aliases" else ""))
    assert _exported_languages(export) == (None, None)
    (run / "config.yaml").write_text("data: {src_lang: en, tgt_lang: de}\n")
    assert _exported_languages(export) == ("en", "de")

"""The strict config loader: values typed by the schema (never guessed by YAML), ranges, and errors
that name where a bad value came from."""

from __future__ import annotations

import re

import pytest

from mtkit.config import load_config, parse_override
from mtkit.errors import MtkitError


@pytest.fixture
def recipe(tmp_path):
    def write(text: str):
        path = tmp_path / "recipe.yaml"
        path.write_text(text)
        return path

    return write


@pytest.mark.parametrize("code", ["no", "on", "off", "yes", "true", "null", "1.50", "0"])
def test_string_fields_keep_what_the_user_typed(recipe, code):
    path = recipe(f"data:\n  src_lang: {code}\n  train: {{kind: files, src: {code}, tgt: b.txt}}\n")
    config = load_config(path)
    assert config.data.src_lang == code
    # Where the schema allows null, YAML's null is null; everything else stays the text.
    assert config.data.train.src == (None if code == "null" else code)
    config = load_config(None, [f"data.tgt_lang={code}", f"data.valid.src={code}"])
    assert config.data.tgt_lang == code and config.data.valid.src == (None if code == "null" else code)


def test_numbers_booleans_and_lists_still_follow_the_schema(recipe):
    path = recipe("train:\n  lr: 5e-4\n  max_steps: 1_000\n  betas: [0.9, 0.98]\n  compile: yes\n"
                  "data:\n  spm: {model: null}\n")
    config = load_config(path, ["train.eps=1e-8", "train.tensorboard=off", "data.valid.src=~"])
    assert config.train.lr == 5e-4 and config.train.max_steps == 1000 and config.train.betas == (0.9, 0.98)
    assert config.train.compile is True and config.train.tensorboard is False
    assert config.train.eps == 1e-8 and config.data.spm.model is None and config.data.valid.src is None
    assert isinstance(load_config(None, ["train.max_steps=7"]).train.max_steps, int)
    with pytest.raises(MtkitError, match="expected an integer"):
        load_config(None, ["train.max_steps=ten"])
    with pytest.raises(MtkitError, match="expected an integer"):
        load_config(recipe('train:\n  max_steps: "100"\n'))  # quoted: a string, as YAML says


def test_set_values_are_taken_as_typed():
    assert parse_override("data.train.src=my file #1.txt")[1] == "my file #1.txt"
    assert parse_override("train.betas=[0.9, 0.98]")[1] == ["0.9", "0.98"]
    with pytest.raises(MtkitError, match="expected KEY=VALUE"):
        parse_override("train.max_steps")


@pytest.mark.parametrize("override, message", [
    ("train.lr=-1", "--set train.lr=-1: must be > 0"),
    ("model.dropout=2", "--set model.dropout=2: must be in \\[0, 1\\)"),
    ("train.log_every=0", "--set train.log_every=0: must be >= 1"),
    ("train.warmup=-1", "--set train.warmup=-1: must be >= 0"),
    ("train.label_smoothing=1.5", "must be in \\[0, 1\\)"),
    ("train.keep_last=0", "train.keep_last=0: must be >= 1"),
    ("train.device=gpu", "auto, cpu, cuda or cuda:N"),
    ("decode.top_p=2", "must be in \\(0, 1\\]"),
    ("decode.top_k=-5", "must be >= 0"),
    ("decode.temperature=0", "must be > 0"),
    ("decode.nbest=5", "between 1 and decode.beam"),
    ("data.spm.character_coverage=0", "in \\(0, 1\\]"),
])
def test_bad_values_are_blamed_on_the_set_that_gave_them(recipe, override, message):
    path = recipe("train:\n  max_steps: 10\n")
    with pytest.raises(MtkitError, match=message) as caught:
        load_config(path, [override])
    assert str(path) not in str(caught.value)


def test_bad_recipe_values_name_the_file_and_key(recipe):
    path = recipe("train:\n  lr: -1\n")
    with pytest.raises(MtkitError, match=f"{path}: train.lr: must be > 0"):
        load_config(path)


def test_flags_are_named_in_errors_and_win_over_set():
    config = load_config(None, ["data.src_lang=fr"], flags={"data.src_lang": ("--src-lang", "no")})
    assert config.data.src_lang == "no"
    with pytest.raises(MtkitError, match="^--src-lang: must be a language code"):
        load_config(None, flags={"data.src_lang": ("--src-lang", " ")})
    config = load_config(None, ["data.valid.size=7"], defaults={"data.valid.size": ("--demo", 500)})
    assert config.data.valid.size == 7


def test_a_recipe_that_is_a_directory_is_a_one_line_error(tmp_path):
    with pytest.raises(MtkitError, match="is a directory"):
        load_config(tmp_path)


def test_a_saved_config_loads_back_as_itself(tmp_path):
    from mtkit.config import Config, config_from_dict, save_config

    config = config_from_dict({"data": {"src_lang": "no", "train": {"src": "1.50", "tgt": "on"}},
                               "model": {"preset": "transformer-tiny"}, "train": {"lr": 5e-4}})
    for c in (Config(), config):
        save_config(c, tmp_path / "config.yaml")
        assert load_config(tmp_path / "config.yaml") == c


@pytest.mark.parametrize("override, message", [
    ("train.precision=fp8", "expected one of 'fp32' | 'bf16' | 'fp16', got 'fp8'"),
    ("train.betas=[0.9]", "expected a list of 2 values"),
    ("train.betas=0.9", "expected a list of 2 values"),
    ("train.compile=maybe", "expected true or false"),
    ("train.max_stpes=3", "unknown config key (did you mean 'max_steps'?)"),
    ("trian.max_steps=3", "unknown config key (did you mean 'train'?)"),
    ("model.preset=transformer-bse", "unknown preset 'transformer-bse' (did you mean 'transformer-base'?)"),
    ("eval.metrics=[bleu, meteor]", "a list of bleu, chrf, ter"),
    ("data.train=files.txt", "expected a mapping"),
])
def test_type_errors_say_what_was_expected(override, message):
    with pytest.raises(MtkitError) as caught:
        load_config(None, [override])
    assert message in str(caught.value)
    assert str(caught.value).startswith(f"--set {override}: ")


def test_a_misspelt_section_in_the_recipe_is_blamed_on_the_recipe(recipe):
    path = recipe("trian:\n  max_steps: 3\n")
    with pytest.raises(MtkitError, match=f"^{path}: trian: unknown config key"):
        load_config(path, ["train.max_steps=4"])


def test_presets_fill_defaults_that_explicit_keys_override():
    config = load_config(None, ["model.preset=transformer-big", "model.dropout=0.1"])
    assert (config.model.d_model, config.model.h, config.model.d_ff, config.model.dropout) == (1024, 16, 4096, 0.1)


FINITE = "must be a finite number (not nan or inf)"


@pytest.mark.parametrize("key", ["train.lr", "decode.alpha", "decode.max_len_a", "decode.temperature",
                                 "train.max_minutes", "train.betas"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", ".nan", ".inf", "NaN", "1e999"])
def test_non_finite_numbers_are_refused_in_set_and_recipes(recipe, key, value):
    section, name = key.split(".")
    text = f"[0.9, {value}]" if name == "betas" else value
    with pytest.raises(MtkitError, match=f"^--set {re.escape(key)}={re.escape(text)}: {re.escape(FINITE)}"):
        load_config(None, [f"{key}={text}"])
    path = recipe(f"{section}:\n  {name}: {text}\n")
    with pytest.raises(MtkitError, match=f"^{re.escape(str(path))}: {re.escape(key)}(\\[1\\])?: {re.escape(FINITE)}"):
        load_config(path)


@pytest.mark.parametrize("override, message", [
    ("decode.alpha=1e308", r"decode.alpha=1e308: must be in \[0, 10\]"),  # lp = ((5+L)/6)^α overflows
    ("decode.alpha=10.5", r"must be in \[0, 10\]"),
    ("decode.max_len_a=1e308", r"must be in \[0, 1000\]"),  # a·S + b overflows an int
    ("decode.temperature=1e-308", r"must be in \[0.01, 100\]"),  # logits / T overflow
    ("decode.temperature=1e308", r"must be in \[0.01, 100\]"),  # logits / T vanish (nan)
    ("eval.metrics=[]", "a list of bleu, chrf, ter"),
])
def test_huge_but_finite_values_are_refused_where_they_overflow(override, message):
    with pytest.raises(MtkitError, match=message):
        load_config(None, [override])


def test_the_largest_sane_values_still_load():
    config = load_config(None, ["decode.alpha=10", "decode.max_len_a=1000", "decode.temperature=0.01"])
    assert (config.decode.alpha, config.decode.max_len_a, config.decode.temperature) == (10.0, 1000.0, 0.01)


def test_check_finite_names_what_it_checks():
    from mtkit.config import check_finite

    assert check_finite("--x", 2) == 2.0
    for bad in (float("nan"), float("inf"), -float("inf"), 10 ** 400):
        with pytest.raises(MtkitError, match=f"^--max-wait-ms: {re.escape(FINITE)}, got"):
            check_finite("--max-wait-ms", bad)

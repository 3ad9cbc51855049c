"""Fine-tuning's config keys and the rule for whose model a run from a parent trains (no training here:
tests/integration/test_finetune.py runs it)."""

from __future__ import annotations

import dataclasses

import pytest

from mtkit.config import ModelConfig, config_from_dict, load_config
from mtkit.errors import MtkitError
from mtkit.training.finetune import ARCHITECTURE, REGULARIZATION, model_from_parent

PARENT = ModelConfig(d_model=64, h=4, d_ff=128, encoder_layers=2, decoder_layers=2, dropout=0.3, max_positions=128)


def test_the_new_keys_are_typed_and_checked():
    config = config_from_dict({"train": {"init_from": "runs/base", "init_keep_optimizer": True,
                                         "init_sha256": "ab" * 32}, "data": {"spm": {"vocab_from": "runs/base"}}})
    assert config.train.init_from == "runs/base" and config.train.init_keep_optimizer
    assert config.data.spm.vocab_from == "runs/base"
    assert config_from_dict({}).train.init_from is None and not config_from_dict({}).train.init_keep_optimizer
    cases = [
        ({"train": {"init_keep_optimizer": True}}, "train.init_keep_optimizer: applies only with train.init_from"),
        ({"train": {"init_sha256": "ab" * 32}}, "train.init_sha256: applies only with train.init_from"),
        ({"train": {"init_from": "x", "init_sha256": "xyz"}}, "train.init_sha256: must be 64 hexadecimal digits"),
        ({"train": {"init_from": " "}}, "train.init_from: must be a checkpoint or run directory"),
        ({"train": {"init_keep_optimizer": "maybe"}}, "train.init_keep_optimizer: expected true or false"),
        ({"data": {"spm": {"vocab_from": "runs/base", "model": "spm.model"}}}, "data.spm.vocab_from: takes the"),
    ]
    for raw, message in cases:
        with pytest.raises(MtkitError, match="^" + message.replace(".", r"\.")):
            config_from_dict(raw)


def test_the_flags_are_blamed_for_their_values(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("train:\n  init_keep_optimizer: true\n")
    assert load_config(recipe, flags={"train.init_from": ("--init-from", "runs/base")}).train.init_from == "runs/base"
    with pytest.raises(MtkitError, match="^--init-from: must be a checkpoint or run directory"):
        load_config(None, flags={"train.init_from": ("--init-from", "")})
    with pytest.raises(MtkitError, match="^--vocab-from: takes the checkpoint's SentencePiece model"):
        load_config(None, ["data.spm.model=spm.model"], flags={"data.spm.vocab_from": ("--vocab-from", "runs/base")})


def test_the_keys_split_into_architecture_and_regularization():
    assert set(ARCHITECTURE) | set(REGULARIZATION) | {"preset"} == {f.name for f in dataclasses.fields(ModelConfig)}
    assert {"d_model", "h", "d_ff", "encoder_layers", "decoder_layers", "norm", "share_embeddings"} <= set(ARCHITECTURE)


def test_without_a_model_section_the_run_trains_the_parents_model():
    model, differences, note = model_from_parent(ModelConfig(), PARENT)
    assert model == PARENT and differences == [] and note is not None


def test_a_model_section_of_dropouts_takes_the_parents_architecture_with_them():
    model, differences, note = model_from_parent(ModelConfig(dropout=0.1, attention_dropout=0.2), PARENT)
    assert model == dataclasses.replace(PARENT, dropout=0.1, attention_dropout=0.2) and differences == []
    assert note is not None


def test_a_model_section_must_agree_with_the_parents_architecture():
    same = dataclasses.replace(PARENT, dropout=0.0, preset=None)
    assert model_from_parent(same, PARENT) == (same, [], None)  # its dropouts are its own
    other = dataclasses.replace(PARENT, d_model=128, h=8, norm="pre")
    assert model_from_parent(other, PARENT)[1] == ["d_model 128 vs 64", "h 8 vs 4", "norm pre vs post"]
    preset = config_from_dict({"model": {"preset": "transformer-base"}}).model
    assert model_from_parent(preset, PARENT)[1][0] == "d_model 512 vs 64"  # a preset is not a blank section

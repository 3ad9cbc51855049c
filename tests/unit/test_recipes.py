"""Every recipe loads through the strict config, and the presets in them give the paper's sizes."""

from pathlib import Path

import pytest
import torch

from mtkit.config import load_config
from mtkit.model import Transformer, count_parameters

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))


def test_the_recipes_are_there():
    names = {p.stem for p in RECIPES}
    assert {"demo", "multi30k-en-de", "multi30k-de-en", "iwslt14-de-en", "wmt14-en-de-transformer-base",
            "wmt14-en-de-transformer-big", "wmt14-en-fr-transformer-base", "wmt14-en-fr-transformer-big"} <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_loads_strictly_and_states_its_expectation(recipe):
    config = load_config(recipe)
    holders = config.data.pairs or [config.data]  # a multilingual recipe's pairs, or its one pair
    assert all(h.train is not None and h.test is not None for h in holders)
    assert config.expected.metric and config.expected.source and config.expected.hardware


def test_the_demo_is_bounded_by_its_steps_not_the_clock():
    """A first impression must not depend on what else the machine runs: the README's demo stops at
    its step count (a busy machine takes longer, it does not stop early at a lower BLEU)."""
    config = load_config(Path(RECIPES[0]).parent / "demo.yaml")
    assert config.train.max_steps > 0 and config.train.max_minutes == 0 and config.train.max_epochs == 0


@pytest.mark.parametrize(
    "recipe, millions",
    [("wmt14-en-de-transformer-base", 65), ("wmt14-en-de-transformer-big", 213)],
)
def test_wmt_recipes_give_the_papers_parameter_counts(recipe, millions):
    config = load_config(Path(RECIPES[0]).parent / f"{recipe}.yaml")
    v = config.data.spm.vocab_size
    with torch.device("meta"):
        model = Transformer(config.model, v, v)
    assert abs(count_parameters(model) / 1e6 - millions) / millions <= 0.03


@pytest.mark.parametrize("recipe, src, tgt", [("multi30k-en-de", "en", "de"), ("multi30k-de-en", "de", "en")])
def test_multi30k_recipes_read_the_hub_dataset_by_default(recipe, src, tgt):
    config = load_config(Path(RECIPES[0]).parent / f"{recipe}.yaml")
    for split, hub_split in (("train", "train"), ("valid", "validation"), ("test", "test")):
        source = getattr(config.data, split)
        assert (source.kind, source.name, source.split) == ("hf", "bentrevett/multi30k", hub_split)
        assert (source.src_field, source.tgt_field) == (src, tgt)
    assert config.eval.lc_tok_ref is None  # the official tokenized references are the user's to give


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipes_read_nothing_outside_the_repository(recipe):
    config = load_config(recipe)
    paths = [config.eval.lc_tok_ref] + [getattr(getattr(holder, s), k, None)
                                        for holder in (config.data, *config.data.pairs)
                                        for s in ("train", "valid", "test") if getattr(holder, s)
                                        for k in ("src", "tgt", "path")]
    paths += [p.lc_tok_ref for p in config.data.pairs] + [config.data.spm.vocab_from, config.train.init_from]
    paths += list(config.distill.teacher)
    assert not [p for p in paths if p and (Path(p).is_absolute() or ".." in Path(p).parts)]


def test_the_multilingual_recipes_list_their_directions_and_the_fine_tuning_stage_continues_the_bidirectional_one():
    folder = Path(RECIPES[0]).parent
    config = load_config(folder / "multi30k-multilingual.yaml")
    assert [(p.src_lang, p.tgt_lang) for p in config.data.pairs] == [("en", "de"), ("en", "fr"), ("en", "cs"),
                                                                      ("de", "en")]
    both = load_config(folder / "multi30k-bidirectional.yaml")
    assert [(p.src_lang, p.tgt_lang) for p in both.data.pairs] == [("en", "de"), ("de", "en")]
    for stage1 in (config, both):
        assert stage1.train.best_pair == "en-de" and stage1.data.tag_side == "target"
    stage2 = load_config(folder / "multi30k-multilingual-en-de.yaml")
    assert [(p.src_lang, p.tgt_lang) for p in stage2.data.pairs] == [("en", "de")]  # the <2de> tag stays
    assert stage2.data.spm.vocab_from == stage2.train.init_from == "work/multi30k-bidirectional/run"
    assert both.train.max_minutes + stage2.train.max_minutes == 60


def test_the_distillation_recipe_distils_the_single_pair_recipes_model_into_a_shallower_student():
    folder = Path(RECIPES[0]).parent
    student, teacher = load_config(folder / "multi30k-en-de-distill.yaml"), load_config(folder / "multi30k-en-de.yaml")
    assert student.distill.teacher == ("work/multi30k-en-de/run",)  # where `mtkit run` leaves the teacher
    assert student.data.train == teacher.data.train and student.data.test == teacher.data.test
    # the teacher translates as it decodes (its own decode section); the student decodes with the teacher's beam
    # over the vocabulary shortlist its run builds after training
    assert student.decode.beam == teacher.decode.beam and not teacher.decode.shortlist
    assert student.decode.shortlist and student.shortlist.build
    assert (student.decode.max_len_a, student.decode.max_len_b) == (teacher.decode.max_len_a, teacher.decode.max_len_b)
    assert student.model.decoder_layers < teacher.model.decoder_layers <= student.model.encoder_layers
    assert student.train.max_minutes == teacher.train.max_minutes and 0 < student.distill.filter_share < 0.2


def test_the_fine_tuning_example_lowers_the_recipes_learning_rate():
    """docs/fine-tuning.md's command fine-tunes at a tenth of its recipe's peak rate or less: the recipe's own
    rate, meant for random weights, cost the Multi30k model 9.5 BLEU in 200 updates (the page's table)."""
    import re
    import shlex

    page = (Path(RECIPES[0]).parents[1] / "docs" / "fine-tuning.md").read_text()
    command = re.search(r"^mtkit train .*--init-from.*(?:\n +.*)*", page, re.M).group(0).replace("\\\n", " ")
    words = shlex.split(command)
    sets = dict(words[i + 1].split("=", 1) for i, w in enumerate(words) if w == "--set")
    recipe = load_config(Path(RECIPES[0]).parents[1] / words[2])
    assert float(sets.get("train.lr", recipe.train.lr)) <= recipe.train.lr / 10

"""Lexically constrained beam search (issue #24): invariants on tiny random models.

The search level: no constraints is exactly beam search; include phrases appear as contiguous
ids in every returned hypothesis, exclude phrases never; n-best lists stay distinct and ordered;
scores are still the model's length-normalized log-probabilities. The pipeline level (a real
SentencePiece vocabulary): the phrases appear in the output text, sentences without constraints
translate as without any, and a phrase that cannot fit is reported on its line.
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import incremental_logprob, random_search_model, random_sources

from mtkit.config import EOS_ID, PAD_ID, DecodeConfig
from mtkit.data.synthetic import english
from mtkit.decoding.constrained import constrained_beam_search
from mtkit.decoding.options import SearchOptions
from mtkit.decoding.penalties import length_penalty
from mtkit.decoding.search import beam_search
from mtkit.engines.constraints import Constraints
from mtkit.engines.torch_engine import TorchEngine
from mtkit.model import Transformer

V = 40


@pytest.fixture(scope="module")
def model() -> Transformer:
    return random_search_model(V)


@pytest.fixture(scope="module")
def src() -> torch.Tensor:
    return random_sources(V)


def contains(tokens: list[int], phrase: list[int]) -> bool:
    n = len(phrase)
    return any(tokens[i : i + n] == phrase for i in range(len(tokens) - n + 1))


def random_phrases(seed: int, B: int, most: int) -> list[list[list[int]]]:
    rng = random.Random(seed)
    return [[[rng.randrange(4, V) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(0, most))]
            for _ in range(B)]


@pytest.mark.parametrize("beam,nbest", [(1, 1), (2, 2), (4, 1), (5, 3)])
def test_without_constraints_it_is_beam_search(model, src, beam, nbest):
    none = [[] for _ in range(src.size(0))]
    plain = beam_search(model, src, SearchOptions(beam=beam, nbest=nbest, max_len_a=1.0, max_len_b=6))
    found = constrained_beam_search(model, src, none, none,
                                    SearchOptions(beam=beam, nbest=nbest, max_len_a=1.0, max_len_b=6))
    assert [[(h.tokens, h.score) for h in s] for s in found] == [[(h.tokens, h.score) for h in s] for s in plain]


def test_constraints_are_a_strategy_of_the_one_beam_loop(model, src):
    """Dynamic Beam Allocation is a BeamStrategy run by search's beam_loop (no second loop to drift), and
    the plain strategy in that loop is beam_search."""
    import inspect

    from mtkit.decoding import constrained, search

    assert issubclass(constrained.DynamicBeamAllocation, search.BeamStrategy)
    assert "while " not in inspect.getsource(constrained)
    options = SearchOptions(beam=3, nbest=2, max_len_b=5)
    looped = search.beam_loop(model, src, options, search.BeamStrategy())
    assert [[(h.tokens, h.score) for h in s] for s in looped] == [
        [(h.tokens, h.score) for h in s] for s in beam_search(model, src, options)]


@pytest.mark.parametrize("beam", [1, 3, 5])
def test_the_best_holds_every_include_phrase_and_none_holds_an_exclude_phrase(model, src, beam):
    include = random_phrases(seed=beam, B=src.size(0), most=2)
    exclude = [[[t] for t in range(4, 12)] + [[20, 21]] for _ in range(src.size(0))]
    include = [[p for p in s if not any(t < 12 for t in p) and p != [20, 21]] for s in include]
    found = constrained_beam_search(model, src, include, exclude,
                                    SearchOptions(beam=beam, nbest=beam, max_len_a=1.0, max_len_b=8))
    assert any(include)
    for i, (sentence, phrases, banned) in enumerate(zip(found, include, exclude)):
        holds = [all(contains(h.tokens, p) for p in phrases) for h in sentence]
        assert holds[0], (sentence[0].tokens, phrases)
        assert holds == sorted(holds, reverse=True)  # those that lack one (cut at the maximum length) come last
        for h, ok in zip(sentence, holds):
            assert not any(contains(h.tokens, p) for p in banned), h.tokens
            if not ok:
                assert len(h.tokens) == int((src[i] != PAD_ID).sum()) + 8  # only at the maximum length


def test_nbest_distinct_ordered_and_scored_as_the_model_scores(model, src):
    include = [[[9, 10], [30]] for _ in range(src.size(0))]
    exclude = [[[11]] for _ in range(src.size(0))]
    found = constrained_beam_search(model, src, include, exclude,
                                    SearchOptions(beam=5, nbest=5, max_len_a=1.0, max_len_b=8))
    for i, sentence in enumerate(found):
        assert len({tuple(h.tokens) for h in sentence}) == len(sentence) == 5
        holds = [contains(h.tokens, [9, 10]) and contains(h.tokens, [30]) for h in sentence]
        assert holds[0] and holds == sorted(holds, reverse=True)
        for group in (True, False):
            scores = [h.score for h, ok in zip(sentence, holds) if ok == group]
            assert scores == sorted(scores, reverse=True)
        src_ids = [t for t in src[i].tolist() if t not in (PAD_ID, EOS_ID)]
        for h in sentence:  # the banned piece changes no probability: these are the model's own
            assert h.logprob == pytest.approx(incremental_logprob(model, src_ids, h.tokens), abs=1e-4)
            assert h.score == pytest.approx(h.logprob / length_penalty(len(h.tokens) + 1, 0.6))


def test_a_phrase_longer_than_the_limit_is_left_out_only_at_the_maximum_length(model, src):
    include = [[[5, 6, 7, 8, 9]] for _ in range(src.size(0))]
    found = constrained_beam_search(model, src, include, [[] for _ in include],
                                    SearchOptions(beam=3, max_len_a=0.0, max_len_b=3))
    for sentence in found:
        assert len(sentence[0].tokens) == 3  # EOS came only when forced, at the maximum length
        assert not contains(sentence[0].tokens, [5, 6, 7, 8, 9])


# ----------------------------------------------------------------------------------- the pipeline


LINES = [english(n) + (" and " + english(n // 3) if n % 2 else "") for n in (5, 17, 342, 999, 40, 1, 77, 610)]


def translate(loaded, lines, wanted=None, **decode):
    decode = DecodeConfig(**{"beam": 4, "max_len_b": 12, **decode})
    translator = TorchEngine(loaded, decode)
    source = None if wanted is None else (lambda i, line: wanted[i])
    return list(translator.translate(lines, constraints=source))


@pytest.mark.parametrize("beam", [1, 4])
def test_phrases_appear_in_the_text_and_other_lines_are_untouched(loaded, beam):
    plain = translate(loaded, LINES, beam=beam)
    first = loaded.vocab.tgt_pieces(plain[2].best.ids[:1])  # a piece plain search chose
    banned = (first[0].lstrip("▁") if first else "") or "und"
    wanted = [Constraints(include=("hundert", "sieben und")), None, Constraints(exclude=(banned,)),
              None, Constraints(include=("dreißig",), exclude=("und",)), None, None, Constraints(include=("elf",))]
    found = translate(loaded, LINES, wanted, beam=beam)
    for t, p, c in zip(found, plain, wanted):
        if c is None:  # as without constraints (the batch invariance of beam search)
            assert t.best.ids == p.best.ids and t.best.score == pytest.approx(p.best.score, abs=1e-5)
            continue
        assert all(phrase in t.best.text for phrase in c.include), (t.best.text, c.include)
        for phrase in c.exclude:
            assert not contains(t.best.ids, loaded.vocab.encode_tgt(phrase)), (t.best.pieces, phrase)
        assert t.unmet == []


def test_a_constraint_that_cannot_fit_is_reported_on_its_line(loaded, caplog):
    caplog.set_level("INFO", logger="mtkit")  # the engine's warnings: the mtkit logger's
    wanted = [None, Constraints(include=("dreihundertzweiundvierzig siebenhundertneunundneunzig",))]
    found = translate(loaded, LINES[:2], wanted, max_len_a=0.0, max_len_b=2)
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("mtkit")]
    assert found[1].unmet and not found[0].unmet
    assert len(messages) == 1 and messages[0].startswith("warning: line 2: the translation lacks")
    assert "maximum output length of 2" in messages[0]


def test_sampling_takes_no_constraints(loaded):
    from mtkit.errors import MtkitError

    with pytest.raises(MtkitError, match="need beam search"):
        translate(loaded, LINES[:1], [Constraints(include=("elf",))], sampling=True, nbest=1)


def test_length_penalty_is_unchanged(model, src):
    include = [[[7]] for _ in range(src.size(0))]
    options = SearchOptions(beam=4, nbest=4, alpha=1.0, length_penalty="power", max_len_b=6)
    for sentence in constrained_beam_search(model, src, include, [[] for _ in include], options):
        for h in sentence:
            assert h.score == pytest.approx(h.logprob / length_penalty(len(h.tokens) + 1, 1.0, "power"))

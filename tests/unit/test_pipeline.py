"""The line pipeline (mtkit.text.pipeline): a line's sentences translated one by one and joined, the integrity
guard forcing lost numbers back in, on tiny untrained models with a real SentencePiece vocabulary of number words
and digits."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from conftest import tiny_transformer

from mtkit.api import from_model
from mtkit.config import DecodeConfig, SpmConfig
from mtkit.data.synthetic import english, german
from mtkit.data.vocab import Vocab, train_model
from mtkit.engines.constraints import Constraints, constraint_source
from mtkit.engines.torch_engine import TorchEngine
from mtkit.text.glossary import Glossary
from mtkit.text.guard import missing, protected_tokens
from mtkit.text.pipeline import GuardCounts, sentence_reports, translate_lines

TWO = "one hundred five.  Twenty two hundred seven."  # two sentences, two spaces between them


@pytest.fixture(scope="module")
def vocab():
    """English and German number words, as sentences, and numbers written in digits (with separators)."""
    sentences = [f"{english(n).capitalize()}." for n in range(0, 1000, 3)]
    sentences += [f"{german(n)} {n} {n * 7 % 1000},{n % 10}{n % 7} {n}:{n % 60:02d}." for n in range(0, 1000, 3)]
    return Vocab.from_bytes(train_model(sentences, SpmConfig(vocab_size=160)))


@pytest.fixture(scope="module")
def engine(vocab):
    model = tiny_transformer(vocab.src_size, vocab.tgt_size, sharpen=3.0).eval()
    decode = DecodeConfig(beam=3, max_len_a=1.0, max_len_b=8, split="sentences", guard=False)
    return from_model(model, vocab, decode).engine


def _alone(engine, lines, **changes):
    """The engine's own translations (no splitting, no guard)."""
    options = dataclasses.replace(engine.decode, split="none", guard=False, **changes)
    return list(engine.translate(lines, options=options))


def test_a_line_of_sentences_is_its_sentences_translated_alone_and_joined(engine):
    [t] = translate_lines(engine, [TWO])
    first, second = _alone(engine, ["one hundred five.", "Twenty two hundred seven."])
    assert [p.source for p in t.parts] == ["one hundred five.", "Twenty two hundred seven."]
    assert t.best.text == f"{first.best.text.strip()}  {second.best.text.strip()}"  # the line's own whitespace
    assert t.best.ids == first.best.ids + second.best.ids
    assert t.best.pieces == first.best.pieces + second.best.pieces
    assert t.best.logprob == pytest.approx(first.best.logprob + second.best.logprob)
    assert t.best.score == pytest.approx(first.best.score + second.best.score)
    assert t.best.mean_logprob == pytest.approx(t.best.logprob / (len(t.best.ids) + 2))  # each sentence's EOS
    assert t.index == 0 and t.source == TWO


def test_splitting_none_is_the_engine_unchanged(engine):
    lines = [TWO, "three.", "", "  four hundred one. five.  "]
    options = dataclasses.replace(engine.decode, split="none")
    got = list(translate_lines(engine, lines, options=options))
    want = _alone(engine, lines)
    assert [(t.source, [c.ids for c in t.candidates], t.parts) for t in got] == \
        [(t.source, [c.ids for c in t.candidates], []) for t in want]


def test_a_line_of_one_sentence_goes_to_the_engine_as_given(engine):
    lines = ["  one hundred five  ", "seven.", "Twenty two"]
    got = list(translate_lines(engine, lines))
    want = _alone(engine, lines)
    for g, w in zip(got, want, strict=True):
        assert (g.source, g.src_ids, [(c.ids, c.score) for c in g.candidates], g.parts) == \
            (w.source, w.src_ids, [(c.ids, c.score) for c in w.candidates], [])


def test_alignments_index_the_whole_line_and_the_whole_translation(engine):
    options = dataclasses.replace(engine.decode, alignments="hard")
    [t] = translate_lines(engine, [TWO], options=options)
    first, second = _alone(engine, ["one hundred five.", "Twenty two hundred seven."], alignments="hard")
    shift_src, shift_tgt = len("one hundred five.".split()), len(first.best.text.split())
    assert t.best.alignment == first.best.alignment + [(s + shift_src, w + shift_tgt)
                                                       for s, w in second.best.alignment]
    words_src, words_tgt = len(TWO.split()), len(t.best.text.split())
    assert all(0 <= s < words_src and 0 <= w < words_tgt for s, w in t.best.alignment)


def test_nbest_hypothesis_k_joins_each_sentence_s_kth(engine):
    options = dataclasses.replace(engine.decode, nbest=3)
    [t] = translate_lines(engine, [TWO], options=options)
    first, second = _alone(engine, ["one hundred five.", "Twenty two hundred seven."], nbest=3)
    assert len(t.candidates) == max(len(first.candidates), len(second.candidates))
    for k, c in enumerate(t.candidates):
        a = first.candidates[min(k, len(first.candidates) - 1)]
        b = second.candidates[min(k, len(second.candidates) - 1)]
        assert c.text == f"{a.text.strip()}  {b.text.strip()}"


def test_a_line_with_include_phrases_of_its_own_is_translated_whole(engine):
    own = constraint_source([Constraints(include=("sieben",))], None)
    [t] = translate_lines(engine, [TWO], constraints=own)
    assert t.parts == [] and t.source == TWO
    assert "sieben" in t.best.text


def test_glossary_terms_are_forced_into_the_sentence_that_holds_them(engine):
    glossary = Glossary([("seven", "sieben", "glossary['seven']")])
    [t] = translate_lines(engine, [TWO], constraints=constraint_source(None, glossary))
    assert "sieben" not in t.parts[0].best.text and "sieben" in t.parts[1].best.text


def test_exclude_phrases_hold_for_every_sentence(engine):
    [free] = translate_lines(engine, [TWO])
    banned = free.parts[0].best.text.split()[0]
    [t] = translate_lines(engine, [TWO], constraints=constraint_source([Constraints(exclude=(banned,))], None))
    assert all(banned not in p.best.text.split() for p in t.parts)


def test_the_guard_forces_lost_numbers_back_and_says_so(engine):
    lines = ["Twenty 305 hundred 7.", "One 48 two.", "Nine."]
    plain = _alone(engine, lines)
    counts = GuardCounts()
    guarded = list(translate_lines(engine, lines, options=dataclasses.replace(engine.decode, guard=True),
                                   counts=counts))
    lost = [[p.text for p in missing(protected_tokens(line, "en", "de"), t.best.text)]
            for line, t in zip(lines, plain, strict=True)]
    assert any(lost), "the untrained model keeps the numbers by itself: the test shows nothing"
    for line, t, was_lost in zip(lines, guarded, lost, strict=True):
        check = t.checks[0]
        # every lost number is either put back (a whole word of the translation) or reported still missing
        assert sorted(check.repaired + check.missing) == sorted(was_lost), (t.best.text, check)
        still = {p.text for p in missing(protected_tokens(line, "en", "de"), t.best.text)}
        assert still == set(check.missing) and not still & set(check.repaired)
        assert all(n in t.best.text for n in check.repaired)
        kept = [n for n in ("305", "7", "48") if n in line and n not in was_lost]
        assert not still & set(kept)  # what the first search had is never lost
    assert counts.sentences == 3 and counts.protected == 3
    assert counts.repaired >= 1 and counts.repaired + counts.missing == sum(map(len, lost))
    reports = [sentence_reports(t)[0] for t in guarded]
    assert [r["source"] for r in reports] == lines
    assert [sorted(r["repaired"] + r["missing"]) for r in reports] == [sorted(n) for n in lost]


def test_the_guard_reports_what_sampling_lost_without_searching_again(engine):
    options = dataclasses.replace(engine.decode, guard=True, sampling=True, beam=1)
    [t] = translate_lines(engine, ["One 48 two."], options=options)
    if "48" in t.best.text:
        pytest.skip("the sample kept the number")
    assert t.checks[0].missing == ("48",) and t.checks[0].repaired == ()


def test_guard_and_splitting_together_check_each_sentence(engine):
    options = dataclasses.replace(engine.decode, guard=True)
    [t] = translate_lines(engine, ["One 48 two. Nine 305 five."], options=options)
    assert len(t.parts) == 2 and len(t.checks) == 2
    assert "48" in t.parts[0].best.text and "305" in t.parts[1].best.text
    assert "48" in t.best.text and "305" in t.best.text


def test_warnings_name_the_input_line_not_the_sentence(engine, logged, capfd):
    long = " ".join(["one hundred five."] * 3 + ["seven " * 80])
    loaded = SimpleNamespace(model=engine.models[0], vocab=engine.vocab)
    saying = TorchEngine([loaded], dataclasses.replace(engine.decode, guard=True))  # (from_model's is quiet)
    list(translate_lines(saying, ["one.", TWO, long]))
    said = capfd.readouterr().err
    assert "line 3:" in said and "truncated" in said and "line 6" not in said


def test_hostile_lines_stay_bounded(engine):
    lines = ["x" * 1_000_000, "{x} " * 10_000, "1,1." * 50_000, "(" * 100_000 + ")" * 100_000]
    got = list(translate_lines(engine, lines, options=dataclasses.replace(engine.decode, guard=True)))
    assert [t.source for t in got] == lines
    assert all(len(c.missing) + len(c.repaired) <= 64 for t in got for c in t.checks)

